//! Host-side checks for paths given to file operations and for working directories,
//! applied before a request reaches the agent (which applies its own, stricter
//! `openat2(RESOLVE_BENEATH)` confinement to file operations).

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
    #[error("path {0:?}: a guest path must be absolute")]
    NotAbsolute(String),
    #[error("working directory {path:?}: must be under the guest root {root} (or relative to it)")]
    OutsideRoot { path: String, root: String },
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

/// Check an absolute guest path (a file anywhere in the guest, as `vm cp` names it) and
/// return it relative to `/`, normalized as [`relative`] does.
pub fn absolute(path: &str) -> Result<String, PathError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PathError::NotAbsolute(path.to_string()));
    };
    relative(rest.trim_start_matches('/'), false)
}

/// The working directory of a command: `cwd` relative to the guest `root`, or an absolute
/// path that is the root or under it. Returns the absolute guest path.
pub fn workdir(root: &str, cwd: &str) -> Result<String, PathError> {
    let rel = match cwd.strip_prefix('/') {
        None => relative(cwd, true)?,
        Some(_) => {
            let base = root.trim_end_matches('/');
            match cwd.strip_prefix(base) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                    relative(rest.trim_start_matches('/'), true)?
                }
                _ => {
                    return Err(PathError::OutsideRoot {
                        path: cwd.to_string(),
                        root: root.to_string(),
                    });
                }
            }
        }
    };
    Ok(join(root, &rel))
}

/// A file path for the guest root's file operations: relative to `root`, or an absolute path
/// under it (`/work/a` for the root `/work`); returns it relative to the root. An absolute
/// path outside the root is refused, as `..` is.
pub fn in_root(root: &str, path: &str) -> Result<String, PathError> {
    if !path.starts_with('/') {
        return relative(path, false);
    }
    let abs = workdir(root, path)?;
    let rel = abs[root.trim_end_matches('/').len()..].trim_start_matches('/');
    relative(rel, false)
}

/// `root` joined with a normalized relative path (`""` = the root itself).
pub(crate) fn join(root: &str, rel: &str) -> String {
    match (root, rel) {
        (_, "") => root.to_string(),
        ("/", r) => format!("/{r}"),
        (root, r) => format!("{}/{r}", root.trim_end_matches('/')),
    }
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

    #[test]
    fn absolute_guest_paths() {
        assert_eq!(absolute("/tmp//x").unwrap(), "tmp/x");
        assert!(matches!(absolute("tmp/x"), Err(PathError::NotAbsolute(_))));
        assert!(matches!(absolute("/tmp/../etc"), Err(PathError::DotDot(_))));
        assert!(matches!(absolute("/"), Err(PathError::Empty(_))));
    }

    #[test]
    fn workdirs_are_under_the_root() {
        assert_eq!(workdir("/work", "sub/dir").unwrap(), "/work/sub/dir");
        assert_eq!(workdir("/work", "/work").unwrap(), "/work");
        assert_eq!(workdir("/work", "").unwrap(), "/work");
        assert_eq!(workdir("/work", "/work/a").unwrap(), "/work/a");
        assert_eq!(workdir("/", "/tmp").unwrap(), "/tmp");
        for bad in ["/workshop", "/tmp", "../x", "/work/../etc"] {
            assert!(workdir("/work", bad).is_err(), "{bad}");
        }
        let e = workdir("/work", "/tmp").unwrap_err();
        assert!(e.to_string().contains("under the guest root /work"), "{e}");
    }

    #[test]
    fn in_root_takes_relative_or_absolute_under_the_root() {
        assert_eq!(in_root("/work", "a/b").unwrap(), "a/b");
        assert_eq!(in_root("/work", "/work/a/b").unwrap(), "a/b");
        assert_eq!(in_root("/", "/etc/x").unwrap(), "etc/x");
        for bad in [
            "../x",
            "/etc/passwd",
            "/work",
            "/workx/a",
            "/work/../etc/x",
            "",
        ] {
            assert!(in_root("/work", bad).is_err(), "{bad}");
        }
    }
}
