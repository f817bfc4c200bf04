//! The image root: a read-only disk (erofs or ext4) under a tmpfs overlay becomes the root
//! every command runs in.
//!
//! [`enter`] mounts the disk read-only at [`LOWER`], a tmpfs at [`RW`] (capped at half the
//! guest's memory, which is the spec's memory) holding the overlay's upper and work
//! directories, and the overlay at [`NEW_ROOT`]; then it moves the early mounts (`/proc`,
//! `/sys` with its cgroup2, `/dev` with devpts and shm, `/tmp`, `/run`) into it and makes it
//! the agent's root (`MS_MOVE` onto `/` and `chroot`, as `switch_root` does). Every later
//! process, file operation and disk mount of the agent then happens inside the image root.
//! Writes land in the tmpfs upper and vanish with the VM; the disk itself is never written
//! (it is read-only on the host side too).

use std::ffi::CString;

use super::pid1::{Pid1Error, mount, mount_read_only, wait_for_disk};
use super::sys;
use vm_agent_protocol::config::RootDisk;

/// Where the image's filesystem is mounted read-only.
pub const LOWER: &str = "/.vm/lower";
/// The tmpfs holding the overlay's upper and work directories.
pub const RW: &str = "/.vm/rw";
/// The overlay that becomes `/`.
pub const NEW_ROOT: &str = "/.vm/root";
/// The early mounts carried into the new root.
pub const CARRIED: [&str; 5] = ["/proc", "/sys", "/dev", "/tmp", "/run"];

fn cstring(s: &str) -> Result<CString, Pid1Error> {
    CString::new(s).map_err(|_| Pid1Error::BadString(s.into()))
}

/// Move the mount at `from` (with everything under it) to `to`.
fn move_mount(from: &str, to: &str) -> Result<(), Pid1Error> {
    let (f, t) = (cstring(from)?, cstring(to)?);
    sys::fs::mount(&f, &t, None, libc::MS_MOVE, None).map_err(|source| Pid1Error::Mount {
        what: format!("move {from}"),
        target: to.into(),
        source,
    })
}

fn mkdir(path: &str) -> Result<(), Pid1Error> {
    std::fs::create_dir_all(path).map_err(|source| Pid1Error::Mkdir {
        path: path.into(),
        source,
    })
}

/// Build the overlay on the disk `root` and switch the agent into it.
pub fn enter(root: &RootDisk) -> Result<(), Pid1Error> {
    let dev = wait_for_disk(&root.id)?;
    mount_read_only(&dev, LOWER, root.fs, libc::MS_NODEV)?;
    mount("tmpfs", RW, "tmpfs", libc::MS_NODEV, "mode=0755,size=50%")?;
    let (upper, work) = (format!("{RW}/upper"), format!("{RW}/work"));
    mkdir(&upper)?;
    mkdir(&work)?;
    mount(
        "overlay",
        NEW_ROOT,
        "overlay",
        libc::MS_NODEV,
        &format!("lowerdir={LOWER},upperdir={upper},workdir={work}"),
    )?;
    for m in CARRIED {
        let target = format!("{NEW_ROOT}{m}");
        mkdir(&target)?;
        move_mount(m, &target)?;
    }
    std::env::set_current_dir(NEW_ROOT).map_err(|source| Pid1Error::Sys {
        op: "chdir to the new root",
        source,
    })?;
    move_mount(".", "/")?;
    std::os::unix::fs::chroot(".").map_err(|source| Pid1Error::Sys {
        op: "chroot",
        source,
    })?;
    std::env::set_current_dir("/").map_err(|source| Pid1Error::Sys {
        op: "chdir /",
        source,
    })
}
