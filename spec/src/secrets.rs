//! Credential locations under `$HOME` that are never mounted into a guest by accident.
//!
//! [`CREDENTIAL_PATHS`] is the one list: each entry is a path relative to the home directory
//! and what it holds. A mount whose resolved host path is one of them, lies inside one, or
//! contains an existing one is refused with that reason, unless the mount's host path is named
//! in `Guarantees.mount_secret_allow` (`vm … --allow-mount-secret PATH`), so the exception is
//! visible in the spec, as with secret-looking environment variables.

use std::path::{Path, PathBuf};

/// Credential directories and files under `$HOME`, and what each holds.
pub const CREDENTIAL_PATHS: &[(&str, &str)] = &[
    (".ssh", "SSH keys"),
    (".gnupg", "GnuPG keys"),
    (".aws", "AWS credentials"),
    (".azure", "Azure credentials"),
    (".config/gcloud", "Google Cloud credentials"),
    (".kube", "Kubernetes credentials"),
    (".docker", "container registry credentials"),
    (".config/gh", "GitHub CLI tokens"),
    (".password-store", "pass password store"),
    (".netrc", "network login passwords"),
    (".git-credentials", "git credentials"),
    (".pgpass", "PostgreSQL passwords"),
    (".npmrc", "npm registry tokens"),
    (".pypirc", "Python package index tokens"),
    (".cargo/credentials.toml", "Cargo registry tokens"),
];

/// A credential location a mount would expose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialHit {
    /// The credential path (under the resolved home).
    pub path: PathBuf,
    /// What it holds.
    pub what: &'static str,
}

/// The credential location `resolved` (a canonical host path) equals, lies inside, or
/// contains (only existing ones count for containment); `None` when it exposes none.
pub fn credential_exposed(resolved: &Path, home: &Path) -> Option<CredentialHit> {
    let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
    CREDENTIAL_PATHS.iter().find_map(|(rel, what)| {
        let cred = home.join(rel);
        let cred = cred.canonicalize().unwrap_or(cred);
        let inside = resolved.starts_with(&cred);
        let contains = cred.starts_with(resolved) && cred.exists();
        (inside || contains).then_some(CredentialHit { path: cred, what })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_equal_and_containing_paths_are_found() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path().canonicalize().unwrap();
        std::fs::create_dir_all(h.join(".ssh/keys")).unwrap();
        std::fs::create_dir_all(h.join(".config/gcloud")).unwrap();
        std::fs::create_dir_all(h.join("src/project")).unwrap();
        let hit = credential_exposed(&h.join(".ssh"), &h).unwrap();
        assert_eq!((hit.path, hit.what), (h.join(".ssh"), "SSH keys"));
        assert!(credential_exposed(&h.join(".ssh/keys"), &h).is_some());
        let hit = credential_exposed(&h.join(".config"), &h).unwrap();
        assert_eq!(hit.what, "Google Cloud credentials");
        assert_eq!(credential_exposed(&h.join("src/project"), &h), None);
        assert_eq!(credential_exposed(&h.join("src"), &h), None);
        // .aws does not exist: its parent is not refused for it, the path itself is.
        assert!(credential_exposed(&h.join(".aws/config"), &h).is_some());
    }
}
