//! Dropping privileges for the work done on untrusted image content.
//!
//! Unpacking runs on its own thread whose capability sets (Linux keeps them per thread) are
//! cut down to what writing a tree with the image's owners needs: `CAP_CHOWN`,
//! `CAP_DAC_OVERRIDE`, `CAP_FOWNER`. Everything else (`CAP_SYS_ADMIN`, `CAP_MKNOD`,
//! `CAP_FSETID`, `CAP_SETUID`, …) is gone from that thread for good. `mkfs.erofs` runs as a
//! child whose bounding set keeps only `CAP_DAC_READ_SEARCH` (it must read every file) under
//! `PR_SET_NO_NEW_PRIVS`.
//!
//! Why a thread and not a child process for unpacking: the callers are multi-threaded tokio
//! programs, where a forked child may only make async-signal-safe calls until it execs (no
//! allocation, no tar or gzip code), and exec'ing a helper would need a second binary
//! installed next to every program that links this crate. The tree is written only through
//! the confined calls of [`crate::confined`], so the kernel, not these capabilities, is what
//! keeps writes inside it; dropping the rest limits what a bug in that code could reach.

use std::io;

const VERSION_3: u32 = 0x2008_0522;
pub(crate) const CAP_CHOWN: u32 = 0;
pub(crate) const CAP_DAC_OVERRIDE: u32 = 1;
pub(crate) const CAP_DAC_READ_SEARCH: u32 = 2;
pub(crate) const CAP_FOWNER: u32 = 3;

#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Cuts the calling thread's effective and permitted capabilities down to `keep` (intersected
/// with what it has) and clears its inheritable set.
pub(crate) fn restrict_thread(keep: &[u32]) -> io::Result<()> {
    let mut hdr = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut cur = [Data::default(); 2];
    // SAFETY: a v3 header and room for the two data words v3 uses.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, cur.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut new = [Data::default(); 2];
    for &c in keep {
        let (i, bit) = ((c / 32) as usize, 1u32 << (c % 32));
        new[i].permitted |= cur[i].permitted & bit;
        new[i].effective |= cur[i].permitted & bit;
    }
    // SAFETY: as above; the new sets are a subset of the current permitted set.
    if unsafe { libc::syscall(libc::SYS_capset, &hdr, new.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the child `cmd` spawns run under `no_new_privs` with a bounding set holding only
/// `keep` (set between its `fork` and `exec`).
pub(crate) fn bound_child(cmd: &mut std::process::Command, keep: u32) {
    // SAFETY: the hook only makes prctl calls through vm-sys (async-signal-safe) and
    // allocates nothing, as a forked child of a multi-threaded process must.
    unsafe { vm_sys::process::add_pre_exec(cmd, move || child_bounding(keep)) };
}

/// No new privileges, and a bounding set holding only `keep`. Only async-signal-safe calls
/// (`prctl`); a bounding-set drop this process may not make (it lacks `CAP_SETPCAP`, so it
/// holds nothing to drop) is ignored.
fn child_bounding(keep: u32) -> io::Result<()> {
    use vm_sys::process as sys;
    sys::set_no_new_privs()?;
    match sys::capbset_drop_all_but(Some(keep)) {
        Ok(()) | Err(vm_sys::Errno::EPERM) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
