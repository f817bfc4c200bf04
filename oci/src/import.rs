//! Importing a local image: an OCI image layout directory, an `oci-archive` tarball (a layout
//! in a tar) or a `docker save` tarball (`manifest.json` + config + layer tars; a newer
//! `docker save` that writes an OCI layout is read as one). A tarball may be gzipped.
//!
//! A tarball is first unpacked into the build directory, keeping only directories and
//! regular files with plain relative names (symlinks, which older `docker save` uses for
//! repeated layers, become hardlinks when their target stays inside the archive). Every
//! document and blob is then read with its size bounded and its digest checked.

use std::cell::Cell;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use flate2::bufread::MultiGzDecoder;
use serde::Deserialize;

use crate::config::ImageConfig;
use crate::digest::Digest;
use crate::manifest::{self, INDEX_TYPES, Index};
use crate::store::{Built, Staging, io_err};
use crate::unpack::LayerSource;
use crate::{Error, Image, Reference, Store};

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const MAX_ARCHIVE_ENTRIES: u64 = 100_000;

fn not_image(path: &Path, why: impl Into<String>) -> Error {
    Error::NotAnImage {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

impl Store {
    /// Imports the image at `path` (see the module docs). Names come from the archive
    /// (`docker save` repo tags; an OCI `ref.name` annotation that is a full reference).
    pub fn import(&self, path: &Path) -> Result<Image, Error> {
        self.import_as(path, &[])
    }

    /// [`Store::import`], also naming the image `names`.
    pub fn import_as(&self, path: &Path, names: &[Reference]) -> Result<Image, Error> {
        let staging = self.staging()?;
        let meta = fs::metadata(path).map_err(io_err("reading", path))?;
        let dir = if meta.is_dir() {
            path.to_path_buf()
        } else {
            let dest = staging.dir.path().join("archive");
            self.unpack_archive(path, &dest)?;
            dest
        };
        let from = Unpacked {
            top: path,
            dir: &dir,
            names: names.iter().map(Reference::whole).collect(),
            source: format!("import {}", path.display()),
        };
        let built = if dir.join("index.json").is_file() {
            self.read_layout(from)?
        } else if dir.join("manifest.json").is_file() {
            self.read_docker_save(from)?
        } else {
            return Err(not_image(
                path,
                "no index.json (OCI layout) or manifest.json (docker save)",
            ));
        };
        self.finish(staging, built)
    }

    pub(crate) fn finish(&self, staging: Staging, built: Built) -> Result<Image, Error> {
        if let Some(img) = self.existing(&built.digest, &built.names)? {
            return Ok(img);
        }
        self.build(staging, built)
    }

    /// Reads `dir/rel` (a regular file, not a symlink) of at most `max` bytes.
    fn read_bounded(&self, top: &Path, file: &Path, max: u64) -> Result<Vec<u8>, Error> {
        let m = regular_file(top, file, &file.display().to_string())?;
        if m.len() > max {
            return Err(not_image(
                top,
                format!("{} is over {max} bytes", file.display()),
            ));
        }
        let mut buf = Vec::new();
        fs::File::open(file)
            .map_err(io_err("opening", file))?
            .take(max)
            .read_to_end(&mut buf)
            .map_err(io_err("reading", file))?;
        Ok(buf)
    }

    fn blob_path(dir: &Path, d: &Digest) -> PathBuf {
        dir.join("blobs/sha256").join(d.hex())
    }

    /// A document blob of the layout, digest checked.
    fn layout_doc(
        &self,
        top: &Path,
        dir: &Path,
        desc: &manifest::Descriptor,
    ) -> Result<Vec<u8>, Error> {
        let d = desc.digest()?;
        let bytes = self.read_bounded(
            top,
            &Self::blob_path(dir, &d),
            self.limits().max_document_bytes,
        )?;
        let actual = Digest::of(&bytes);
        if actual != d {
            return Err(not_image(top, format!("blob {d} has digest {actual}")));
        }
        Ok(bytes)
    }

    fn read_layout(&self, mut from: Unpacked<'_>) -> Result<Built, Error> {
        let (top, dir) = (from.top, from.dir);
        let max = self.limits().max_document_bytes;
        let index_bytes = self.read_bounded(top, &dir.join("index.json"), max)?;
        let mut index: Index = serde_json::from_slice(&index_bytes)
            .map_err(|e| not_image(top, format!("index.json: {e}")))?;
        for _depth in 0..4 {
            let desc = manifest::pick(&index)?.clone();
            if let Some(n) = desc.annotations.get(REF_NAME)
                && n.contains('/')
                && let Ok(r) = n.parse::<Reference>()
            {
                from.names.push(r.whole());
            }
            let bytes = self.layout_doc(top, dir, &desc)?;
            if INDEX_TYPES.contains(&desc.media_type.as_str()) {
                index = serde_json::from_slice(&bytes)
                    .map_err(|e| not_image(top, format!("nested index: {e}")))?;
                continue;
            }
            let m = manifest::parse(&bytes, self.limits())?;
            let config = self.layout_doc(top, dir, &m.config)?;
            let (config, layers) = manifest::layers(&m, &config, |d| Self::blob_path(dir, d))?;
            for l in &layers {
                regular_file(top, &l.path, &l.path.display().to_string())?;
            }
            return Ok(from.built(desc.digest()?, config, layers));
        }
        Err(not_image(top, "indexes nested too deep"))
    }

    fn read_docker_save(&self, mut from: Unpacked<'_>) -> Result<Built, Error> {
        let (top, dir) = (from.top, from.dir);
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Entry {
            config: String,
            #[serde(default)]
            repo_tags: Option<Vec<String>>,
            layers: Vec<String>,
        }
        let max = self.limits().max_document_bytes;
        let bytes = self.read_bounded(top, &dir.join("manifest.json"), max)?;
        let entries: Vec<Entry> = serde_json::from_slice(&bytes)
            .map_err(|e| not_image(top, format!("manifest.json: {e}")))?;
        let [entry] = entries.as_slice() else {
            return Err(not_image(
                top,
                format!(
                    "manifest.json lists {} images; import one at a time",
                    entries.len()
                ),
            ));
        };
        let inside = |rel: &str| -> Result<PathBuf, Error> {
            let p = Path::new(rel);
            if p.components().all(|c| matches!(c, Component::Normal(_))) {
                Ok(dir.join(p))
            } else {
                Err(not_image(
                    top,
                    format!("manifest.json names {rel:?} outside the archive"),
                ))
            }
        };
        let config = self.read_bounded(top, &inside(&entry.config)?, max)?;
        let parsed = crate::config::parse(&config)?;
        if parsed.diff_ids.len() != entry.layers.len() {
            return Err(not_image(
                top,
                format!(
                    "{} layers but the config lists {} diff IDs",
                    entry.layers.len(),
                    parsed.diff_ids.len()
                ),
            ));
        }
        if entry.layers.len() > self.limits().max_layers {
            return Err(not_image(
                top,
                format!("more than {} layers", self.limits().max_layers),
            ));
        }
        let mut layers = Vec::new();
        for (rel, diff_id) in entry.layers.iter().zip(&parsed.diff_ids) {
            let path = inside(rel)?;
            regular_file(top, &path, &format!("layer {rel}"))?;
            layers.push(LayerSource {
                path,
                digest: None,
                size: None,
                diff_id: Some(diff_id.clone()),
            });
        }
        for t in entry.repo_tags.iter().flatten() {
            if let Ok(r) = t.parse::<Reference>() {
                from.names.push(r.whole());
            }
        }
        // No manifest in the archive: the key is the digest of the OCI manifest it implies
        // (config digest + the uncompressed layers, which the diff IDs name and unpacking checks).
        let implied = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": Digest::of(&config).to_string(), "size": config.len()},
            "layers": parsed.diff_ids.iter().map(|d| serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d.to_string()})).collect::<Vec<_>>(),
        });
        let digest = Digest::of(&serde_json::to_vec(&implied).expect("json"));
        Ok(from.built(digest, parsed.config, layers))
    }

    /// Unpacks an image tarball into `dest` (see the module docs).
    fn unpack_archive(&self, archive: &Path, dest: &Path) -> Result<(), Error> {
        let file = fs::File::open(archive).map_err(io_err("opening", archive))?;
        let read = Rc::new(Cell::new(0u64));
        let mut raw = BufReader::new(Counted {
            inner: file,
            read: read.clone(),
        });
        let head = raw.fill_buf().map_err(io_err("reading", archive))?;
        let reader: Box<dyn Read> = if head.starts_with(&[0x1f, 0x8b]) {
            Box::new(MultiGzDecoder::new(raw))
        } else {
            Box::new(raw)
        };
        let bad = |why: String| not_image(archive, why);
        let max_bytes = self.limits().max_unpacked_bytes;
        let mut total = 0u64;
        let mut written = 0u64;
        let mut links = Vec::new();
        fs::create_dir(dest).map_err(io_err("creating", dest))?;
        let mut tar = tar::Archive::new(reader);
        let entries = tar
            .entries()
            .map_err(|e| bad(format!("not a tar archive: {e}")))?;
        for (n, entry) in entries.enumerate() {
            if n as u64 >= MAX_ARCHIVE_ENTRIES {
                return Err(bad(format!("more than {MAX_ARCHIVE_ENTRIES} entries")));
            }
            let mut entry = entry.map_err(|e| bad(format!("not a tar archive: {e}")))?;
            let raw_path = entry
                .path()
                .map_err(|e| bad(format!("entry name: {e}")))?
                .into_owned();
            let rel: PathBuf = raw_path
                .components()
                .filter(|c| !matches!(c, Component::CurDir | Component::RootDir))
                .collect();
            if rel.as_os_str().is_empty() {
                continue;
            }
            if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(bad(format!(
                    "entry {} leaves the archive",
                    raw_path.display()
                )));
            }
            let out = dest.join(&rel);
            match entry.header().entry_type() {
                tar::EntryType::Directory => {
                    fs::create_dir_all(&out).map_err(io_err("creating", &out))?;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    total += entry.size();
                    if total > max_bytes {
                        return Err(bad(format!("holds more than {max_bytes} bytes")));
                    }
                    if let Some(p) = out.parent() {
                        fs::create_dir_all(p).map_err(io_err("creating", p))?;
                    }
                    let mut f = fs::File::create_new(&out).map_err(io_err("creating", &out))?;
                    // Written in steps, so a gzip bomb stops at the ratio bound, not at the end.
                    let limits = self.limits();
                    let mut buf = vec![0u8; 1 << 20];
                    loop {
                        let n = entry.read(&mut buf).map_err(io_err("reading", archive))?;
                        if n == 0 {
                            break;
                        }
                        f.write_all(&buf[..n]).map_err(io_err("writing", &out))?;
                        written += n as u64;
                        if written > limits.ratio_floor
                            && written > limits.max_ratio.saturating_mul(read.get().max(1))
                        {
                            return Err(bad(format!(
                                "decompresses to more than {}x its size: refusing a decompression bomb",
                                limits.max_ratio
                            )));
                        }
                    }
                }
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    let target = entry
                        .link_name()
                        .map_err(|e| bad(format!("link name: {e}")))?
                        .ok_or_else(|| bad(format!("{} has no link target", rel.display())))?
                        .into_owned();
                    let is_sym = entry.header().entry_type() == tar::EntryType::Symlink;
                    links.push((rel, target, is_sym));
                }
                _ => {} // nothing else belongs in an image archive
            }
        }
        for (rel, target, is_sym) in links {
            // A symlink's target is relative to its directory, a hardlink's to the archive root.
            let base = if is_sym {
                rel.parent().unwrap_or(Path::new(""))
            } else {
                Path::new("")
            };
            let mut resolved = PathBuf::new();
            for c in base.join(&target).components() {
                match c {
                    Component::Normal(n) => resolved.push(n),
                    Component::CurDir => {}
                    Component::ParentDir if resolved.pop() => {}
                    _ => return Err(bad(format!("link {} leaves the archive", rel.display()))),
                }
            }
            let src = dest.join(&resolved);
            if !fs::symlink_metadata(&src).is_ok_and(|m| m.is_file()) {
                return Err(bad(format!(
                    "link {} points at no file in the archive",
                    rel.display()
                )));
            }
            let out = dest.join(&rel);
            if let Some(p) = out.parent() {
                fs::create_dir_all(p).map_err(io_err("creating", p))?;
            }
            fs::hard_link(&src, &out).map_err(io_err("linking", &out))?;
        }
        Ok(())
    }
}

/// An unpacked image on its way to a [`Built`]: the path the user gave (named in errors), the
/// directory holding the image, the names it gets, and the source line the store records.
struct Unpacked<'a> {
    top: &'a Path,
    dir: &'a Path,
    names: Vec<String>,
    source: String,
}

impl Unpacked<'_> {
    fn built(self, digest: Digest, config: ImageConfig, layers: Vec<LayerSource>) -> Built {
        Built {
            digest,
            config,
            layers,
            source: self.source,
            names: self.names,
        }
    }
}

/// The metadata of `path`, which must be a regular file (not a symlink); `what` names it in
/// the error, which is about the image at `top`.
fn regular_file(top: &Path, path: &Path, what: &str) -> Result<fs::Metadata, Error> {
    let m = fs::symlink_metadata(path).map_err(io_err("reading", path))?;
    if !m.is_file() {
        return Err(not_image(top, format!("{what} is not a regular file")));
    }
    Ok(m)
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    inner: R,
    read: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}
