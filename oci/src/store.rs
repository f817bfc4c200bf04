//! The content-addressed image store: one read-only erofs file per image, keyed by manifest
//! digest, plus the names (references) that point at them.
//!
//! ```text
//! <store>/images/<hex>/rootfs.erofs   the flattened root, read-only erofs
//! <store>/images/<hex>/image.json     digest, ImageConfig, where it came from, unpack counts
//! <store>/refs.json                   {"registry/name:tag": "sha256:<hex>", ...}
//! <store>/tmp/<random>/               builds in progress (each holds a locked .lock)
//! <store>/.lock                       taken (flock) while images/ or refs.json change
//! ```
//! An image appears only by renaming a complete `tmp/<random>/out` to `images/<hex>`, and
//! leaves by being renamed into `tmp/` before it is deleted: a reader sees all of one or none.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::ImageConfig;
use crate::digest::Digest;
use crate::limits::Limits;
use crate::unpack::{self, LayerSource, UnpackStats};
use crate::{Error, erofs};

/// The erofs file's name inside an image directory.
pub const EROFS: &str = "rootfs.erofs";
const META: &str = "image.json";
const REFS: &str = "refs.json";

/// One image in the store, as plain data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Image {
    /// The manifest digest (for a `docker save` archive: of the OCI manifest made from it).
    pub digest: Digest,
    /// The read-only erofs file holding the flattened root.
    pub erofs: PathBuf,
    /// Size of the erofs file, in bytes.
    pub size: u64,
    /// Process defaults from the image config.
    pub config: ImageConfig,
    /// The references that name this image (`registry/repo:tag` or `registry/repo@digest`).
    pub refs: Vec<String>,
    /// Where it came from (`pull <ref>` or `import <path>`).
    pub source: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    digest: Digest,
    config: ImageConfig,
    source: String,
    entries: u64,
    unpacked_bytes: u64,
    dropped_devices: u64,
    cleared_setid: u64,
}

/// What [`Store::remove`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub image: Image,
    /// The references removed.
    pub refs: Vec<String>,
    /// Whether the image itself was deleted (false: other references still name it).
    pub deleted: bool,
}

/// An image store in a directory (see the module docs).
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    limits: Limits,
}

/// The default store directory: `$VM_OCI_DIR`, else `oci/` next to `$VM_IMAGES_DIR`, else
/// `$XDG_CACHE_HOME/vm/oci`, else `$HOME/.cache/vm/oci`.
pub fn default_dir() -> Option<PathBuf> {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("VM_OCI_DIR") {
        return Some(d);
    }
    if let Some(parent) = var("VM_IMAGES_DIR").and_then(|d| d.parent().map(Path::to_path_buf)) {
        return Some(parent.join("oci"));
    }
    var("XDG_CACHE_HOME")
        .or_else(|| var("HOME").map(|h| h.join(".cache")))
        .map(|c| c.join("vm/oci"))
}

pub(crate) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { what, path, source }
}

/// An exclusive `flock` held until dropped.
pub(crate) struct Lock {
    _file: fs::File,
}

impl Lock {
    pub(crate) fn take(path: &Path, wait: bool) -> Result<Option<Lock>, Error> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(io_err("opening", path))?;
        // An exclusive flock(2) on the file (std's File::lock).
        let locked = if wait {
            f.lock()
        } else {
            match f.try_lock() {
                Ok(()) => Ok(()),
                Err(fs::TryLockError::WouldBlock) => return Ok(None),
                Err(fs::TryLockError::Error(e)) => Err(e),
            }
        };
        locked.map_err(io_err("locking", path))?;
        Ok(Some(Lock { _file: f }))
    }
}

/// A build directory under `tmp/`, deleted when dropped unless committed.
pub(crate) struct Staging {
    pub dir: tempfile::TempDir,
    _lock: Lock,
}

