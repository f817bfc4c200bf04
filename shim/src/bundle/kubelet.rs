//! The writable bind mounts kubelet gives every container, without a writable host mount.
//!
//! - Small files kubelet manages ([`KUBELET_FILES`]: `/etc/hosts`, `/etc/resolv.conf`,
//!   `/etc/hostname`, `/dev/termination-log`): the host file is read here (a regular file of
//!   at most [`MAX_FILE_BYTES`]) and *copied into the guest* before the container's process
//!   runs ([`GuestFile`]), with the host file's permission bits (kubelet makes the
//!   termination log 0666 for a container that is not root); the guest's copy is writable,
//!   the host file is never written.
//! - A bind of a directory under kubelet's `…/volumes/kubernetes.io~empty-dir/…` (an
//!   `emptyDir` volume) and any `tmpfs` mount outside what the guest provides itself become a
//!   size-bounded tmpfs in the guest at the destination ([`GuestTmpfs`]); nothing reaches the
//!   host directory.
//! - containerd's CRI binds the pod sandbox's shm directory writable at `/dev/shm` in every
//!   container, read-only in the pod's sandbox container ([`is_sandbox_shm`]): the guest's own
//!   `/dev/shm` tmpfs stands in for it. The sandbox container's read-only `/etc/resolv.conf`
//!   is copied in like kubelet's files, without write bits. The
//!   host's `/dev/shm` itself (a `hostIPC` pod) is refused like any writable bind.
//! - `/dev/termination-log`: when the init process ends, the last [`MAX_TERMINATION_BYTES`] of
//!   the guest's copy are read back ([`TerminationTail`]), as kubelet reads its file.

use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::error::ShimError;

/// The files kubelet bind-mounts writable into every container, copied in instead.
pub const KUBELET_FILES: &[&str] = &[
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/hostname",
    TERMINATION_LOG,
];

/// Where a container writes its termination message (the pod's `terminationMessagePath`
/// default).
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// Cap on a kubelet file copied in; a larger one is refused naming its mount.
pub const MAX_FILE_BYTES: u64 = 64 * 1024;

/// What is kept of a termination message: its last 4 KiB, as kubelet keeps.
pub const MAX_TERMINATION_BYTES: usize = 4096;

/// The most of the guest's termination log that is streamed to find its tail; a larger file
/// is not read at all.
pub const MAX_TERMINATION_READ: u64 = 1 << 20;

/// Size of each guest tmpfs (an `emptyDir` or a bundle's `tmpfs` mount), unless the mount's
/// `size=` option asks for less.
pub const TMPFS_BYTES: u64 = 64 << 20;

/// The path segment of kubelet's `emptyDir` volumes on the host.
const EMPTY_DIR: &str = "/volumes/kubernetes.io~empty-dir/";

/// Destinations where the guest has its own tmpfs (or `/dev`): a bundle's `tmpfs` there is
/// ignored, as before.
pub const GUEST_TMPFS_DESTINATIONS: &[&str] = &["/dev", "/dev/shm", "/tmp", "/run"];

/// A host file copied into the guest at create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestFile {
    /// The absolute guest path.
    pub dest: String,
    pub data: Vec<u8>,
    /// The host file's permission bits (`0o777` at most).
    pub mode: u32,
}

/// A tmpfs mounted in the guest at create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestTmpfs {
    /// The absolute guest path.
    pub dest: String,
    pub size_bytes: u64,
    /// The `emptyDir`'s host directory (`None` for a `tmpfs` mount): the containers of one
    /// pod that bind the same one share one guest tmpfs.
    pub shared_as: Option<String>,
}

/// Where containerd's CRI keeps each pod sandbox's state, the sandbox's `shm` directory in it.
const CRI_SANDBOXES: &str = "/io.containerd.grpc.v1.cri/sandboxes/";

/// Whether a bind of `source` at `dest` is the pod sandbox's shm that containerd's CRI gives
/// every container (`<state>/io.containerd.grpc.v1.cri/sandboxes/<id>/shm` at `/dev/shm`).
/// Nothing of the host is mounted for it: the guest has a `/dev/shm` tmpfs of its own.
pub fn is_sandbox_shm(source: &str, dest: &str) -> bool {
    let Some((_, rest)) = source.split_once(CRI_SANDBOXES) else {
        return false;
    };
    dest == "/dev/shm"
        && matches!(rest.split('/').collect::<Vec<_>>()[..], [id, "shm"] if !id.is_empty() && id != "." && id != "..")
}

