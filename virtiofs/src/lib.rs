//! `vm-virtiofs`: a read-only virtio-fs server, the one file server behind every host mount
//! (`-v HOST:GUEST:ro`), written for a hostile guest.
//!
//! It speaks the subset of FUSE a read-only tree needs ([`server`]: `INIT`, `LOOKUP`,
//! `FORGET`, `GETATTR`, `OPEN`, `READ`, `READDIRPLUS`, `READLINK`, `STATFS`, the xattr reads,
//! `SETUPMAPPING`, …); every write-like opcode is `EROFS` and an unknown one `ENOSYS`. It holds
//! the host tree only by descriptor ([`fs`]): each name is opened beneath its parent's
//! descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` and `O_NOFOLLOW`, never
//! from a path the guest sent, so a host symlink reaches the guest as a symlink and is never
//! followed on the host. Everything the guest can make it hold is capped ([`fs::Limits`]:
//! inodes, handles, `READ` and `READDIR` sizes), and the decoder ([`request`]) is pure and
//! fuzzed.
//!
//! The crate knows nothing of virtqueues: a transport copies a request's readable bytes out
//! (at most [`server::MAX_REQUEST_BYTES`]), calls [`Server::handle`], and copies the reply
//! into the writable ones. Two transports use it, as the vsock device has two: the in-process
//! virtio-mmio device of `vm-vmm` (kvm, with a DAX window: [`dax`]) and the vhost-user backend
//! `vm-virtiofs` for QEMU's `vhost-user-fs-device` (tcg). Both live in the `vmm` crate beside
//! the other devices; this crate has no dependency on KVM or virtio, which keeps it small
//! enough to read whole and cheap to fuzz.

pub mod abi;
pub mod dax;
pub mod fs;
pub mod request;
pub mod server;
mod sys;

pub use dax::DaxWindow;
pub use fs::{Fs, FsError, Limits};
pub use server::{ChunkMapping, MAX_REQUEST_BYTES, Outcome, Server, SessionState};
