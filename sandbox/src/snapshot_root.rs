//! Image roots from a container runtime's snapshot (the containerd shim's rootfs).
//!
//! A runtime such as containerd hands over a root filesystem it has already assembled (an
//! overlay of committed snapshot layers, mounted by the caller). [`SnapshotRoots`] turns such
//! a tree into the same kind of root `--image` boots — one read-only erofs file under the
//! agent's tmpfs overlay — cached by the snapshot's *identity*, a key the caller derives from
//! what makes the tree what it is (for containerd: its committed layers, which never change,
//! plus the content key of anything writable). The tree is read once per identity.
//!
//! Layout under the cache directory (`<cache home>/vm/snapshot-roots` by default: not
//! `vm/snapshots`, which is `vm snapshot`'s store of VM snapshots, a directory each):
//! - `<identity>.erofs`: the image, built into a `.build-*` temp file and renamed into place;
//! - `refs/<identity>/<holder>`: one empty file per VM using it ([`SnapshotRoots::hold`]),
//!   removed when that VM is deleted ([`SnapshotRoots::release`]), so [`SnapshotRoots::prune`]
//!   removes exactly the images nobody holds.
//!
//! Identities and holder names are checked: `[A-Za-z0-9._-]`, 1..=128 characters, not
//! starting with a dot, so neither can name a path outside the cache.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::mounts::cache_home;

