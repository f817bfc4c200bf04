//! PID-1 duties in a guest: early mounts, console, loopback, hostname, self-protection from the
//! OOM killer and from guest code ([`harden`]), read-only disks, and power-off. Every step logs
//! and carries on where it can; nothing here panics (a PID 1 exit panics the kernel), and
//! [`power_off`] never returns.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::sys;
use super::sys::fs::StdFd;
use vm_agent_protocol::config::{DiskFs, DiskMount};

/// PID-1 errors.
#[derive(Debug, thiserror::Error)]
pub enum Pid1Error {
    #[error("mount {what} on {target} failed")]
    Mount {
        what: String,
        target: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create {path}")]
    Mkdir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{op} failed")]
    Sys {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("no block device with serial {0:?}")]
    NoDisk(String),
    #[error("invalid string {0:?}")]
    BadString(String),
}

fn cstr(s: &str) -> Result<CString, Pid1Error> {
    CString::new(s).map_err(|_| Pid1Error::BadString(s.into()))
}

/// The `Sys` error of `op` (for `map_err`).
fn op(op: &'static str) -> impl FnOnce(std::io::Error) -> Pid1Error {
    move |source| Pid1Error::Sys { op, source }
}

/// `mount(2)`; `EBUSY` (already mounted) counts as success.
pub fn mount(
    src: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), Pid1Error> {
    std::fs::create_dir_all(target).map_err(|source| Pid1Error::Mkdir {
        path: target.into(),
        source,
    })?;
    let (s, t, f, d) = (cstr(src)?, cstr(target)?, cstr(fstype)?, cstr(data)?);
    if let Err(e) = sys::fs::mount(&s, &t, Some(&f), flags, Some(&d))
        && e.raw_os_error() != Some(libc::EBUSY)
    {
        return Err(Pid1Error::Mount {
            what: format!("{fstype} ({src})"),
            target: target.into(),
            source: e,
        });
    }
    Ok(())
}

/// Remove every inherited environment variable.
///
/// # Safety
///
/// The process must have a single thread (no other thread may read or write the environment
/// meanwhile): call it first thing in `main`. No safe wrapper can check that, so this stays
/// an `unsafe fn` outside [`sys`].
pub unsafe fn clear_env() {
    for (k, _) in std::env::vars_os() {
        // SAFETY: the caller guarantees a single-threaded process.
        unsafe { std::env::remove_var(k) };
    }
}

/// Mount proc, sys, devtmpfs, devpts, /dev/shm, /tmp, /run and cgroup2; create /dev links.
/// Returns the failures (each already logged); the agent carries on without them.
pub fn early_mounts() -> Vec<Pid1Error> {
    let nx = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    let steps: [(&str, &str, &str, libc::c_ulong, &str); 8] = [
        ("proc", "/proc", "proc", nx, ""),
        ("sysfs", "/sys", "sysfs", nx, ""),
        ("devtmpfs", "/dev", "devtmpfs", libc::MS_NOSUID, "mode=0755"),
        (
            "devpts",
            "/dev/pts",
            "devpts",
            libc::MS_NOSUID | libc::MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=0620",
        ),
        (
            "tmpfs",
            "/dev/shm",
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            "mode=1777",
        ),
        (
            "tmpfs",
            "/tmp",
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            "mode=1777",
        ),
        (
            "tmpfs",
            "/run",
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            "mode=0755",
        ),
        ("cgroup2", "/sys/fs/cgroup", "cgroup2", nx, ""),
    ];
    let mut errs = Vec::new();
    for (src, target, fs, flags, data) in steps {
        if let Err(e) = mount(src, target, fs, flags, data) {
            tracing::warn!(error = %vm_error_chain::error_chain(&e), "early mount");
            errs.push(e);
        }
    }
    for (link, to) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
        ("/dev/ptmx", "pts/ptmx"),
    ] {
        if std::fs::symlink_metadata(link).is_err() {
            let _ = std::os::unix::fs::symlink(to, link);
        }
    }
    errs
}

/// Point stdin at /dev/null and stdout/stderr at /dev/console.
pub fn console_to_stdio() {
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    let targets = [
        ("/dev/null", &[StdFd::In][..]),
        ("/dev/console", &[StdFd::Out, StdFd::Err][..]),
    ];
    for (path, fds) in targets {
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(path)
        else {
            continue;
        };
        for &to in fds {
            let _ = sys::fs::replace_std_fd(f.as_fd(), to);
        }
    }
}

/// Print one line to the console (stdout, which is /dev/console as PID 1).
pub fn console_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Bring `lo` up with 127.0.0.1/8.
pub fn loopback_up() -> Result<(), Pid1Error> {
    use std::os::fd::AsFd;
    let sock = sys::net::inet_socket().map_err(op("socket"))?;
    let sock = sock.as_fd();
    sys::net::set_if_addr(sock, "lo", [127, 0, 0, 1]).map_err(op("SIOCSIFADDR"))?;
    sys::net::set_if_netmask(sock, "lo", [255, 0, 0, 0]).map_err(op("SIOCSIFNETMASK"))?;
    sys::net::set_if_up(sock, "lo").map_err(op("SIOCSIFFLAGS"))
}

pub fn set_hostname(name: &str) -> Result<(), Pid1Error> {
    sys::proc::set_hostname(name).map_err(op("sethostname"))
}

