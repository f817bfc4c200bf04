//! The guest image cache built by `images/build.sh`:
//! `<images dir>/<hash>/{vmlinux,bzImage,initramfs.cpio,config,manifest.json}` plus a
//! `current` symlink to the default `<hash>`.
//!
//! An *image set* is a real directory (not a symlink) whose name is a hex build hash and
//! which holds a `manifest.json` (build.sh writes it last, into a `.tmp.*` directory that is
//! renamed into place, so a set without one is incomplete). [`list`] and [`prune`] are the
//! one implementation of that rule (the CLI's `vm images ls/prune` call them); everything
//! else in the images dir is never listed or removed: the build's caches (`kernels/`,
//! `logs/`, `agent-target/`), in-progress `.tmp.*` builds, the `.lock` file, and the
//! `current` link (removed only by `prune(false)`, which removes every set).
//! The images dir is `$VM_IMAGES_DIR`, else `$XDG_CACHE_HOME/vm/images`, else
//! `$HOME/.cache/vm/images`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;
use vm_drivers::ImagePaths;

/// Why images could not be found or managed.
#[derive(Debug, Error)]
pub enum ImageError {
    #[error("no images directory: set VM_IMAGES_DIR, XDG_CACHE_HOME or HOME")]
    NoDir,
    #[error("guest image {} is missing; run images/build.sh", .0.display())]
    Missing(PathBuf),
    #[error("{what} {}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One built image set in the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageEntry {
    /// The directory name (the build hash).
    pub hash: String,
    pub path: PathBuf,
    /// Total size of its files.
    pub bytes: u64,
    /// `current` points here.
    pub current: bool,
}

/// The images directory (see the module docs).
pub fn images_dir() -> Result<PathBuf, ImageError> {
    vm_drivers::default_images_dir().ok_or(ImageError::NoDir)
}

/// `<images dir>/current/{vmlinux,bzImage,initramfs.cpio}`, each checked to exist.
pub fn default_images() -> Result<ImagePaths, ImageError> {
    images_in(&images_dir()?.join("current"))
}

/// The image files in `dir`, each checked to exist.
pub fn images_in(dir: &Path) -> Result<ImagePaths, ImageError> {
    let paths = ImagePaths::in_dir(dir);
    for p in [&paths.vmlinux, &paths.bz_image, &paths.initramfs] {
        if !p.is_file() {
            return Err(ImageError::Missing(p.clone()));
        }
    }
    Ok(paths)
}

/// The default images as a `vm_spec::Image` (no digests pinned).
pub fn default_spec_image() -> Result<vm_spec::Image, ImageError> {
    let p = default_images()?;
    Ok(vm_spec::Image {
        kernel: p.vmlinux,
        bz_image: Some(p.bz_image),
        initrd: Some(p.initramfs),
        rootfs: None,
        digests: Default::default(),
        config: Default::default(),
        source: None,
    })
}

/// Every image set in the images directory (an absent directory lists as empty).
pub fn list() -> Result<Vec<ImageEntry>, ImageError> {
    list_in(&images_dir()?)
}

/// The file that marks a complete image set.
pub const MANIFEST: &str = "manifest.json";

/// Whether `name` inside an images dir is an image set (see the module docs).
fn is_image_set(dir: &Path, name: &str, ft: fs::FileType) -> bool {
    let is_hash = !name.is_empty() && name.bytes().all(|b| b.is_ascii_hexdigit());
    is_hash
        && ft.is_dir()
        && fs::symlink_metadata(dir.join(name).join(MANIFEST)).is_ok_and(|m| m.is_file())
}

/// Every image set in `dir` (see the module docs), sorted by hash.
pub fn list_in(dir: &Path) -> Result<Vec<ImageEntry>, ImageError> {
    let io_err = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| ImageError::Io { what, path, source }
    };
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("reading", dir)(e)),
    };
    let current = fs::read_link(dir.join("current"))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(io_err("reading", dir))?;
        let ft = entry.file_type().map_err(io_err("stat", &entry.path()))?;
        let hash = entry.file_name().to_string_lossy().into_owned();
        if !is_image_set(dir, &hash, ft) {
            continue;
        }
        let mut bytes = 0u64;
        for f in fs::read_dir(entry.path()).map_err(io_err("reading", &entry.path()))? {
            let f = f.map_err(io_err("reading", &entry.path()))?;
            bytes += f.metadata().map(|m| m.len()).unwrap_or(0);
        }
        let is_current = current.as_deref() == Some(hash.as_str());
        out.push(ImageEntry {
            hash,
            path: entry.path(),
            bytes,
            current: is_current,
        });
    }
    out.sort_by(|a, b| a.hash.cmp(&b.hash));
    Ok(out)
}