/// Why a snapshot root could not be prepared or referenced.
#[derive(Debug, Error)]
pub enum SnapshotRootError {
    #[error("snapshot root: invalid {what} {value:?} (want [A-Za-z0-9._-], 1-128 characters)")]
    BadName { what: &'static str, value: String },
    #[error("snapshot root: {what} {}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("snapshot root: building the erofs image of {}", .tree.display())]
    Build {
        tree: PathBuf,
        #[source]
        source: vm_oci::ErofsError,
    },
    #[error("no cache directory: set XDG_CACHE_HOME or HOME")]
    NoCacheDir,
}

/// The cache of erofs roots made from runtime snapshots (see the module docs).
#[derive(Debug, Clone)]
pub struct SnapshotRoots {
    dir: PathBuf,
}

fn check_name(what: &'static str, value: &str) -> Result<(), SnapshotRootError> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && !value.starts_with('.')
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    match ok {
        true => Ok(()),
        false => Err(SnapshotRootError::BadName {
            what,
            value: value.chars().take(200).collect(),
        }),
    }
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SnapshotRootError {
    let path = path.to_path_buf();
    move |source| SnapshotRootError::Io { what, path, source }
}

impl SnapshotRoots {
    /// A cache in `dir` (created when first needed).
    pub fn new(dir: impl Into<PathBuf>) -> SnapshotRoots {
        SnapshotRoots { dir: dir.into() }
    }

    /// `<cache home>/vm/snapshot-roots`.
    pub fn default_location() -> Result<SnapshotRoots, SnapshotRootError> {
        let home = cache_home().ok_or(SnapshotRootError::NoCacheDir)?;
        Ok(SnapshotRoots::under(&home))
    }

    /// The cache's default place under the cache home `home`: a directory of its own, apart
    /// from the VM snapshots' store ([`crate::SnapshotStore::under`]), so neither lists nor
    /// prunes the other's entries.
    pub fn under(home: &Path) -> SnapshotRoots {
        SnapshotRoots::new(home.join("vm/snapshot-roots"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the image of `identity` lives (whether or not it exists yet).
    pub fn image_path(&self, identity: &str) -> Result<PathBuf, SnapshotRootError> {
        check_name("identity", identity)?;
        Ok(self.dir.join(format!("{identity}.erofs")))
    }

    /// The erofs image of `tree` under `identity`: reused when present, else built from
    /// `tree` (which must then be the snapshot the identity names).
    pub fn erofs_for(&self, identity: &str, tree: &Path) -> Result<PathBuf, SnapshotRootError> {
        let image = self.image_path(identity)?;
        if image.is_file() {
            tracing::debug!(image = %image.display(), "reusing snapshot root");
            return Ok(image);
        }
        fs::create_dir_all(&self.dir).map_err(io_err("creating cache dir", &self.dir))?;
        let tmp = tempfile::Builder::new()
            .prefix(".build-")
            .suffix(".erofs")
            .tempfile_in(&self.dir)
            .map_err(io_err("creating temp image", &self.dir))?;
        vm_oci::build_erofs(tree, tmp.path()).map_err(|source| SnapshotRootError::Build {
            tree: tree.to_path_buf(),
            source,
        })?;
        tmp.persist(&image).map_err(|e| SnapshotRootError::Io {
            what: "saving image",
            path: image.clone(),
            source: e.error,
        })?;
        tracing::info!(tree = %tree.display(), image = %image.display(), "built snapshot root");
        Ok(image)
    }

    fn refs_dir(&self, identity: &str) -> Result<PathBuf, SnapshotRootError> {
        check_name("identity", identity)?;
        Ok(self.dir.join("refs").join(identity))
    }

    /// Record that `holder` (one VM) uses the image of `identity`.
    pub fn hold(&self, identity: &str, holder: &str) -> Result<(), SnapshotRootError> {
        check_name("holder", holder)?;
        let refs = self.refs_dir(identity)?;
        fs::create_dir_all(&refs).map_err(io_err("creating refs dir", &refs))?;
        let path = refs.join(holder);
        fs::write(&path, b"").map_err(io_err("writing reference", &path))
    }

    /// Drop `holder`'s reference (absent is fine: release is idempotent).
    pub fn release(&self, identity: &str, holder: &str) -> Result<(), SnapshotRootError> {
        check_name("holder", holder)?;
        let refs = self.refs_dir(identity)?;
        let path = refs.join(holder);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("removing reference", &path)(e)),
        }
        // The directory goes with its last reference; a concurrent hold recreates it.
        let _ = fs::remove_dir(&refs);
        Ok(())
    }

    /// Who holds the image of `identity`, sorted.
    pub fn holders(&self, identity: &str) -> Result<Vec<String>, SnapshotRootError> {
        let refs = self.refs_dir(identity)?;
        let rd = match fs::read_dir(&refs) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("reading refs dir", &refs)(e)),
        };
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry.map_err(io_err("reading refs dir", &refs))?;
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
        out.sort();
        Ok(out)
    }

    /// Remove every image nobody holds; returns the identities removed.
    pub fn prune(&self) -> Result<Vec<String>, SnapshotRootError> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("reading cache dir", &self.dir)(e)),
        };
        let mut removed = Vec::new();
        for entry in rd {
            let entry = entry.map_err(io_err("reading cache dir", &self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(identity) = name.strip_suffix(".erofs") else {
                continue;
            };
            if check_name("identity", identity).is_err() || !self.holders(identity)?.is_empty() {
                continue;
            }
            let path = entry.path();
            fs::remove_file(&path).map_err(io_err("removing image", &path))?;
            removed.push(identity.to_string());
        }
        removed.sort();
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shim's roots and `vm snapshot`'s store under one cache home: each lists and prunes
    /// its own entries only (they once shared `vm/snapshots`, where a snapshot named
    /// `base.erofs`, a directory, stopped the roots' prune and the roots' `refs` directory was
    /// listed as a broken snapshot).
    #[test]
    fn the_roots_and_the_vm_snapshots_keep_apart() {
        let home = tempfile::tempdir().unwrap();
        let roots = SnapshotRoots::under(home.path());
        let store = crate::SnapshotStore::under(home.path());
        assert_ne!(roots.dir(), store.dir());
        assert!(!roots.dir().starts_with(store.dir()) && !store.dir().starts_with(roots.dir()));
        // A VM snapshot named like a root image, and a root image held by nobody.
        std::fs::create_dir_all(store.path("base.erofs").unwrap()).unwrap();
        fs::create_dir_all(roots.dir()).unwrap();
        fs::write(roots.image_path("old").unwrap(), b"erofs").unwrap();
        roots.hold("kept", "vm1").unwrap();
        fs::write(roots.image_path("kept").unwrap(), b"erofs").unwrap();
        assert_eq!(roots.prune().unwrap(), vec!["old".to_string()]);
        let listed: Vec<String> = store.list().unwrap().into_iter().map(|l| l.name).collect();
        assert_eq!(listed, vec!["base.erofs".to_string()]);
        assert!(store.path("base.erofs").unwrap().is_dir());
    }

    #[test]
    fn names_that_could_leave_the_cache_are_refused() {
        let c = SnapshotRoots::new("/nonexistent-cache");
        for bad in ["", "../x", "a/b", ".hidden", "a b", &"x".repeat(129)] {
            assert!(
                matches!(c.image_path(bad), Err(SnapshotRootError::BadName { .. })),
                "{bad:?}"
            );
            assert!(matches!(
                c.hold("abc", bad),
                Err(SnapshotRootError::BadName { .. })
            ));
        }
        assert_eq!(
            c.image_path("ab-c_1.2").unwrap(),
            Path::new("/nonexistent-cache/ab-c_1.2.erofs")
        );
    }

    #[test]
    fn references_are_counted_and_prune_keeps_held_images() {
        let tmp = tempfile::tempdir().unwrap();
        let c = SnapshotRoots::new(tmp.path());
        fs::write(c.image_path("held").unwrap(), b"x").unwrap();
        fs::write(c.image_path("free").unwrap(), b"x").unwrap();
        c.hold("held", "ns-a").unwrap();
        c.hold("held", "ns-b").unwrap();
        assert_eq!(c.holders("held").unwrap(), ["ns-a", "ns-b"]);
        assert_eq!(c.prune().unwrap(), ["free"]);
        assert!(c.image_path("held").unwrap().is_file());
        c.release("held", "ns-a").unwrap();
        c.release("held", "ns-a").unwrap();
        c.release("held", "ns-b").unwrap();
        assert!(c.holders("held").unwrap().is_empty());
        assert!(!tmp.path().join("refs/held").exists());
        assert_eq!(c.prune().unwrap(), ["held"]);
    }
}
