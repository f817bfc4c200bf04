//! virtio-rng: fills the guest's writable buffers with bytes from the host's getrandom(2),
//! at most [`MAX_BYTES_PER_REQUEST`] per request.

pub mod persist;

use vm_memory::{Bytes, GuestAddress};

use super::persist::DeviceKind;
use super::queue::Buf;
use super::worker::{Ctx, Handler, MakeHandler};
use super::{GuestMemoryMmap, VirtioDevice, VirtioError};

/// Most bytes served for one request (the rest of the guest's buffers stay untouched).
pub const MAX_BYTES_PER_REQUEST: u32 = 64 * 1024;
pub(crate) const QUEUE_SIZES: &[u16] = &[256];

/// The rng device model.
pub struct Rng;

impl Rng {
    /// A new rng device.
    pub fn new() -> Self {
        Rng
    }
}

impl Default for Rng {
    fn default() -> Self {
        Self::new()
    }
}

impl VirtioDevice for Rng {
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Rng(persist::RngIdentity)
    }
    fn activate(&mut self, _acked: u64) -> Result<MakeHandler, VirtioError> {
        Ok(Box::new(|| Box::new(RngHandler)))
    }
}

struct RngHandler;

/// Fill `len` bytes at `addr` with random bytes; returns how many were written.
fn fill(mem: &GuestMemoryMmap, addr: GuestAddress, len: u32) -> u32 {
    let mut chunk = [0u8; 4096];
    let mut done = 0u32;
    while done < len {
        let n = (len - done).min(chunk.len() as u32) as usize;
        let got = match crate::sys::getrandom(&mut chunk[..n]) {
            Ok(got) => got,
            Err(e) => {
                crate::warn_limited!(None, "virtio-rng: getrandom failed: {e}");
                break;
            }
        };
        let Some(dst) = addr.0.checked_add(u64::from(done)) else {
            break;
        };
        if mem.write_slice(&chunk[..got], GuestAddress(dst)).is_err() {
            break;
        }
        done += got as u32;
    }
    done
}

/// A request whose only buffer is this long makes the worker call `getppid`, which the
/// device threads' seccomp filter does not allow (builds with the `test-hooks` feature only:
/// the tests' way to prove a device thread's forbidden system call kills the VM process).
#[cfg(feature = "test-hooks")]
pub const TEST_FORBIDDEN_SYSCALL_LEN: u32 = 0x5ec0;

fn serve(bufs: &[Buf], mem: &GuestMemoryMmap) -> u32 {
    #[cfg(feature = "test-hooks")]
    if let [b] = bufs
        && b.len == TEST_FORBIDDEN_SYSCALL_LEN
    {
        // The device filter kills the process here.
        let _ = nix::unistd::getppid();
    }
    let mut total = 0u32;
    for b in bufs.iter().filter(|b| b.write) {
        let want = b.len.min(MAX_BYTES_PER_REQUEST - total);
        if want == 0 {
            break;
        }
        let got = fill(mem, b.addr, want);
        total += got;
        if got < want {
            break;
        }
    }
    total
}

impl Handler for RngHandler {
    fn queue_notify(&mut self, _index: usize, ctx: &mut Ctx<'_>) {
        ctx.serve_requests(0, "virtio-rng", |bufs, mem, _| serve(bufs, mem));
    }
}