/// `oom_score_adj = -1000` for the agent (children reset theirs to 0).
pub fn protect_from_oom() -> Result<(), Pid1Error> {
    std::fs::write("/proc/self/oom_score_adj", "-1000").map_err(|source| Pid1Error::Sys {
        op: "oom_score_adj",
        source,
    })
}

/// Descriptors the agent and every command it starts may hold (soft and hard limit). The
/// kernel's default for PID 1 (1024) is less than the agent's own connections need: each
/// forward holds two (its vsock and its TCP connection), and a host may keep 640 open
/// (`slots`); a server in the guest taking hundreds of connections needs as many. Descriptors
/// cost kernel memory only when used, and that of a command is charged to its cgroup.
pub const NOFILE: u64 = 65536;

/// Raises `RLIMIT_NOFILE` to [`NOFILE`] (children inherit it); where the hard limit cannot be
/// raised (the host test agent, unprivileged), the soft limit to the hard one.
pub fn raise_nofile() -> Result<(), Pid1Error> {
    if sys::proc::set_nofile(NOFILE, NOFILE).is_ok() {
        return Ok(());
    }
    let (_, hard) = sys::proc::nofile().map_err(op("getrlimit(RLIMIT_NOFILE)"))?;
    sys::proc::set_nofile(hard, hard).map_err(op("setrlimit(RLIMIT_NOFILE)"))
}

/// Capabilities no command the agent runs may hold: reading another process's memory
/// (`/proc/1/mem`, `process_vm_readv`, `/proc/1/fd`) and raw device/port access.
const DROPPED_CAPS: [(libc::c_ulong, &str); 2] = [(19, "CAP_SYS_PTRACE"), (17, "CAP_SYS_RAWIO")];

/// Keep guest code away from the agent's memory (where its token lives): the agent becomes
/// non-dumpable (so only `CAP_SYS_PTRACE` could open `/proc/1/mem`, `/proc/1/environ` or its
/// fds) and drops [`DROPPED_CAPS`] from its capability bounding set, which every child inherits,
/// so no command (root included) can regain them through `execve`. Must run before any thread
/// starts: the bounding set is per thread.
pub fn harden() -> Result<(), Pid1Error> {
    sys::proc::set_not_dumpable().map_err(op("PR_SET_DUMPABLE"))?;
    for (cap, name) in DROPPED_CAPS {
        sys::proc::drop_bounding_cap(cap).map_err(op(name))?;
    }
    Ok(())
}

/// `/dev/<name>` of the virtio block device whose serial is `id`.
pub fn find_disk(sys_block: &Path, id: &str) -> Option<String> {
    let dir = std::fs::read_dir(sys_block).ok()?;
    for e in dir.flatten() {
        let name = e.file_name();
        if !name.as_bytes().starts_with(b"vd") {
            continue;
        }
        let serial = std::fs::read(e.path().join("serial")).unwrap_or_default();
        let serial = String::from_utf8_lossy(&serial);
        if serial.trim_end_matches(['\n', '\0']) == id {
            return Some(format!("/dev/{}", name.to_string_lossy()));
        }
    }
    None
}

fn set_block_ro(dev: &str) -> Result<(), Pid1Error> {
    let f = std::fs::File::open(dev).map_err(op("open block device"))?;
    sys::fs::set_block_read_only(std::os::fd::AsFd::as_fd(&f)).map_err(op("BLKROSET"))
}

/// `/dev/<name>` of the disk with serial `id`, waiting up to 5 s for it to appear.
pub fn wait_for_disk(id: &str) -> Result<String, Pid1Error> {
    for _ in 0..50 {
        if let Some(dev) = find_disk(Path::new("/sys/block"), id) {
            return Ok(dev);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Pid1Error::NoDisk(id.into()))
}

/// Mount the filesystem on `dev` read-only at `target` (erofs, or ext4 without replaying
/// its journal, which would write).
pub fn mount_read_only(
    dev: &str,
    target: &str,
    fs: DiskFs,
    flags: libc::c_ulong,
) -> Result<(), Pid1Error> {
    let flags = flags | libc::MS_RDONLY;
    match fs {
        DiskFs::Erofs => mount(dev, target, "erofs", flags, ""),
        DiskFs::Ext4 => mount(dev, target, "ext4", flags, "noload"),
        DiskFs::Raw => Err(Pid1Error::BadString(format!(
            "{dev}: a raw disk has no filesystem to mount"
        ))),
    }
}

/// Mount one read-only disk (waiting briefly for its device to appear).
pub fn mount_disk(d: &DiskMount) -> Result<(), Pid1Error> {
    let dev = wait_for_disk(&d.id)?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    match d.fs {
        DiskFs::Erofs | DiskFs::Ext4 => mount_read_only(&dev, &d.guest_path, d.fs, flags),
        DiskFs::Raw => {
            set_block_ro(&dev)?;
            let p = PathBuf::from(&d.guest_path);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(|source| Pid1Error::Mkdir {
                    path: parent.display().to_string(),
                    source,
                })?;
            }
            std::os::unix::fs::symlink(&dev, &p).map_err(|source| Pid1Error::Sys {
                op: "symlink",
                source,
            })
        }
    }
}

/// Sync and reboot (which ends the VM); never returns.
pub fn power_off() -> ! {
    let e = sys::proc::reboot();
    tracing::error!("reboot failed: {e}");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
