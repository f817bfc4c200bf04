//! Turning validated mounts into what the guest mounts.
//!
//! - Every mount, by default ([`vm_spec::MountVia::Share`]), becomes a read-only virtio-fs
//!   share ([`vm_drivers::SharePlan`]): a host **directory** is served as it is, a host
//!   **file** as a regular file with the host's size, bytes and mode at the guest path. The
//!   driver's jailed file server reads the host's files in place: nothing is copied, nothing
//!   is cached here, and no size cap applies beyond the host's own.
//! - A directory mount that asks for it ([`vm_spec::MountVia::Erofs`], `-v DIR:GUEST:ro,erofs`:
//!   no file server on the host side) becomes an erofs image built with `mkfs.erofs` into the
//!   mount cache (`<cache>/vm/mounts/<key>.erofs`) on a read-only disk, mounted read-only by
//!   the agent. The key is
//!   the sha256 of the canonical path and, for every entry below it (sorted), its relative
//!   path, type, size, mtime and symlink target, so an unchanged directory reuses its image
//!   and any change produces a new one. Images are built into a temp file in the cache
//!   directory and renamed into place, so a crash never leaves a half-written image under
//!   a valid name. Owners are flattened to root and xattrs dropped (`--all-root -x-1`).
//!   `mkfs.erofs` runs in the same hardened child as for OCI images and snapshots
//!   ([`vm_oci::build_erofs_with`]: `no_new_privs`, only `CAP_DAC_READ_SEARCH` in its bounding
//!   set).
//!
//! A directory copied to erofs whose files add up to more than [`MountCache::max_dir_bytes`]
//! (or has more than [`MAX_DIR_ENTRIES`] entries) is refused before anything is built; an
//! erofs copy of a file is refused (it has no directory to hold it).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use thiserror::Error;
use vm_drivers::{DiskFs, DiskPlan, ShareKind, SharePlan};
use vm_spec::{MountVia, ValidMount};

/// Default cap on the total file size of a mounted directory (4 GiB).
pub const DEFAULT_MAX_DIR_BYTES: u64 = 4 << 30;
/// Cap on the number of entries walked in a mounted directory.
pub const MAX_DIR_ENTRIES: usize = 1_000_000;

/// Why a mount could not be prepared.
#[derive(Debug, Error)]
pub enum MountError {
    #[error("mount {}: {what}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mount {}: neither a regular file nor a directory", .0.display())]
    Kind(PathBuf),
    #[error("mount {}: an erofs copy is made of a directory, not a file", .0.display())]
    ErofsFile(PathBuf),
    #[error("mount {}: directory holds {bytes} bytes, over the {max}-byte cap", .path.display())]
    TooLarge { path: PathBuf, bytes: u64, max: u64 },
    #[error("mount {}: more than {MAX_DIR_ENTRIES} entries", .0.display())]
    TooManyEntries(PathBuf),
    #[error("mount {}: building its erofs image", .path.display())]
    Mkfs {
        path: PathBuf,
        #[source]
        source: vm_oci::ErofsError,
    },
    #[error("no cache directory: set XDG_CACHE_HOME or HOME")]
    NoCacheDir,
}

/// The erofs image cache for directory mounts.
#[derive(Debug, Clone)]
pub struct MountCache {
    dir: PathBuf,
    max_dir_bytes: u64,
}

/// `$XDG_CACHE_HOME`, else `$HOME/.cache`.
pub fn cache_home() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))
}

