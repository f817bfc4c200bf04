//! The system calls of image unpacking, each behind a safe function whose doc states its
//! contract: every `unsafe` block of this crate is in these two modules.
//!
//! - [`caps`]: the unpacking thread's capability sets, and the bounding set of `mkfs.erofs`.
//! - [`confined`]: file operations confined to the tree being unpacked (`openat2`
//!   `RESOLVE_IN_ROOT`, calls that never follow a final symlink).

pub(crate) mod caps;
pub(crate) mod confined;
