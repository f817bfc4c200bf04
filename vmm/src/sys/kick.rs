//! Kicking vCPU threads out of `KVM_RUN`: the kick signal's handler, a vCPU whose `kvm_run`
//! the handler can reach while it runs, and the set of vCPU threads a stop signals.
//!
//! The handler stores `immediate_exit = 1` into the `kvm_run` of the thread it interrupts, so a
//! thread between its stop check and `KVM_RUN` returns at once instead of blocking (e.g. on a
//! HLT with interrupts disabled, which KVM handles in the kernel without any exit). Both
//! invariants the unsafe code needs are kept here, by construction: the handler only sees a
//! `kvm_run` while [`KickableVcpu::run_unless`] holds its vCPU, and a thread is signalled only
//! while [`KickableThreads::run_registered`] runs on it.

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

use kvm_bindings::kvm_run;
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_sync::Lock;

use super::current_thread;
use super::guest_memory::GuestMemoryMmap;

thread_local! {
    /// The `kvm_run` of the vCPU this thread is running now, or null.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let p = KVM_RUN.with(|c| c.get());
    if !p.is_null() {
        // SAFETY: a non-null pointer is published only by `run_unless`, for this thread's own
        // vCPU, while that call holds the vCPU (so its kvm_run mapping is live), and is
        // cleared before it returns; the field address is in bounds of the mapping.
        let field = unsafe { std::ptr::addr_of_mut!((*p).immediate_exit) };
        // SAFETY: `field` points into the live mapping; a byte store is async-signal-safe.
        unsafe { field.write_volatile(1) };
    }
}

/// Install the kick handler for `signal` (process-wide; installing it again is harmless).
pub fn install_kick_handler(signal: i32) -> Result<(), vmm_sys_util::errno::Error> {
    vmm_sys_util::signal::register_signal_handler(signal, on_kick)
}

/// Clears the published `kvm_run` when a run ends, however it ends.
struct Published;

impl Published {
    fn new(p: *mut kvm_run) -> Self {
        KVM_RUN.with(|c| c.set(p));
        Published
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        KVM_RUN.with(|c| c.set(std::ptr::null_mut()));
    }
}

/// A vCPU that the kick signal can interrupt while it runs, made by
/// [`super::GuestVm::create_vcpu`]: it keeps its VM's memory mapped until its fd is closed
/// (field order is drop order). Only its runs need `&mut`; every other vCPU ioctl goes
/// through [`KickableVcpu::fd`].
#[derive(Debug)]
pub struct KickableVcpu {
    fd: VcpuFd,
    _mem: GuestMemoryMmap,
    _windows: Vec<std::sync::Arc<super::window::DaxMapping>>,
}

impl KickableVcpu {
    pub(super) fn new(
        fd: VcpuFd,
        mem: GuestMemoryMmap,
        windows: Vec<std::sync::Arc<super::window::DaxMapping>>,
    ) -> Self {
        Self {
            fd,
            _mem: mem,
            _windows: windows,
        }
    }

    /// The vCPU, for every ioctl but `KVM_RUN`.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// Run the vCPU once unless `stop()` says the VM is stopping. A kick that arrives after
    /// `stop()` was checked makes `KVM_RUN` return at once (`EINTR`), so a stop is never
    /// missed; call [`KickableVcpu::clear_immediate_exit`] before the next run.
    pub fn run_unless(
        &mut self,
        stop: impl FnOnce() -> bool,
    ) -> Option<Result<VcpuExit<'_>, kvm_ioctls::Error>> {
        let _published = Published::new(self.fd.get_kvm_run());
        if stop() {
            return None;
        }
        Some(self.fd.run())
    }

    /// One `KVM_RUN` with `immediate_exit` set: KVM first completes an I/O or MMIO exit still
    /// in flight (the instruction that exited finishes only on the next run), then returns
    /// `EINTR` without running the guest. An exit instead means the completion needs the VMM
    /// again (e.g. a string I/O instruction): handle it and call this again. Call
    /// [`KickableVcpu::clear_immediate_exit`] afterwards.
    pub fn run_immediate_exit(&mut self) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
        self.fd.set_kvm_immediate_exit(1);
        self.fd.run()
    }

    /// Reset `immediate_exit` after a kicked run.
    pub fn clear_immediate_exit(&mut self) {
        self.fd.set_kvm_immediate_exit(0);
    }
}

/// The vCPU threads a stop signals, one slot per vCPU.
#[derive(Debug)]
pub struct KickableThreads {
    signal: i32,
    slots: Mutex<Vec<Option<libc::pthread_t>>>,
}

impl KickableThreads {
    /// `n` empty slots; kicks send `signal`.
    pub fn new(n: usize, signal: i32) -> Self {
        Self {
            signal,
            slots: Mutex::new(vec![None; n]),
        }
    }

    /// Number of slots (the VM's vCPUs).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether there are no slots.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Option<libc::pthread_t>>> {
        self.slots.locked()
    }

    /// Run `f` with the calling thread in slot `index` (out-of-range: not kickable), so that
    /// [`KickableThreads::kick_all`] reaches it; the slot is emptied when `f` returns or
    /// unwinds, before the thread can exit.
    pub fn run_registered<R>(&self, index: usize, f: impl FnOnce() -> R) -> R {
        struct Deregister<'a>(&'a KickableThreads, usize);
        impl Drop for Deregister<'_> {
            fn drop(&mut self) {
                if let Some(slot) = self.0.lock().get_mut(self.1) {
                    *slot = None;
                }
            }
        }
        if let Some(slot) = self.lock().get_mut(index) {
            *slot = Some(current_thread());
        }
        let _deregister = Deregister(self, index);
        f()
    }

    /// Send the kick signal to every registered thread.
    pub fn kick_all(&self) {
        for t in self.lock().iter().flatten() {
            // SAFETY: a slot holds a thread only while `run_registered` runs on it (emptied,
            // under this lock, before that thread can exit), so `t` is a live thread;
            // signalling it has no other precondition.
            unsafe { libc::pthread_kill(*t, self.signal) };
        }
    }

    /// Send the kick signal to the calling thread.
    pub fn kick_current(&self) {
        // SAFETY: the calling thread is alive.
        unsafe { libc::pthread_kill(current_thread(), self.signal) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read};
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn kicks_reach_a_thread_only_while_it_is_registered() {
        let signal = vmm_sys_util::signal::SIGRTMIN() + crate::control::KICK_SIGNAL_OFFSET;
        install_kick_handler(signal).unwrap();
        let threads = Arc::new(KickableThreads::new(1, signal));
        let (_keep, b) = UnixStream::pair().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = threads.clone();
        let h = std::thread::spawn(move || {
            t.run_registered(0, || {
                tx.send(()).unwrap();
                // Blocks (nothing is ever sent) until a kick interrupts it: the handler is
                // installed without SA_RESTART.
                (&b).read(&mut [0u8; 1]).map_err(|e| e.kind())
            })
        });
        rx.recv().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !h.is_finished() && Instant::now() < deadline {
            threads.kick_all();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(h.join().unwrap(), Err(ErrorKind::Interrupted));
        // The slot was emptied when the thread left run_registered: nothing left to signal.
        assert!(threads.lock().iter().all(Option::is_none));
        threads.kick_all();
        // Out-of-range slots are simply not kickable.
        assert_eq!(threads.run_registered(7, || 42), 42);
    }
}
