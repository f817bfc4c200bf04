//! Host-side checks for paths given to file operations and for working directories,
//! applied before a request reaches the agent (which applies its own, stricter
//! `openat2(RESOLVE_BENEATH)` confinement to file operations).

use thiserror::Error;

/// Longest path accepted (the agent's own limit).
pub const MAX_PATH_BYTES: usize = vm_agent_protocol::protocol::MAX_PATH_BYTES;

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
    #[error("path {0:?}: outside the root {1:?} (file operations stay under it)")]
    OutsideRoot(String, String),
}

impl PathError {
    /// The same refusal, naming `path` (the path as the caller wrote it).
    fn naming(self, path: &str) -> PathError {
        let p = path.to_string();
        match self {
            PathError::Absolute(_) => PathError::Absolute(p),
            PathError::DotDot(_) => PathError::DotDot(p),
            PathError::Nul(_) => PathError::Nul(p),
            PathError::TooLong(_) => PathError::TooLong(p),
            PathError::Empty(_) => PathError::Empty(p),
            PathError::NotAbsolute(_) => PathError::NotAbsolute(p),
            PathError::OutsideRoot(_, root) => PathError::OutsideRoot(p, root),
        }
    }
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
    relative(rest.trim_start_matches('/'), false).map_err(|e| e.naming(path))
}

/// The working directory of a command: `cwd` relative to the guest `root`, or any absolute
/// guest path (as docker's `-w`). Returns the absolute guest path, normalized (no `.`, no
/// repeated `/`); `..`, NUL and over-long paths are refused. A working directory confines
/// nothing: the file operations' own rule ([`relative`], and the agent's `RESOLVE_BENEATH`)
/// is what keeps them under the root.
pub fn workdir(root: &str, cwd: &str) -> Result<String, PathError> {
    match cwd.strip_prefix('/') {
        None => Ok(join(root, &relative(cwd, true)?)),
        Some(rest) => relative(rest.trim_start_matches('/'), true)
            .map(|rel| join("/", &rel))
            .map_err(|e| e.naming(cwd)),
    }
}

/// A file path for the guest root's file operations: relative to `root`, or an absolute path
/// under it (`/work/a` for the root `/work`); returns it relative to the root. An absolute
/// path outside the root is refused, as `..` is.
pub fn in_root(root: &str, path: &str) -> Result<String, PathError> {
    if !path.starts_with('/') {
        return relative(path, false);
    }
    // Normalized first (`..`, NUL and length refused), then it must lie strictly under the
    // root: `/work/a` is `a`; `/work`, `/workx/a` and `/etc/passwd` are not file paths in it.
    let abs = workdir("/", path)?;
    let prefix = format!("{}/", root.trim_end_matches('/'));
    match abs.strip_prefix(&prefix) {
        Some(rel) => relative(rel, false).map_err(|e| e.naming(path)),
        None => Err(PathError::OutsideRoot(path.to_string(), root.to_string())),
    }
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
    fn workdirs_are_relative_to_the_root_or_any_absolute_guest_path() {
        assert_eq!(workdir("/work", "sub/dir").unwrap(), "/work/sub/dir");
        assert_eq!(workdir("/work", "./sub//dir/").unwrap(), "/work/sub/dir");
        assert_eq!(workdir("/work", "/work").unwrap(), "/work");
        assert_eq!(workdir("/work", "").unwrap(), "/work");
        assert_eq!(workdir("/work", "/work/a").unwrap(), "/work/a");
        assert_eq!(workdir("/", "/tmp").unwrap(), "/tmp");
        // Outside the root, as docker accepts any absolute -w.
        assert_eq!(workdir("/work", "/tmp").unwrap(), "/tmp");
        assert_eq!(workdir("/work", "/workshop/").unwrap(), "/workshop");
        assert_eq!(workdir("/work", "//etc//x").unwrap(), "/etc/x");
        assert_eq!(workdir("/work", "/").unwrap(), "/");
        type Is = fn(&PathError) -> bool;
        let bad: [(&str, Is); 4] = [
            ("../x", |e| matches!(e, PathError::DotDot(_))),
            ("/work/../etc", |e| matches!(e, PathError::DotDot(_))),
            ("/tmp/a\0", |e| matches!(e, PathError::Nul(_))),
            ("a/..", |e| matches!(e, PathError::DotDot(_))),
        ];
        for (cwd, is) in bad {
            let e = workdir("/work", cwd).expect_err(cwd);
            assert!(is(&e), "{cwd}: {e}");
            assert!(e.to_string().contains(&format!("{cwd:?}")), "{e}");
        }
        let long = format!("/{}", "a/".repeat(MAX_PATH_BYTES));
        assert!(matches!(
            workdir("/work", &long),
            Err(PathError::TooLong(_))
        ));
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
