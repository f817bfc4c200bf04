//! The guest kernel's random pool (PID 1 only: both requests need `CAP_SYS_ADMIN`): the host's
//! entropy mixed in and credited (`RNDADDENTROPY`), then the CRNG reseeded from the pool at
//! once (`RNDRESEEDCRNG`) rather than at its next scheduled reseed. A VM restored from a
//! snapshot starts with the pool and CRNG state the snapshot froze, shared by every VM
//! restored from it; after these two calls `getrandom(2)` and `/dev/urandom` answer from a key
//! derived with bytes only this restore has.

use std::io;
use std::os::fd::AsRawFd;

use super::check;

/// The bytes one [`add_entropy`] call carries (what the host's `Resume` sends).
pub use vm_agent_protocol::protocol::RESUME_ENTROPY_LEN as ENTROPY_BYTES;

/// `RNDADDENTROPY` = `_IOW('R', 0x03, int[2])` (`<linux/random.h>`; not in the libc crate).
const RNDADDENTROPY: libc::c_ulong = (1 << 30) | (8 << 16) | ((b'R' as libc::c_ulong) << 8) | 0x03;
/// `RNDRESEEDCRNG` = `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = ((b'R' as libc::c_ulong) << 8) | 0x07;

/// `struct rand_pool_info` with its buffer: bits credited, bytes, the bytes.
#[repr(C)]
struct PoolInfo {
    entropy_count: libc::c_int,
    buf_size: libc::c_int,
    buf: [u8; ENTROPY_BYTES],
}

fn urandom() -> io::Result<std::fs::File> {
    std::fs::File::open("/dev/urandom")
}

/// Mixes `bytes` into the kernel's input pool and credits them in full (8 bits a byte: they
/// come from the host's own CRNG).
pub fn add_entropy(bytes: &[u8; ENTROPY_BYTES]) -> io::Result<()> {
    let f = urandom()?;
    let info = PoolInfo {
        entropy_count: (ENTROPY_BYTES * 8) as libc::c_int,
        buf_size: ENTROPY_BYTES as libc::c_int,
        buf: *bytes,
    };
    // SAFETY: RNDADDENTROPY reads a rand_pool_info header and `buf_size` bytes after it from
    // the pointer: `info` is exactly that (repr(C), the buffer right after the two ints) and
    // outlives the call; the fd is an open random device.
    check(unsafe { libc::ioctl(f.as_raw_fd(), RNDADDENTROPY as _, &info as *const PoolInfo) })?;
    Ok(())
}

/// Reseeds the kernel's CRNG from its input pool now (`ENODATA` before the CRNG is ready).
pub fn reseed_crng() -> io::Result<()> {
    let f = urandom()?;
    // SAFETY: RNDRESEEDCRNG takes no argument; the fd is an open random device.
    check(unsafe { libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG as _, 0) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers of `<linux/random.h>` on x86_64, and the layout the kernel reads.
    #[test]
    fn request_numbers_and_layout_are_the_kernels() {
        assert_eq!(RNDADDENTROPY, 0x4008_5203);
        assert_eq!(RNDRESEEDCRNG, 0x5207);
        assert_eq!(std::mem::offset_of!(PoolInfo, buf), 8);
        assert_eq!(std::mem::size_of::<PoolInfo>(), 8 + ENTROPY_BYTES);
    }
}
