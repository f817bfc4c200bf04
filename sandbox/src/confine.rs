//! Host-side checks for paths given to file operations, applied before a request reaches
//! the agent (which applies its own, stricter `openat2(RESOLVE_BENEATH)` confinement).

use thiserror::Error;

/// Longest path accepted (the agent's own limit).
pub const MAX_PATH_BYTES: usize = guest_agent::protocol::MAX_PATH_BYTES;

/// Why a path was refused; each names the path.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PathError {
    #[error("path {0:?}: absolute paths are refused (paths are relative to the root)")]
    Absolute(String),
    #[error("path {0:?}: '..' is refused")]
    DotDot(String),
    #[error("path {0:?}: contains NUL")]
    Nul(String),
    #[error("path {0:?}: longer than {MAX_PATH_BYTES} bytes")]
    TooLong(String),
    #[error("path {0:?}: empty")]
    Empty(String),
}

/// Check a path relative to the sandbox root and return it normalized (`a/b`, no `.`, no
/// repeated `/`). The root itself is `""` and is accepted only when `allow_root` is set
/// (listing), never for reading or writing a file.
pub fn relative(path: &str, allow_root: bool) -> Result<String, PathError> {
    let owned = || path.to_string();
    if path.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong(owned()));
    }
    if path.contains('\0') {
        return Err(PathError::Nul(owned()));
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute(owned()));
    }
    let mut parts = Vec::new();
    for comp in path.split('/') {
        match comp {
            "" | "." => {}
            ".." => return Err(PathError::DotDot(owned())),
            c => parts.push(c),
        }
    }
    if parts.is_empty() && !allow_root {
        return Err(PathError::Empty(owned()));
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let ok = [
            ("a", "a"),
            ("a/b", "a/b"),
            ("./a//b/", "a/b"),
            ("a/./b", "a/b"),
            ("..a", "..a"),
        ];
        for (input, want) in ok {
            assert_eq!(relative(input, false).unwrap(), want, "{input}");
        }
        assert_eq!(relative("", true).unwrap(), "");
        assert_eq!(relative(".", true).unwrap(), "");
        type Is = fn(&PathError) -> bool;
        let bad: [(&str, Is); 7] = [
            ("/etc/passwd", |e| matches!(e, PathError::Absolute(_))),
            ("../x", |e| matches!(e, PathError::DotDot(_))),
            ("a/../../x", |e| matches!(e, PathError::DotDot(_))),
            ("a/..", |e| matches!(e, PathError::DotDot(_))),
            ("a\0b", |e| matches!(e, PathError::Nul(_))),
            ("", |e| matches!(e, PathError::Empty(_))),
            (".", |e| matches!(e, PathError::Empty(_))),
        ];
        for (input, is) in bad {
            let e = relative(input, false).expect_err(input);
            assert!(is(&e), "{input}: {e}");
            assert!(e.to_string().contains(&format!("{input:?}")), "{e}");
        }
        let long = "a/".repeat(MAX_PATH_BYTES);
        assert!(matches!(relative(&long, false), Err(PathError::TooLong(_))));
    }
}