/// Remove image sets (only what [`list`] lists): all but `current` when `keep_current`, else
/// all (and the `current` link). Returns what was removed.
pub fn prune(keep_current: bool) -> Result<Vec<ImageEntry>, ImageError> {
    prune_in(&images_dir()?, keep_current)
}

/// [`prune`] over an explicit directory.
pub fn prune_in(dir: &Path, keep_current: bool) -> Result<Vec<ImageEntry>, ImageError> {
    let mut removed = Vec::new();
    for e in list_in(dir)? {
        if keep_current && e.current {
            continue;
        }
        fs::remove_dir_all(&e.path).map_err(|source| ImageError::Io {
            what: "removing",
            path: e.path.clone(),
            source,
        })?;
        removed.push(e);
    }
    if !keep_current {
        let link = dir.join("current");
        match fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ImageError::Io {
                    what: "removing",
                    path: link,
                    source,
                });
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make_set(dir: &Path, hash: &str) {
        let d = dir.join(hash);
        fs::create_dir_all(&d).unwrap();
        for f in ["vmlinux", "bzImage", "initramfs.cpio", MANIFEST] {
            fs::write(d.join(f), b"1234").unwrap();
        }
    }

    #[test]
    fn resolve_list_prune() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert!(list_in(&dir.join("absent")).unwrap().is_empty());
        let err = images_in(&dir.join("current")).unwrap_err();
        assert!(err.to_string().contains("images/build.sh"), "{err}");

        make_set(dir, "aaa");
        make_set(dir, "bbb");
        for cache in NOT_SETS {
            fs::create_dir_all(dir.join(cache)).unwrap();
        }
        // Look like sets but are not: an in-progress build with every file, a hex dir
        // without a manifest, a hex-named symlink to a set, a hex-named file.
        make_set(dir, ".tmp.Xy12ab");
        make_set(dir, "ccc");
        fs::remove_file(dir.join("ccc").join(MANIFEST)).unwrap();
        std::os::unix::fs::symlink("aaa", dir.join("ddd")).unwrap();
        fs::write(dir.join("eee"), b"x").unwrap();
        fs::write(dir.join(".lock"), b"").unwrap();
        std::os::unix::fs::symlink("bbb", dir.join("current")).unwrap();
        let paths = images_in(&dir.join("current")).unwrap();
        assert!(paths.vmlinux.ends_with("current/vmlinux"));
        fs::remove_file(dir.join("bbb/bzImage")).unwrap();
        let err = images_in(&dir.join("current")).unwrap_err().to_string();
        assert!(
            err.contains("bzImage") && err.contains("images/build.sh"),
            "{err}"
        );
        fs::write(dir.join("bbb/bzImage"), b"1234").unwrap();

        let listed = list_in(dir).unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!((listed[0].hash.as_str(), listed[0].current), ("aaa", false));
        assert_eq!(
            (listed[1].hash.as_str(), listed[1].current, listed[1].bytes),
            ("bbb", true, 16)
        );

        let removed = prune_in(dir, true).unwrap();
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].hash, "aaa");
        assert!(!dir.join("aaa").exists() && dir.join("bbb").exists());
        assert_eq!(
            fs::read_link(dir.join("current")).unwrap(),
            Path::new("bbb")
        );
        assert_untouched(dir);
        prune_in(dir, false).unwrap();
        assert!(list_in(dir).unwrap().is_empty());
        assert_untouched(dir);
        assert!(fs::symlink_metadata(dir.join("current")).is_err());
    }

    const NOT_SETS: [&str; 4] = ["kernels/0123", "logs", "agent-target", ".tmp.cafe01"];

    fn assert_untouched(dir: &Path) {
        for d in NOT_SETS.iter().chain(&[".tmp.Xy12ab", "ccc"]) {
            assert!(dir.join(d).is_dir(), "{d} was pruned");
        }
        assert!(dir.join(".tmp.Xy12ab").join(MANIFEST).is_file());
        assert!(dir.join("ccc/vmlinux").is_file());
        assert!(
            fs::symlink_metadata(dir.join("ddd")).is_ok(),
            "symlink ddd removed"
        );
        assert!(dir.join("eee").is_file() && dir.join(".lock").is_file());
    }
}
