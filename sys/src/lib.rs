//! `vm-sys`: safe wrappers over the raw system calls the host crates share (as crosvm's `base`).
//! Each `unsafe` block is here, behind a function whose doc states its contract, with a
//! `// SAFETY:` line saying why the call is sound.
//!
//! What this crate owns:
//! - [`process`]: process-level calls of the jail (`vm-jail`) and of other hardened launches
//!   (`vm-oci`'s `mkfs.erofs`): descriptors, the reaper's pidfd, the capability bounding set
//!   (`PR_CAPBSET_DROP`, wrapped once here), `no_new_privs`, `_exit`, `fork` and `pre_exec`
//!   hooks. None allocates or takes a lock, so each is safe in a forked child of a
//!   multi-threaded parent.
//! - [`fs`]: `openat2(2)` with resolve flags, for every host crate that opens a path someone
//!   else controls (`vm-oci`'s unpacking, the shim's kubelet files).
//! - [`private`]: files only their owner can change, opened and checked by descriptor (a
//!   snapshot directory before a restore reads it).
//! - [`control`]: process control of the drivers, the API, the CLI and the shim: signals,
//!   process groups and sessions, their usage, the descriptor limit, unreaped exits.
//! - [`term`]: the terminal of `vm exec -t` (window size, raw mode restored on drop).
//!
//! What it does not own: calls only one crate makes stay in that crate's `sys` module (the
//! VMM's vCPU kick and guest memory in `vmm::sys`, the final-component file operations of
//! `vm-oci`'s unpacking).
//!
//! The guest agent (`guest-agent`, `vm-agent`) keeps its own `sys` module, `prctl` wrapper
//! included, and does not depend on this crate: it is a static binary built for the guest
//! image (`images/build.sh`: `-C target-feature=+crt-static`, its own target dir), where
//! depending on a host crate would link host-only code (and `nix`) into the guest and make every
//! change here a reason to rebuild the image. The guest side and the host side share the wire
//! protocol, not system-call wrappers.

pub mod control;
pub mod fs;
pub mod private;
pub mod process;
pub mod term;

/// The error of every call here: the `errno` the kernel answered.
pub use nix::errno::Errno;
