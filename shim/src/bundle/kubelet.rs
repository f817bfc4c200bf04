//! The writable bind mounts kubelet gives every container, without a writable host mount.
//!
//! - Small files kubelet and containerd's CRI keep for a pod: kubelet's `pods/<uid>/etc-hosts`
//!   and each container's termination message file `pods/<uid>/containers/<name>/<file>`
//!   (below its root directory, [`Owners::kubelet_root`]), and the CRI's `hosts`, `hostname`
//!   and `resolv.conf` in the pod's own sandbox directory. A writable bind is taken as one
//!   **by its source** ([`origin`]), whatever its destination, and only then: any other
//!   writable bind is refused, so a writable hostPath volume mounted at `/etc/hosts` or
//!   `/dev/termination-log` is refused like one mounted anywhere else. The file is opened
//!   beneath its owner's directory without following any symlink ([`open_owned`]), read (a
//!   regular file of at most [`MAX_FILE_BYTES`]) and *copied into the guest* before the
//!   container's process runs ([`GuestFile`]), with the host file's permission bits (kubelet
//!   makes the termination log 0666 for a container that is not root); the guest's copy is
//!   writable. A read-only bind at one of kubelet's destinations ([`KUBELET_FILES`]: the CRI
//!   sandbox container's `/etc/resolv.conf`) is copied too, without write bits, its final
//!   symlink not followed.
//! - A bind of a directory under kubelet's `…/volumes/kubernetes.io~empty-dir/…` (an
//!   `emptyDir` volume) and any `tmpfs` mount outside what the guest provides itself become a
//!   size-bounded tmpfs in the guest at the destination ([`GuestTmpfs`]); nothing reaches the
//!   host directory.
//! - containerd's CRI binds the pod sandbox's shm directory writable at `/dev/shm` in every
//!   container, read-only in the pod's sandbox container ([`is_sandbox_shm`]): the guest's own
//!   `/dev/shm` tmpfs stands in for it. The host's `/dev/shm` itself (a `hostIPC` pod) is
//!   refused like any writable bind.
//! - A termination message file: when the init process ends, the last
//!   [`MAX_TERMINATION_BYTES`] of the guest's copy are read back ([`TerminationTail`]), as
//!   kubelet reads its file, and written into kubelet's host file through the descriptor
//!   opened at create ([`write_termination_message`]): the shim's one host write.

use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

/// Where the files kubelet and containerd's CRI bind into a container come from: the only
/// sources a writable bind is copied in from (any other writable bind is refused).
#[derive(Debug, Clone, Copy)]
pub struct Owners<'a> {
    /// Kubelet's root directory (its `--root-dir`): each pod's files are under
    /// `pods/<pod uid>/` there.
    pub kubelet_root: &'a Path,
    /// The pod's UID (`io.kubernetes.cri.sandbox-uid`), when containerd names it: then only
    /// that pod's directory is kubelet's.
    pub pod_uid: Option<&'a str>,
    /// The pod's CRI sandbox id, when the bundle is a pod's: containerd's own files for the
    /// pod are in `…/io.containerd.grpc.v1.cri/sandboxes/<id>/`.
    pub sandbox_id: Option<&'a str>,
}

/// Whose file a writable bind's source is, by its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Kubelet's `pods/<uid>/etc-hosts`, or a container's termination message file
    /// `pods/<uid>/containers/<name>/<file>`: `rel` below `<kubelet root>/pods`.
    Kubelet { rel: PathBuf, termination: bool },
    /// containerd's CRI `hosts`, `hostname` or `resolv.conf` of this pod's sandbox: `name` in
    /// the sandbox directory `dir`.
    CriSandbox { dir: PathBuf, name: String },
}

/// The files containerd's CRI keeps for a pod in its sandbox directory.
const CRI_SANDBOX_FILES: &[&str] = &["hosts", "hostname", "resolv.conf"];
/// Where containerd's CRI keeps its pods' sandbox directories, below its root.
const CRI_ROOT_SANDBOXES: &str = "/io.containerd.grpc.v1.cri/sandboxes/";

/// Whether a path component is a plain name (not empty, `.`, `..` or holding a `/`).
fn plain(c: &str) -> bool {
    !c.is_empty() && c != "." && c != ".."
}

