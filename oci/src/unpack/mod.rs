//! Applying an image's layers, in order, to an empty directory: the flattened root tree.
//!
//! Layers are untrusted. Each is read once, as a stream: the compressed bytes are hashed (and
//! must match the manifest's digest and size when known), decompressed (gzip or plain tar;
//! zstd is refused by name), bounded ([`Limits`]: total unpacked bytes, entry count, and a
//! decompression ratio so a gzip bomb stops early), hashed again (must match the config's
//! diff ID) and applied with OCI semantics by [`entry`]. The work runs on a dedicated thread
//! with reduced capabilities (see [`crate::sys::caps`]).

mod entry;

use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use flate2::bufread::MultiGzDecoder;
use thiserror::Error;

use crate::digest::{Digest, HashingReader};
use crate::limits::Limits;
use crate::sys::caps;

/// One layer to apply: a blob file, with what it must hash to.
#[derive(Debug, Clone)]
pub(crate) struct LayerSource {
    pub path: PathBuf,
    /// Digest of the blob as stored (compressed), when the manifest gives one.
    pub digest: Option<Digest>,
    /// Size of the blob, when the manifest gives one.
    pub size: Option<u64>,
    /// Digest of the uncompressed tar (the config's `rootfs.diff_ids`), when known.
    pub diff_id: Option<Digest>,
}

/// What unpacking did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackStats {
    /// Tar entries read over all layers.
    pub entries: u64,
    /// Decompressed tar bytes over all layers.
    pub bytes: u64,
    /// Device nodes dropped.
    pub dropped_devices: u64,
    /// Files whose setuid/setgid bits were cleared.
    pub cleared_setid: u64,
}

/// Why a layer could not be applied. Nothing of a failed unpack is kept.
#[derive(Debug, Error)]
pub enum UnpackError {
    #[error("layer {layer}: entry {path:?} refused: {why}")]
    Escape {
        layer: usize,
        path: String,
        why: &'static str,
    },
    #[error(
        "layer {layer}: decompresses to more than {ratio}x its compressed size: refusing a decompression bomb"
    )]
    Bomb { layer: usize, ratio: u64 },
    #[error("image unpacks to more than {0} bytes")]
    TooLarge(u64),
    #[error("image has more than {0} entries")]
    TooManyEntries(u64),
    #[error("layer {layer}: zstd-compressed layers are not supported (gzip or uncompressed only)")]
    Zstd { layer: usize },
    #[error("layer {layer}: blob digest is {actual}, expected {expected}")]
    Digest {
        layer: usize,
        expected: Digest,
        actual: Digest,
    },
    #[error("layer {layer}: blob is {actual} bytes, the manifest says {expected}")]
    Size {
        layer: usize,
        expected: u64,
        actual: u64,
    },
    #[error(
        "layer {layer}: uncompressed digest {actual} differs from the config's diff ID {expected}"
    )]
    DiffId {
        layer: usize,
        expected: Digest,
        actual: Digest,
    },
    #[error("layer {layer}: entry {path:?}: {why}")]
    Entry {
        layer: usize,
        path: String,
        why: String,
    },
    #[error("layer {layer}: {what} {path:?}")]
    Io {
        layer: usize,
        what: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("layer {layer}: not a valid (gzip) tar stream")]
    Tar {
        layer: usize,
        #[source]
        source: io::Error,
    },
    #[error("unpacking: {0}")]
    Thread(String),
}

/// Applies `layers` in order to the empty directory `tree`, on a thread with reduced
/// capabilities.
pub(crate) fn unpack(
    tree: &Path,
    layers: Vec<LayerSource>,
    limits: &Limits,
) -> Result<UnpackStats, UnpackError> {
    let tree = tree.to_path_buf();
    let limits = limits.clone();
    let handle = std::thread::Builder::new()
        .name("vm-oci-unpack".into())
        .spawn(move || {
            caps::restrict_thread(&[caps::CAP_CHOWN, caps::CAP_DAC_OVERRIDE, caps::CAP_FOWNER])
                .map_err(|e| UnpackError::Thread(format!("dropping capabilities: {e}")))?;
            unpack_here(&tree, &layers, &limits)
        })
        .map_err(|e| UnpackError::Thread(format!("spawning the unpack thread: {e}")))?;
    handle
        .join()
        .map_err(|_| UnpackError::Thread("the unpack thread panicked".into()))?
}

fn unpack_here(
    tree: &Path,
    layers: &[LayerSource],
    limits: &Limits,
) -> Result<UnpackStats, UnpackError> {
    let root: OwnedFd = std::fs::File::open(tree)
        .map_err(|source| UnpackError::Io {
            layer: 0,
            what: "opening",
            path: tree.display().to_string(),
            source,
        })?
        .into();
    let mut stats = UnpackStats::default();
    for (i, layer) in layers.iter().enumerate() {
        apply_layer(root.as_fd(), i, layer, limits, &mut stats)?;
    }
    Ok(stats)
}

/// The decompressor chosen from the blob's first bytes.
enum Decoded<R: BufRead> {
    Gzip(MultiGzDecoder<R>),
    Plain(R),
}

