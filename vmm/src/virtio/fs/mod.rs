//! virtio-fs: the read-only file server (`vm_virtiofs`) behind a virtio device, one device per
//! host mount. The server is transport-free; this module carries its requests off the queues:
//! [`serve_chain`] answers one descriptor chain (its readable part copied out, at most
//! `vm_virtiofs::MAX_REQUEST_BYTES`; the reply written into its writable part, never more
//! than fits), for both transports:
//!
//! - [`vhost_user`]: `vm-virtiofs`, a vhost-user backend for QEMU's `vhost-user-fs-device`
//!   (the tcg driver), one process per mount, jailed by its launcher;
//! - [`FsDevice`], the in-process virtio-mmio device of `vm-vmm` (the kvm driver), with its
//!   DAX window.
//!
//! Queue 0 is the high-priority queue (the guest's `FORGET`s), queue 1 the request queue;
//! both are served the same way (a `FORGET` has no reply: its chain is used with length 0).

mod device;
pub mod persist;
pub mod vhost_user;

pub(crate) use device::QUEUE_SIZES;
pub use device::{FsDevice, MAX_TAG, SHM_CACHE, Window};

use vm_virtiofs::{MAX_REQUEST_BYTES, Outcome, Server};

use super::GuestMemoryMmap;
use super::queue::{self, Buf};

/// The descriptors each of `shares` file servers in this process may hold: the soft
/// `RLIMIT_NOFILE` is raised to the hard one (always allowed), the VMM keeps
/// [`vm_jail::NOFILE_LIMIT`] for itself (half the limit when that is lower: a process not
/// sized by the jail), and the shares split the rest. Each server caps its inodes to fit, so
/// a guest that looks up more names gets `ENFILE` from the server, never a VMM out of
/// descriptors (a jailed VMM's limit is sized for [`vm_virtiofs::fs::DEFAULT_MAX_INODES`]
/// a share by its driver).
pub fn descriptors_per_share(shares: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    let limit = if hard > soft && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        hard
    } else {
        soft
    };
    let own = vm_jail::NOFILE_LIMIT.min(limit / 2);
    limit.saturating_sub(own) / shares.max(1)
}

/// The virtio device id of a file system device.
pub const VIRTIO_ID_FS: u32 = 26;
/// The high-priority queue and one request queue.
pub const NUM_QUEUES: usize = 2;

/// The buffers one transport reuses for every request (a request and a reply at a time).
#[derive(Debug, Default)]
pub struct Scratch {
    input: Vec<u8>,
    out: Vec<u8>,
}

/// Answers the request in the chain `bufs` with `server`; returns the bytes written into the
/// chain's writable buffers (its used length) and what the request came to.
pub fn serve_chain(
    server: &mut Server,
    mem: &GuestMemoryMmap,
    bufs: &[Buf],
    scratch: &mut Scratch,
) -> (u32, Outcome) {
    let total = usize::try_from(queue::readable_len(bufs)).unwrap_or(usize::MAX);
    scratch.input.resize(total.min(MAX_REQUEST_BYTES), 0);
    let got = queue::read_chain(mem, bufs, 0, &mut scratch.input);
    scratch.input.truncate(got);
    let room = usize::try_from(queue::writable_len(bufs)).unwrap_or(usize::MAX);
    let outcome = server.handle(&scratch.input, total, room, &mut scratch.out);
    let written = match outcome {
        Outcome::Replied { .. } => queue::write_chain(mem, bufs, 0, &scratch.out),
        Outcome::NoReply => 0,
    };
    (u32::try_from(written).unwrap_or(u32::MAX), outcome)
}