/// Whose file `source` is, if it is kubelet's or containerd's for this pod (see [`Origin`]);
/// judged on the path alone: the file is then opened beneath its owner's directory without
/// following any symlink ([`open_owned`]).
pub fn origin(source: &str, owners: &Owners<'_>) -> Option<Origin> {
    let pods = owners.kubelet_root.join("pods");
    if let Ok(rel) = Path::new(source).strip_prefix(&pods) {
        let parts: Vec<&str> = rel.to_str()?.split('/').collect();
        if !parts.iter().all(|c| plain(c)) || owners.pod_uid.is_some_and(|uid| uid != parts[0]) {
            return None;
        }
        return match parts[..] {
            [_, "etc-hosts"] => Some(Origin::Kubelet {
                rel: rel.to_path_buf(),
                termination: false,
            }),
            [_, "containers", _, _] => Some(Origin::Kubelet {
                rel: rel.to_path_buf(),
                termination: true,
            }),
            _ => None,
        };
    }
    let (root, rest) = source.split_once(CRI_ROOT_SANDBOXES)?;
    let (id, name) = rest.split_once('/')?;
    let ours = root.starts_with('/')
        && owners.sandbox_id == Some(id)
        && plain(id)
        && CRI_SANDBOX_FILES.contains(&name);
    ours.then(|| Origin::CriSandbox {
        dir: PathBuf::from(format!("{root}{CRI_ROOT_SANDBOXES}{id}")),
        name: name.to_string(),
    })
}

/// Opens the file of `origin` beneath its owner's directory (kubelet's `pods/`, the pod's
/// sandbox directory), resolved by the kernel with no symlink followed and nothing outside
/// it reached: `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`. A termination message file is opened
/// for writing too (the message is written back through this very descriptor).
pub fn open_owned(origin: &Origin, owners: &Owners<'_>) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    let (dir, rel, write) = match origin {
        Origin::Kubelet { rel, termination } => (
            owners.kubelet_root.join("pods"),
            rel.as_path(),
            *termination,
        ),
        Origin::CriSandbox { dir, name } => (dir.clone(), Path::new(name.as_str()), false),
    };
    let base = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_PATH)
        .open(&dir)?;
    let access = if write { libc::O_RDWR } else { libc::O_RDONLY };
    let fd = vm_sys::fs::openat2(
        base.as_fd(),
        rel.as_os_str(),
        access | libc::O_NONBLOCK | libc::O_NOCTTY,
        0,
        vm_sys::fs::RESOLVE_BENEATH | vm_sys::fs::RESOLVE_NO_SYMLINKS,
    )?;
    Ok(fd.into())
}

/// Kubelet's host file for a container's termination message, held open from create: the
/// message is written back through this descriptor, never by path.
#[derive(Debug, Clone)]
pub struct HostFile {
    /// The guest path the container writes its message to (the bind's destination).
    pub dest: String,
    /// The host path, for logs.
    pub path: PathBuf,
    file: std::sync::Arc<std::fs::File>,
}

impl PartialEq for HostFile {
    fn eq(&self, other: &Self) -> bool {
        self.dest == other.dest
            && self.path == other.path
            && std::sync::Arc::ptr_eq(&self.file, &other.file)
    }
}

impl Eq for HostFile {}

/// Writes a termination message into kubelet's host file, where kubelet reads it: its last
/// [`MAX_TERMINATION_BYTES`], replacing what the file held. Through the descriptor opened at
/// create ([`open_owned`]): whatever has been renamed or linked at the path since, only that
/// file is written.
pub fn write_termination_message(host: &HostFile, message: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let tail = &message[message.len().saturating_sub(MAX_TERMINATION_BYTES)..];
    host.file.set_len(0)?;
    host.file.write_all_at(tail, 0)
}

/// A kubelet file read for copying into the guest.
#[derive(Debug)]
pub struct HostRead {
    pub data: Vec<u8>,
    /// Its permission bits.
    pub mode: u32,
    /// Kept for a termination message file: where the message is written back.
    pub termination: Option<HostFile>,
}

/// Reads the host file of mount `field` (`mounts[i] (dest)`), a regular file of at most
/// [`MAX_FILE_BYTES`], with its permission bits. A file of `origin` is opened by
/// [`open_owned`]; without one (a read-only bind at a kubelet destination) `source` is opened
/// without following a final symlink. Neither blocks on a FIFO.
pub fn read_host_file(
    field: &str,
    source: &str,
    dest: &str,
    origin: Option<(&Origin, &Owners<'_>)>,
) -> Result<HostRead, ShimError> {
    let refused = |why: String| ShimError::Refused(format!("{field}: {why}"));
    let what = || format!("{field}: reading {source}");
    let f = match origin {
        Some((o, owners)) => open_owned(o, owners),
        None => std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(Path::new(source)),
    };
    let f = f.map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => refused(format!(
            "{source} is or passes through a symlink; kubelet's files are opened without \
             following one"
        )),
        _ => ShimError::io(what())(e),
    })?;
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
    (&f).take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|e| ShimError::io(what())(e))?;
    if data.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let termination = matches!(
        origin,
        Some((
            Origin::Kubelet {
                termination: true,
                ..
            },
            _
        ))
    )
    .then(|| HostFile {
        dest: dest.to_string(),
        path: source.into(),
        file: std::sync::Arc::new(f),
    });
    Ok(HostRead {
        data,
        mode: meta.permissions().mode() & 0o777,
        termination,
    })
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
