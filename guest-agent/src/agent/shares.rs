//! The host mounts: each is a read-only virtio-fs share the agent mounts by its tag, at start
//! (inside the image root when there is one).
//!
//! A directory share is mounted at its guest path. A file share is a directory the host's
//! server made up holding only that file: it is mounted under [`STAGE`] and its one entry is
//! bound onto an empty file made at the guest path, so the guest sees a regular file with the
//! host's size, bytes and mode there. Every share is `ro,nosuid,nodev`, plus `dax=always`
//! when its device has a DAX window (kvm).

use std::path::Path;
use std::time::Duration;

use super::pid1::{Pid1Error, mount};
use super::sys;
use vm_agent_protocol::config::{ShareKind, ShareMount};

/// Where file shares are mounted before their file is bound at the guest path.
pub const STAGE: &str = "/run/vm-shares";

/// How long a tag may take to appear (the device is probed before PID 1 starts; this covers a
/// slow probe).
const TAG_WAIT: Duration = Duration::from_secs(5);

const FLAGS: libc::c_ulong = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;

/// Mounts `s` (see the module docs).
pub fn mount_share(s: &ShareMount) -> Result<(), Pid1Error> {
    let at = match s.kind {
        ShareKind::Dir => s.guest_path.clone(),
        ShareKind::File => format!("{STAGE}/{}", s.tag),
    };
    let data = if s.dax { "dax=always" } else { "" };
    let start = std::time::Instant::now();
    loop {
        match mount(&s.tag, &at, "virtiofs", FLAGS, data) {
            Ok(()) => break,
            Err(Pid1Error::Mount { source, .. })
                if source.raw_os_error() == Some(libc::ENOENT) && start.elapsed() < TAG_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
    if s.kind == ShareKind::File {
        bind_single_file(&s.tag, Path::new(&at), &s.guest_path)?;
    }
    Ok(())
}

/// Binds the one regular file in `dir` onto `target` (made as an empty file), read-only.
fn bind_single_file(tag: &str, dir: &Path, target: &str) -> Result<(), Pid1Error> {
    let entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|source| Pid1Error::Sys {
            op: "reading a file share",
            source,
        })?
        .take(2)
        .collect::<Result<_, _>>()
        .map_err(|source| Pid1Error::Sys {
            op: "reading a file share",
            source,
        })?;
    let [entry] = entries.as_slice() else {
        return Err(Pid1Error::BadString(format!(
            "share {tag}: expected one file, found {} entries",
            entries.len()
        )));
    };
    let target_path = Path::new(target);
    if let Some(parent) = target_path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| Pid1Error::Mkdir {
            path: parent.display().to_string(),
            source,
        })?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(target_path)
        .map_err(|source| Pid1Error::Mkdir {
            path: target.into(),
            source,
        })?;
    let src = entry.path();
    let cstr = |p: &str| std::ffi::CString::new(p).map_err(|_| Pid1Error::BadString(p.into()));
    let (s, t) = (cstr(&src.to_string_lossy())?, cstr(target)?);
    let fail = |what: &str| {
        let what = format!("{what} ({})", src.display());
        move |source| Pid1Error::Mount {
            what,
            target: target.into(),
            source,
        }
    };
    sys::fs::mount(&s, &t, None, libc::MS_BIND, None).map_err(fail("bind"))?;
    sys::fs::mount(&s, &t, None, libc::MS_BIND | libc::MS_REMOUNT | FLAGS, None)
        .map_err(fail("read-only remount of the bind"))
}