impl MountCache {
    /// A cache in `dir` (created when first needed).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        MountCache {
            dir: dir.into(),
            max_dir_bytes: DEFAULT_MAX_DIR_BYTES,
        }
    }

    /// The default cache, `<cache home>/vm/mounts`.
    pub fn default_location() -> Result<Self, MountError> {
        Ok(MountCache::new(
            cache_home()
                .ok_or(MountError::NoCacheDir)?
                .join("vm/mounts"),
        ))
    }

    /// Change the directory size cap.
    pub fn with_max_dir_bytes(mut self, max: u64) -> Self {
        self.max_dir_bytes = max;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn max_dir_bytes(&self) -> u64 {
        self.max_dir_bytes
    }

    /// The shares and erofs disks of `mounts`, each list in the mounts' order (share N gets
    /// the tag `fs<N>`, disk N the serial `disk<N>`).
    pub fn prepare(
        &self,
        mounts: &[ValidMount],
    ) -> Result<(Vec<DiskPlan>, Vec<SharePlan>), MountError> {
        let (mut disks, mut shares) = (Vec::new(), Vec::new());
        for m in mounts {
            let meta = fs::metadata(&m.host_path).map_err(|source| MountError::Io {
                what: "stat",
                path: m.host_path.clone(),
                source,
            })?;
            let kind = if meta.is_file() {
                ShareKind::File
            } else if meta.is_dir() {
                ShareKind::Dir
            } else {
                return Err(MountError::Kind(m.host_path.clone()));
            };
            match (m.via, kind) {
                (MountVia::Share, kind) => shares.push(SharePlan {
                    host_path: m.host_path.clone(),
                    guest_path: m.guest_path.clone(),
                    kind,
                }),
                (MountVia::Erofs, ShareKind::Dir) => disks.push(DiskPlan {
                    host_path: self.erofs_for_dir(&m.host_path)?,
                    guest_path: m.guest_path.clone(),
                    fs: DiskFs::Erofs,
                }),
                (MountVia::Erofs, ShareKind::File) => {
                    return Err(MountError::ErofsFile(m.host_path.clone()));
                }
            }
        }
        Ok((disks, shares))
    }

    /// The cached erofs image of `dir`, built if missing or stale.
    pub fn erofs_for_dir(&self, dir: &Path) -> Result<PathBuf, MountError> {
        let key = dir_key(dir, self.max_dir_bytes)?;
        let image = self.dir.join(format!("{key}.erofs"));
        if image.is_file() {
            tracing::debug!(dir = %dir.display(), image = %image.display(), "reusing erofs image");
            return Ok(image);
        }
        let io_err = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| MountError::Io { what, path, source }
        };
        fs::create_dir_all(&self.dir).map_err(io_err("creating cache dir", &self.dir))?;
        let tmp = tempfile::Builder::new()
            .prefix(".build-")
            .suffix(".erofs")
            .tempfile_in(&self.dir)
            .map_err(io_err("creating temp image", &self.dir))?;
        vm_oci::build_erofs_with(dir, tmp.path(), vm_oci::ErofsOwners::Root).map_err(|source| {
            MountError::Mkfs {
                path: dir.to_path_buf(),
                source,
            }
        })?;
        tmp.persist(&image).map_err(|e| MountError::Io {
            what: "saving image",
            path: image.clone(),
            source: e.error,
        })?;
        tracing::info!(dir = %dir.display(), image = %image.display(), "built erofs image");
        Ok(image)
    }
}

/// The cache key of a directory (see the module docs). Refuses a directory over `max_bytes`.
pub fn dir_key(dir: &Path, max_bytes: u64) -> Result<String, MountError> {
    let mut hasher = Sha256::new();
    hasher.update(dir.as_os_str().as_encoded_bytes());
    hasher.update([0]);
    let mut total: u64 = 0;
    let mut count: usize = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        let rd = fs::read_dir(&abs).map_err(|source| MountError::Io {
            what: "reading directory",
            path: abs.clone(),
            source,
        })?;
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|source| MountError::Io {
                what: "reading directory",
                path: abs.clone(),
                source,
            })?;
            names.push(entry.file_name());
        }
        names.sort();
        for name in names {
            count += 1;
            if count > MAX_DIR_ENTRIES {
                return Err(MountError::TooManyEntries(dir.to_path_buf()));
            }
            let rel_child = rel.join(&name);
            let abs_child = dir.join(&rel_child);
            let meta = fs::symlink_metadata(&abs_child).map_err(|source| MountError::Io {
                what: "stat",
                path: abs_child.clone(),
                source,
            })?;
            let kind = meta.file_type();
            hasher.update(rel_child.as_os_str().as_encoded_bytes());
            hasher.update([0]);
            let tag = if kind.is_dir() {
                b'd'
            } else if kind.is_symlink() {
                b'l'
            } else {
                b'f'
            };
            hasher.update([tag]);
            hasher.update(meta.size().to_le_bytes());
            hasher.update(meta.mtime().to_le_bytes());
            hasher.update(meta.mtime_nsec().to_le_bytes());
            hasher.update(meta.mode().to_le_bytes());
            if kind.is_symlink() {
                let target = fs::read_link(&abs_child).map_err(|source| MountError::Io {
                    what: "reading link",
                    path: abs_child.clone(),
                    source,
                })?;
                hasher.update(target.as_os_str().as_encoded_bytes());
                hasher.update([0]);
            } else if kind.is_dir() {
                stack.push(rel_child);
            } else {
                total = total.saturating_add(meta.size());
                if total > max_bytes {
                    return Err(MountError::TooLarge {
                        path: dir.to_path_buf(),
                        bytes: total,
                        max: max_bytes,
                    });
                }
            }
        }
    }
    Ok(hex::encode(hasher.finalize()))
}