/// Whether a bind of `source` is an `emptyDir` volume.
pub fn is_empty_dir(source: &str) -> bool {
    source.contains(EMPTY_DIR)
}

/// The tmpfs size for a mount with `options`: its `size=` (bytes, or with a `k`/`m`/`g`
/// suffix) when it is smaller than [`TMPFS_BYTES`], else [`TMPFS_BYTES`].
pub fn tmpfs_size(options: &[String]) -> u64 {
    let asked = options
        .iter()
        .filter_map(|o| o.strip_prefix("size="))
        .filter_map(parse_size)
        .next_back();
    asked.map_or(TMPFS_BYTES, |s| s.clamp(4096, TMPFS_BYTES))
}

fn parse_size(s: &str) -> Option<u64> {
    let (num, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// A host file kubelet bind-mounts, as it was when the bundle was read: its path and identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFile {
    pub path: std::path::PathBuf,
    pub dev: u64,
    pub ino: u64,
}

/// Writes a termination message into kubelet's host file (the source of the container's
/// `/dev/termination-log` bind), where kubelet reads it: its last [`MAX_TERMINATION_BYTES`],
/// replacing what the file held. Only the very file read at create: opened without following a
/// symlink and without blocking, written only if it is still a regular file with the same
/// device and inode; never created.
pub fn write_termination_message(host: &HostFile, message: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&host.path)?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.dev() != host.dev || meta.ino() != host.ino {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not the regular file kubelet mounted at create",
        ));
    }
    f.set_len(0)?;
    (&f).write_all(&message[message.len().saturating_sub(MAX_TERMINATION_BYTES)..])
}

/// Reads the host file of kubelet mount `field` (`mounts[i] (dest)`): a regular file of at
/// most [`MAX_FILE_BYTES`], opened without blocking on a FIFO; with its permission bits and
/// identity.
pub fn read_host_file(field: &str, source: &str) -> Result<(Vec<u8>, u32, HostFile), ShimError> {
    let refused = |why: String| ShimError::Refused(format!("{field}: {why}"));
    let what = || format!("{field}: reading {source}");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(Path::new(source))
        .map_err(|e| ShimError::io(what())(e))?;
    let meta = f.metadata().map_err(|e| ShimError::io(what())(e))?;
    if !meta.is_file() {
        return Err(refused(format!(
            "{source} is not a regular file; only a file is copied into the guest"
        )));
    }
    let too_large = || {
        refused(format!(
            "{source} is larger than {} KiB; kubelet's files are copied into the guest only up to that",
            MAX_FILE_BYTES / 1024
        ))
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let mut data = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|e| ShimError::io(what())(e))?;
    if data.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    use std::os::unix::fs::MetadataExt;
    let host = HostFile {
        path: source.into(),
        dev: meta.dev(),
        ino: meta.ino(),
    };
    Ok((data, meta.permissions().mode() & 0o777, host))
}

/// Keeps the last [`MAX_TERMINATION_BYTES`] of what is streamed into it.
#[derive(Debug, Default)]
pub struct TerminationTail {
    buf: Vec<u8>,
    /// Bytes streamed in all.
    pub total: u64,
}

impl TerminationTail {
    /// Appends `data`, dropping what falls out of the tail.
    pub fn push(&mut self, data: &[u8]) {
        self.total = self.total.saturating_add(data.len() as u64);
        let keep = &data[data.len().saturating_sub(MAX_TERMINATION_BYTES)..];
        self.buf.extend_from_slice(keep);
        let excess = self.buf.len().saturating_sub(MAX_TERMINATION_BYTES);
        self.buf.drain(..excess);
    }

    /// The tail's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The message: the tail, with invalid UTF-8 replaced.
    pub fn message(&self) -> String {
        String::from_utf8_lossy(&self.buf).into_owned()
    }

    /// Whether more was written than kept.
    pub fn truncated(&self) -> bool {
        self.total > self.buf.len() as u64
    }
}

impl vm_sandbox::agent::ChunkSink for TerminationTail {
    async fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.push(data);
        Ok(())
    }
}