impl Store {
    /// Opens (creating, mode 0700) the store in `dir`, with the default [`Limits`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<Store, Error> {
        let root = dir.into();
        for d in [root.clone(), root.join("images"), root.join("tmp")] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .create(&d)
                .map_err(io_err("creating", &d))?;
        }
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700))
            .map_err(io_err("chmod", &root))?;
        Ok(Store {
            root,
            limits: Limits::default(),
        })
    }

    /// Opens the store in [`default_dir`].
    pub fn open_default() -> Result<Store, Error> {
        Store::open(default_dir().ok_or(Error::NoDir)?)
    }

    /// The same store with other limits for images fetched or imported from now on.
    pub fn with_limits(mut self, limits: Limits) -> Store {
        self.limits = limits;
        self
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    fn image_dir(&self, d: &Digest) -> PathBuf {
        self.root.join("images").join(d.hex())
    }

    fn lock(&self) -> Result<Lock, Error> {
        Ok(Lock::take(&self.root.join(".lock"), true)?.expect("a waiting lock is always taken"))
    }

    fn refs(&self) -> Result<BTreeMap<String, Digest>, Error> {
        let p = self.root.join(REFS);
        match fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| Error::Corrupt {
                path: p,
                why: e.to_string(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(e) => Err(io_err("reading", &p)(e)),
        }
    }

    fn write_refs(&self, refs: &BTreeMap<String, Digest>) -> Result<(), Error> {
        let p = self.root.join(REFS);
        let tmp = self.root.join(".refs.json.tmp");
        let body = serde_json::to_vec_pretty(refs).expect("refs serialize");
        fs::write(&tmp, body).map_err(io_err("writing", &tmp))?;
        fs::rename(&tmp, &p).map_err(io_err("renaming", &p))
    }

    fn load(&self, d: &Digest, refs: &BTreeMap<String, Digest>) -> Result<Option<Image>, Error> {
        let dir = self.image_dir(d);
        let meta_path = dir.join(META);
        let bytes = match fs::read(&meta_path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("reading", &meta_path)(e)),
        };
        let meta: Meta = serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            path: meta_path.clone(),
            why: e.to_string(),
        })?;
        let erofs = dir.join(EROFS);
        let size = fs::metadata(&erofs).map_err(io_err("stat", &erofs))?.len();
        Ok(Some(Image {
            digest: meta.digest,
            erofs,
            size,
            config: meta.config,
            refs: refs
                .iter()
                .filter(|(_, v)| *v == d)
                .map(|(k, _)| k.clone())
                .collect(),
            source: meta.source,
        }))
    }

    /// The digest `what` names: a digest, a unique digest prefix (at least 6 hex digits, with
    /// or without `sha256:`), or a reference in the store.
    fn resolve_name(&self, what: &str) -> Result<Option<Digest>, Error> {
        if let Ok(d) = Digest::parse(what) {
            return Ok(Some(d));
        }
        let refs = self.refs()?;
        if let Some(name) = self.stored_name(what, &refs) {
            return Ok(Some(refs[&name].clone()));
        }
        let prefix = what.strip_prefix("sha256:").unwrap_or(what);
        if prefix.len() >= 6 && prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            let hits: Vec<Digest> = self
                .digests()?
                .into_iter()
                .filter(|d| d.hex().starts_with(prefix))
                .collect();
            if hits.len() > 1 {
                return Err(Error::Ambiguous(what.into()));
            }
            return Ok(hits.into_iter().next());
        }
        Ok(None)
    }

    /// `what` as a name in `refs` (as given, or normalized as a reference).
    fn stored_name(&self, what: &str, refs: &BTreeMap<String, Digest>) -> Option<String> {
        let parsed = what
            .parse::<oci_client::Reference>()
            .ok()
            .map(|r| r.whole());
        [Some(what.to_owned()), parsed]
            .into_iter()
            .flatten()
            .find(|n| refs.contains_key(n))
    }

    fn digests(&self) -> Result<Vec<Digest>, Error> {
        let dir = self.root.join("images");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).map_err(io_err("reading", &dir))? {
            let e = e.map_err(io_err("reading", &dir))?;
            if let Ok(d) = Digest::parse(&format!("sha256:{}", e.file_name().to_string_lossy())) {
                out.push(d);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The image `what` names (a digest, a unique digest prefix or a stored reference), if
    /// it is in the store. No network.
    pub fn get(&self, what: &str) -> Result<Option<Image>, Error> {
        match self.resolve_name(what)? {
            Some(d) => self.load(&d, &self.refs()?),
            None => Ok(None),
        }
    }

    /// Every image in the store, by digest.
    pub fn list(&self) -> Result<Vec<Image>, Error> {
        let refs = self.refs()?;
        let mut out = Vec::new();
        for d in self.digests()? {
            out.extend(self.load(&d, &refs)?);
        }
        Ok(out)
    }

    /// Removes what `what` names. A reference is removed, and the image with it when no
    /// other reference names it; a digest removes the image and every reference to it.
    pub fn remove(&self, what: &str) -> Result<Removed, Error> {
        let _lock = self.lock()?;
        let digest = self
            .resolve_name(what)?
            .ok_or_else(|| Error::NotFound(what.into()))?;
        let mut refs = self.refs()?;
        let image = self
            .load(&digest, &refs)?
            .ok_or_else(|| Error::NotFound(what.into()))?;
        // A stored name (as given, or normalized) removes that name; a digest or a digest
        // prefix removes every name.
        let removed: Vec<String> = match self.stored_name(what, &refs) {
            Some(name) => vec![name],
            None => image.refs.clone(),
        };
        refs.retain(|k, _| !removed.contains(k));
        self.write_refs(&refs)?;
        let deleted = !refs.values().any(|d| *d == digest);
        if deleted {
            self.delete_dir(&digest)?;
        }
        Ok(Removed {
            image,
            refs: removed,
            deleted,
        })
    }

    /// Removes every image no reference names, and builds left behind by a process that
    /// died. Returns the images removed.
    pub fn prune(&self) -> Result<Vec<Image>, Error> {
        let _lock = self.lock()?;
        let mut removed = Vec::new();
        for img in self.list()? {
            if img.refs.is_empty() {
                self.delete_dir(&img.digest)?;
                removed.push(img);
            }
        }
        let tmp = self.root.join("tmp");
        for e in fs::read_dir(&tmp).map_err(io_err("reading", &tmp))? {
            let e = e.map_err(io_err("reading", &tmp))?;
            let p = e.path();
            // A build in progress holds its lock; one that does not is abandoned.
            if let Some(_l) = Lock::take(&p.join(".lock"), false).ok().flatten() {
                fs::remove_dir_all(&p).map_err(io_err("removing", &p))?;
            }
        }
        Ok(removed)
    }

    fn delete_dir(&self, d: &Digest) -> Result<(), Error> {
        let staging = self.staging()?;
        let dir = self.image_dir(d);
        let dest = staging.dir.path().join("gone");
        fs::rename(&dir, &dest).map_err(io_err("removing", &dir))?;
        Ok(()) // the staging directory and what was moved into it go when it drops
    }

    pub(crate) fn staging(&self) -> Result<Staging, Error> {
        let tmp = self.root.join("tmp");
        let dir = tempfile::Builder::new()
            .prefix("build-")
            .tempdir_in(&tmp)
            .map_err(io_err("creating a build directory in", &tmp))?;
        let lock = Lock::take(&dir.path().join(".lock"), true)?.expect("waiting lock");
        Ok(Staging { dir, _lock: lock })
    }

    /// Records `names` for `digest` (already in the store).
    fn name(&self, digest: &Digest, names: &[String]) -> Result<(), Error> {
        if names.is_empty() {
            return Ok(());
        }
        let mut refs = self.refs()?;
        for n in names {
            refs.insert(n.clone(), digest.clone());
        }
        self.write_refs(&refs)
    }

    /// The image `digest` if stored, after recording `names` for it.
    pub(crate) fn existing(
        &self,
        digest: &Digest,
        names: &[String],
    ) -> Result<Option<Image>, Error> {
        let _lock = self.lock()?;
        if self.load(digest, &self.refs()?)?.is_none() {
            return Ok(None);
        }
        self.name(digest, names)?;
        self.load(digest, &self.refs()?)
    }

    /// Unpacks `layers` in `staging`, builds the erofs file and moves the result into the
    /// store under `digest` with `names` pointing at it.
    pub(crate) fn build(&self, staging: Staging, image: Built) -> Result<Image, Error> {
        let tree = staging.dir.path().join("tree");
        let out = staging.dir.path().join("out");
        for d in [&tree, &out] {
            fs::create_dir(d).map_err(io_err("creating", d))?;
        }
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&tree, fs::Permissions::from_mode(0o755))
            .map_err(io_err("chmod", &tree))?;
        let t = std::time::Instant::now();
        let stats: UnpackStats = unpack::unpack(&tree, image.layers, &self.limits)?;
        let unpacked = t.elapsed();
        let erofs_path = out.join(EROFS);
        erofs::build(&tree, &erofs_path)?;
        // Content-addressed: nothing may change it after this.
        fs::set_permissions(&erofs_path, fs::Permissions::from_mode(0o444))
            .map_err(io_err("chmod", &erofs_path))?;
        tracing::info!(
            digest = %image.digest,
            entries = stats.entries,
            bytes = stats.bytes,
            dropped_devices = stats.dropped_devices,
            cleared_setid = stats.cleared_setid,
            unpack = ?unpacked,
            mkfs = ?(t.elapsed() - unpacked),
            "converted image"
        );
        fs::remove_dir_all(&tree).map_err(io_err("removing", &tree))?;
        let meta = Meta {
            digest: image.digest.clone(),
            config: image.config,
            source: image.source,
            entries: stats.entries,
            unpacked_bytes: stats.bytes,
            dropped_devices: stats.dropped_devices,
            cleared_setid: stats.cleared_setid,
        };
        let meta_path = out.join(META);
        fs::write(
            &meta_path,
            serde_json::to_vec_pretty(&meta).expect("meta serializes"),
        )
        .map_err(io_err("writing", &meta_path))?;
        let _lock = self.lock()?;
        let dest = self.image_dir(&image.digest);
        if fs::symlink_metadata(&dest).is_err() {
            fs::rename(&out, &dest).map_err(io_err("renaming into", &dest))?;
        } // else another build of the same digest won; ours is dropped with the staging dir
        self.name(&image.digest, &image.names)?;
        self.load(&image.digest, &self.refs()?)?
            .ok_or_else(|| Error::NotFound(image.digest.to_string()))
    }
}

/// Everything [`Store::build`] needs about one image.
pub(crate) struct Built {
    pub digest: Digest,
    pub config: ImageConfig,
    pub layers: Vec<LayerSource>,
    pub source: String,
    pub names: Vec<String>,
}