impl<R: BufRead> Decoded<R> {
    fn inner(&self) -> &R {
        match self {
            Decoded::Gzip(d) => d.get_ref(),
            Decoded::Plain(r) => r,
        }
    }
    fn into_inner(self) -> R {
        match self {
            Decoded::Gzip(d) => d.into_inner(),
            Decoded::Plain(r) => r,
        }
    }
}

impl<R: BufRead> Read for Decoded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoded::Gzip(d) => d.read(buf),
            Decoded::Plain(r) => r.read(buf),
        }
    }
}

type Raw = BufReader<HashingReader<std::fs::File>>;

/// Which bound the guard tripped.
#[derive(Debug, Clone, Copy)]
enum Tripped {
    Bomb,
    TooLarge,
}

/// Counts and hashes the decompressed stream and enforces the size and ratio bounds.
struct Guard<'a> {
    inner: HashingReader<Decoded<Raw>>,
    limits: &'a Limits,
    before: u64,
    tripped: Option<Tripped>,
}

impl Read for Guard<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let out = self.inner.count();
        let compressed = self.inner.get_ref().inner().get_ref().count();
        if self.before + out > self.limits.max_unpacked_bytes {
            self.tripped = Some(Tripped::TooLarge);
        } else if out > self.limits.ratio_floor
            && out > self.limits.max_ratio.saturating_mul(compressed.max(1))
        {
            self.tripped = Some(Tripped::Bomb);
        }
        match self.tripped {
            Some(t) => Err(io::Error::other(format!("{t:?}"))),
            None => Ok(n),
        }
    }
}

fn apply_layer(
    root: std::os::fd::BorrowedFd<'_>,
    index: usize,
    layer: &LayerSource,
    limits: &Limits,
    stats: &mut UnpackStats,
) -> Result<(), UnpackError> {
    let io_err = |what| {
        move |source| UnpackError::Io {
            layer: index,
            what,
            path: layer.path.display().to_string(),
            source,
        }
    };
    let file = std::fs::File::open(&layer.path).map_err(io_err("opening"))?;
    let mut raw = BufReader::with_capacity(64 << 10, HashingReader::new(file));
    let head = raw.fill_buf().map_err(io_err("reading"))?;
    let decoded = if head.starts_with(&[0x1f, 0x8b]) {
        Decoded::Gzip(MultiGzDecoder::new(raw))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(UnpackError::Zstd { layer: index });
    } else {
        Decoded::Plain(raw)
    };
    let guard = Guard {
        inner: HashingReader::new(decoded),
        limits,
        before: stats.bytes,
        tripped: None,
    };
    let mut archive = tar::Archive::new(guard);
    let result = entry::apply_all(root, index, &mut archive, limits, stats);
    let mut guard = archive.into_inner();
    // Read what tar left (padding, trailing blocks) through the guard, so both digests
    // cover every byte and trailing data is bounded too.
    let drained = match result {
        Ok(()) if guard.tripped.is_none() => io::copy(&mut guard, &mut io::sink()).map(|_| ()),
        _ => Ok(()),
    };
    match guard.tripped {
        Some(Tripped::Bomb) => {
            return Err(UnpackError::Bomb {
                layer: index,
                ratio: limits.max_ratio,
            });
        }
        Some(Tripped::TooLarge) => return Err(UnpackError::TooLarge(limits.max_unpacked_bytes)),
        None => {}
    }
    if let Err(e) = result {
        // A short or altered blob is reported as such, not as the parse error it caused.
        return Err(blob_mismatch(index, layer).unwrap_or(e));
    }
    let tar_err = |source| UnpackError::Tar {
        layer: index,
        source,
    };
    drained.map_err(tar_err)?;
    let (diff_id, unpacked, decoded) = guard.inner.finish().map_err(tar_err)?;
    stats.bytes += unpacked;
    let (digest, size, _) = decoded
        .into_inner()
        .into_inner()
        .finish()
        .map_err(io_err("reading"))?;
    if let Some(expected) = layer.size.filter(|&e| e != size) {
        return Err(UnpackError::Size {
            layer: index,
            expected,
            actual: size,
        });
    }
    if let Some(expected) = layer.digest.clone().filter(|e| *e != digest) {
        return Err(UnpackError::Digest {
            layer: index,
            expected,
            actual: digest,
        });
    }
    if let Some(expected) = layer.diff_id.clone().filter(|e| *e != diff_id) {
        return Err(UnpackError::DiffId {
            layer: index,
            expected,
            actual: diff_id,
        });
    }
    Ok(())
}

/// The size or digest error of the blob file, if it is not what the manifest says.
fn blob_mismatch(index: usize, layer: &LayerSource) -> Option<UnpackError> {
    let actual = std::fs::metadata(&layer.path).map_or(0, |m| m.len());
    if let Some(expected) = layer.size.filter(|&e| e != actual) {
        return Some(UnpackError::Size {
            layer: index,
            expected,
            actual,
        });
    }
    let expected = layer.digest.clone()?;
    let file = std::fs::File::open(&layer.path).ok()?;
    let (actual, _, _) = HashingReader::new(file).finish().ok()?;
    (actual != expected).then_some(UnpackError::Digest {
        layer: index,
        expected,
        actual,
    })
}
