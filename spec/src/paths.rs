//! Path rules for mounts, the guest root and image files.
//!
//! Guest paths end up on the kernel command line (`vm.disk=<id>:<path>:<fs>` words) and
//! host paths in VMM device specs (QEMU's comma-separated `-drive`), so the characters
//! that delimit those (comma, colon, whitespace, quotes, control characters) are refused
//! where the path enters rather than escaped later.
//!
//! Protected guest paths (decided here, enforced for every mount and for the root):
//! - system paths, refused when a path equals, contains or lies inside them: `/proc`,
//!   `/sys`, `/dev` (kernel interfaces the agent mounts), `/bin`, `/sbin`, `/usr`, `/lib`,
//!   `/lib64`, `/etc` (the image's programs and config) and `/init` (the agent itself);
//! - scratch paths, refused when a mount equals or contains them (a mount *inside* is
//!   fine): `/tmp`, `/run`, and the spec's own root;
//! - `/` itself, which contains everything.
//!
//! Host paths are resolved (symlinks, `..`) first, then refused when they are `/`, the
//! user's home, or an ancestor of the home (mount-safety rules that no flag overrides), and
//! when they expose a credential location under the home ([`crate::secrets`], overridable
//! per path with `Guarantees.mount_secret_allow`).

use std::path::{Path, PathBuf};

use crate::error::SpecError;

/// Guest paths nothing may shadow, contain, or be mounted inside.
pub const SYSTEM_GUEST_PATHS: &[&str] = &[
    "/proc", "/sys", "/dev", "/bin", "/sbin", "/usr", "/lib", "/lib64", "/etc", "/init",
];
/// Longest guest path: each mount travels on the kernel command line (at most 2048 bytes
/// on x86) as a `vm.disk=<id>:<path>:<fs>` word.
pub const MAX_GUEST_PATH: usize = 128;
/// Guest paths a mount may sit inside but must not equal or contain.
pub const SCRATCH_GUEST_PATHS: &[&str] = &["/tmp", "/run"];

fn forbidden_guest_char(c: char) -> bool {
    matches!(c, ',' | ':' | '\\' | '"' | '\'' | '=') || c.is_whitespace() || c.is_control()
}

fn forbidden_host_char(c: char) -> bool {
    matches!(c, ',' | ':') || c.is_control()
}

/// `a` equals `b` or is an ancestor of it (both normalized absolute guest paths).
pub fn is_ancestor_or_same(a: &str, b: &str) -> bool {
    a == "/" || a == b || (b.starts_with(a) && b.as_bytes().get(a.len()) == Some(&b'/'))
}

/// Check an absolute guest path and return it normalized (no repeated or trailing `/`).
pub fn normalize_guest_path(field: &str, path: &str) -> Result<String, SpecError> {
    if !path.starts_with('/') {
        return Err(SpecError::RelativePath {
            field: field.into(),
            path: path.into(),
        });
    }
    if path.len() > MAX_GUEST_PATH {
        return Err(SpecError::PathTooLong {
            field: field.into(),
            path: path.into(),
            max: MAX_GUEST_PATH,
        });
    }
    if let Some(ch) = path.chars().find(|c| forbidden_guest_char(*c)) {
        return Err(SpecError::ForbiddenChar {
            field: field.into(),
            path: path.into(),
            ch,
        });
    }
    let mut parts = Vec::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if part == "." || part == ".." {
            return Err(SpecError::GuestPathNotNormal {
                field: field.into(),
                path: path.into(),
            });
        }
        parts.push(part);
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Refuse a normalized guest path that touches a system path (equal, ancestor or inside).
pub fn refuse_system_guest_path(field: &str, path: &str) -> Result<(), SpecError> {
    if path == "/" {
        return Err(protected(field, path, "/"));
    }
    for sys in SYSTEM_GUEST_PATHS {
        if is_ancestor_or_same(path, sys) || is_ancestor_or_same(sys, path) {
            return Err(protected(field, path, sys));
        }
    }
    Ok(())
}

/// Refuse a normalized guest mount path that equals or contains `protected_path`.
pub fn refuse_shadowing(field: &str, path: &str, protected_path: &str) -> Result<(), SpecError> {
    if is_ancestor_or_same(path, protected_path) {
        return Err(protected(field, path, protected_path));
    }
    Ok(())
}

fn protected(field: &str, path: &str, protected: &str) -> SpecError {
    SpecError::ProtectedGuestPath {
        field: field.into(),
        path: path.into(),
        protected: protected.into(),
    }
}

/// A host path must be UTF-8, absolute and free of delimiter characters.
pub fn check_host_path_text<'a>(field: &str, path: &'a Path) -> Result<&'a str, SpecError> {
    let Some(text) = path.to_str() else {
        return Err(SpecError::NonUtf8Path {
            field: field.into(),
            path: path.to_string_lossy().into_owned(),
        });
    };
    if let Some(ch) = text.chars().find(|c| forbidden_host_char(*c)) {
        return Err(SpecError::ForbiddenChar {
            field: field.into(),
            path: text.into(),
            ch,
        });
    }
    if !path.is_absolute() {
        return Err(SpecError::RelativePath {
            field: field.into(),
            path: text.into(),
        });
    }
    Ok(text)
}

/// Resolve a host path to mount (symlinks and `..` first) and apply the non-overridable
/// refusals: never `/`, never `home`, never an ancestor of `home`. Returns the resolved path.
pub fn resolve_mount_source(
    field: &str,
    path: &Path,
    home: Option<&Path>,
) -> Result<PathBuf, SpecError> {
    check_host_path_text(field, path)?;
    let resolved = path
        .canonicalize()
        .map_err(|source| SpecError::Unresolvable {
            field: field.into(),
            path: path.to_path_buf(),
            source,
        })?;
    // A symlink may point at a name the raw text check never saw.
    check_host_path_text(field, &resolved)?;
    let refuse = |reason: String| SpecError::UnsafeHostPath {
        field: field.into(),
        path: resolved.clone(),
        reason,
    };
    if resolved == Path::new("/") {
        return Err(refuse("it is the filesystem root".into()));
    }
    if let Some(home) = home {
        let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
        if resolved == home {
            return Err(refuse("it is the home directory".into()));
        }
        if home.starts_with(&resolved) {
            return Err(refuse(format!(
                "it contains the home directory {}",
                home.display()
            )));
        }
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_normalization() {
        assert_eq!(normalize_guest_path("f", "/a//b/").unwrap(), "/a/b");
        assert_eq!(normalize_guest_path("f", "/").unwrap(), "/");
        assert!(normalize_guest_path("f", "/a/../proc").is_err());
        assert!(normalize_guest_path("f", "a/b").is_err());
        assert!(normalize_guest_path("f", "/a b").is_err());
    }

    #[test]
    fn ancestry() {
        assert!(is_ancestor_or_same("/", "/x"));
        assert!(is_ancestor_or_same("/usr", "/usr/bin"));
        assert!(is_ancestor_or_same("/usr", "/usr"));
        assert!(!is_ancestor_or_same("/us", "/usr"));
        assert!(!is_ancestor_or_same("/usr/bin", "/usr"));
    }

    #[test]
    fn system_paths() {
        assert!(refuse_system_guest_path("f", "/proc/x").is_err());
        assert!(refuse_system_guest_path("f", "/usr").is_err());
        assert!(refuse_system_guest_path("f", "/").is_err());
        assert!(refuse_system_guest_path("f", "/data").is_ok());
        assert!(refuse_system_guest_path("f", "/tmp/x").is_ok());
        assert!(refuse_system_guest_path("f", "/devices").is_ok());
    }
}
