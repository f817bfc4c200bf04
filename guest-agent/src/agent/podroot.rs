//! `PodMount`: the filesystems of a pod member (one container of a pod whose VM holds them
//! all), set up by the agent itself.
//!
//! The host declares spare raw disks when it boots a pod's VM and fills one with a
//! container's erofs image when that container is created; the agent then builds the
//! container's root from it ([`PodMount::Root`]: the erofs read-only under a tmpfs overlay,
//! with `/proc`, a read-only `/sys` and a `/dev` of its own), mounts its read-only volumes
//! ([`PodMount::Volume`]), binds the pod's shared `emptyDir` tmpfs into it
//! ([`PodMount::Bind`]), and takes it all down when the container is deleted
//! ([`PodMount::Unmount`]). Before mounting a disk the agent drops its cached blocks
//! (`BLKFLSBUF`): the kernel read the still empty disk at boot (the partition scan).
//!
//! Each member's processes share one cgroup of its own (`work/pod-c<N>`) with the container's
//! memory, pids and CPU limits, so one container of the pod cannot take the others' memory.
//!
//! Every path is inside the guest, which is the boundary: a member can reach the pod VM's
//! other members as processes of one pod can on any node. Only an agent that is PID 1 mounts.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use super::Agent;
use super::cgroup::GroupLimits;
use super::sys::fs as sys;
use vm_agent_protocol::protocol::{
    ErrorKind, MAX_POD_UPPER_BYTES, MIN_POD_MEMORY_BYTES, POD_CPU_PERIOD_MICROS,
    POD_CPU_QUOTA_MICROS, PodMount,
};

/// The device nodes a member's `/dev` gets, bound from the guest's.
const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// The smallest member upper (one page).
const MIN_UPPER_BYTES: u64 = 4096;

/// Why a pod mount step failed.
#[derive(Debug, thiserror::Error)]
pub enum PodMountError {
    #[error("pod mounts need the agent to be PID 1")]
    NotPid1,
    #[error("{0:?} is not an absolute guest path below / without ..")]
    BadPath(String),
    #[error("{0:?} is not a block device")]
    NotADisk(String),
    #[error("upper size {0} is not in {MIN_UPPER_BYTES}..={MAX_POD_UPPER_BYTES} bytes")]
    Size(u64),
    #[error("memory limit {0} is below {MIN_POD_MEMORY_BYTES} bytes")]
    Memory(u64),
    #[error("cpu quota {0} µs per period {1} µs is out of bounds")]
    Cpu(u64, u64),
    #[error("{what} {path:?}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl PodMountError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            PodMountError::NotPid1 => ErrorKind::Unsupported,
            PodMountError::BadPath(_)
            | PodMountError::NotADisk(_)
            | PodMountError::Size(_)
            | PodMountError::Memory(_)
            | PodMountError::Cpu(..) => ErrorKind::BadRequest,
            PodMountError::Io { .. } => ErrorKind::Io,
        }
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PodMountError {
    let path = path.display().to_string();
    move |source| PodMountError::Io { what, path, source }
}

/// `path` if it is absolute, not `/`, and has no `..` or empty component.
fn checked(path: &str) -> Result<PathBuf, PodMountError> {
    let ok = path.starts_with('/')
        && path.len() > 1
        && !path.contains('\0')
        && path[1..].split('/').all(|c| !c.is_empty() && c != "..");
    match ok {
        true => Ok(PathBuf::from(path)),
        false => Err(PodMountError::BadPath(path.into())),
    }
}

fn c(path: &Path) -> Result<CString, PodMountError> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| PodMountError::BadPath(path.display().to_string()))
}

fn mkdir(path: &Path) -> Result<(), PodMountError> {
    std::fs::create_dir_all(path).map_err(io("mkdir", path))
}

/// `mount(2)` of `src` at `target` (created), strict: an error is an error.
fn mount(
    src: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), PodMountError> {
    mkdir(target)?;
    let cs = |s: &str| CString::new(s).map_err(|_| PodMountError::BadPath(s.into()));
    let (s, t) = (cs(src)?, c(target)?);
    let (f, d) = (fstype.map(cs).transpose()?, data.map(cs).transpose()?);
    sys::mount(&s, &t, f.as_deref(), flags, d.as_deref()).map_err(io("mount", target))
}

/// Binds the existing guest file or directory `src` at `target` (created as its kind).
fn bind(src: &Path, target: &Path, recursive: bool) -> Result<(), PodMountError> {
    if src.is_dir() {
        mkdir(target)?;
    } else {
        std::fs::File::create(target).map_err(io("creating", target))?;
    }
    let flags = libc::MS_BIND | if recursive { libc::MS_REC } else { 0 };
    sys::mount(&c(src)?, &c(target)?, None, flags, None).map_err(io("bind", target))
}

/// The block device `device` names (the raw disk's link), with its cached blocks dropped.
fn fresh_disk(device: &str) -> Result<String, PodMountError> {
    let path = checked(device)?;
    let dev = std::fs::canonicalize(&path).map_err(io("resolving", &path))?;
    let file = std::fs::File::open(&dev).map_err(io("opening", &dev))?;
    let meta = file.metadata().map_err(io("stat", &dev))?;
    if !meta.file_type().is_block_device() {
        return Err(PodMountError::NotADisk(device.into()));
    }
    sys::flush_block_buffers(file.as_fd()).map_err(io("BLKFLSBUF", &dev))?;
    Ok(dev.display().to_string())
}

/// The erofs on `device`, read-only at `target`.
fn erofs(device: &str, target: &Path) -> Result<(), PodMountError> {
    let dev = fresh_disk(device)?;
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    mount(&dev, target, Some("erofs"), flags, None)
}

/// A member's `/dev` at `dev`: a small `nodev` tmpfs with the standard nodes bound from the
/// guest's (each bind a mount of its own, where its node opens), the guest's `/dev/pts`, the
/// pod's `/dev/shm`, and the usual links. A node the container makes there (it has
/// `CAP_MKNOD` by default) does not open: only these devices are reachable, as the default
/// device cgroup rules of containerd's spec allow.
fn dev_dir(dev: &Path) -> Result<(), PodMountError> {
    let flags = libc::MS_NOSUID | libc::MS_NOEXEC | libc::MS_NODEV;
    mount(
        "tmpfs",
        dev,
        Some("tmpfs"),
        flags,
        Some("mode=0755,size=65536"),
    )?;
    for node in DEV_NODES {
        bind(&Path::new("/dev").join(node), &dev.join(node), false)?;
    }
    bind(Path::new("/dev/pts"), &dev.join("pts"), false)?;
    bind(Path::new("/dev/shm"), &dev.join("shm"), false)?;
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let at = dev.join(link);
        std::os::unix::fs::symlink(to, &at).map_err(io("symlink", &at))?;
    }
    Ok(())
}

/// [`PodMount::Root`]: see the module docs.
fn root(device: &str, dir: &str, upper_bytes: u64) -> Result<(), PodMountError> {
    if !(MIN_UPPER_BYTES..=MAX_POD_UPPER_BYTES).contains(&upper_bytes) {
        return Err(PodMountError::Size(upper_bytes));
    }
    let dir = checked(dir)?;
    let (lower, rw, root) = (dir.join("lower"), dir.join("rw"), dir.join("root"));
    erofs(device, &lower)?;
    let size = format!("mode=0755,size={upper_bytes}");
    mount("tmpfs", &rw, Some("tmpfs"), libc::MS_NODEV, Some(&size))?;
    let (upper, work) = (rw.join("upper"), rw.join("work"));
    mkdir(&upper)?;
    mkdir(&work)?;
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    mount(
        "overlay",
        &root,
        Some("overlay"),
        libc::MS_NODEV,
        Some(&data),
    )?;
    let hidden = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount("proc", &root.join("proc"), Some("proc"), hidden, None)?;
    let sys_flags = hidden | libc::MS_RDONLY;
    mount("sysfs", &root.join("sys"), Some("sysfs"), sys_flags, None)?;
    // The pod's cgroups, read-only: a container reads its own limits where it expects them.
    let cgroup = root.join("sys/fs/cgroup");
    mount("cgroup2", &cgroup, Some("cgroup2"), sys_flags, None)?;
    dev_dir(&root.join("dev"))
}

/// The mount points at or below `path` in `/proc/self/mountinfo`, deepest first.
fn mounts_below(path: &Path) -> Result<Vec<PathBuf>, PodMountError> {
    let info = Path::new("/proc/self/mountinfo");
    let text = std::fs::read_to_string(info).map_err(io("reading", info))?;
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape)
        .map(PathBuf::from)
        .filter(|m| m.starts_with(path))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found.dedup();
    Ok(found)
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') << 6 | (d[1] - b'0') << 3 | (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// [`PodMount::Unmount`]: every mount at or below `path`, deepest first; a busy one stays and
/// is the error.
fn unmount(path: &str) -> Result<(), PodMountError> {
    let path = checked(path)?;
    for m in mounts_below(&path)? {
        sys::umount(&c(&m)?, 0).map_err(io("umount", &m))?;
    }
    Ok(())
}

/// The cgroup group of the member assembled in `dir` (`pod-<last component>`), holding
/// `limits`; recorded so that processes run in `dir/root` go in it.
fn member_group(agent: &Agent, dir: &str, limits: GroupLimits) -> Result<(), PodMountError> {
    let Some(cgroups) = agent.cgroups() else {
        return Ok(());
    };
    // The last component of `protocol::pod_member_cgroup(dir)`, under `work`.
    let leaf = dir.rsplit('/').next().unwrap_or_default();
    let name = format!("pod-{leaf}");
    cgroups
        .create_group(&name, limits)
        .map_err(|e| PodMountError::Io {
            what: "creating the container's cgroup",
            path: name.clone(),
            source: std::io::Error::other(e),
        })?;
    agent.pod_groups().insert(format!("{dir}/root"), name);
    Ok(())
}

/// Carries out one [`PodMount`] step.
pub async fn apply(agent: &Agent, m: &PodMount) -> Result<(), PodMountError> {
    if !agent.is_pid1() {
        return Err(PodMountError::NotPid1);
    }
    let r = match m {
        PodMount::Root {
            device,
            dir,
            upper_bytes,
            memory_bytes,
            pids,
            cpu_max,
        } => {
            if let Some(b) = memory_bytes.filter(|b| *b < MIN_POD_MEMORY_BYTES) {
                return Err(PodMountError::Memory(b));
            }
            if let Some((q, p)) = cpu_max.filter(|(q, p)| {
                !POD_CPU_QUOTA_MICROS.contains(q) || !POD_CPU_PERIOD_MICROS.contains(p)
            }) {
                return Err(PodMountError::Cpu(q, p));
            }
            let limits = GroupLimits {
                memory_bytes: *memory_bytes,
                pids: *pids,
                cpu_max: *cpu_max,
            };
            root(device, dir, *upper_bytes).and_then(|()| member_group(agent, dir, limits))
        }
        PodMount::Volume { device, path } => erofs(device, &checked(path)?),
        PodMount::Bind { source, path } => bind(&checked(source)?, &checked(path)?, true),
        PodMount::Unmount { path } => {
            // Its processes first (what its execs left running in a shared PID namespace
            // included), then its namespaces: both would keep its mounts (and disks) in use.
            // The group stays recorded until its mounts are gone, so a process started for
            // this root meanwhile still lands in it (and is killed with it).
            let root = format!("{path}/root");
            if let (Some(cgroups), Some(name)) = (agent.cgroups(), agent.pod_group(&root)) {
                cgroups.kill_group(&name);
            }
            agent.namespaces().remove(&root);
            let r = unmount(path);
            let group = agent.pod_groups().remove(&root);
            if let (Some(cgroups), Some(name)) = (agent.cgroups(), group) {
                cgroups.remove_group(&name).await;
            }
            r
        }
    };
    match &r {
        Ok(()) => tracing::info!(?m, "pod mount"),
        Err(e) => tracing::warn!(?m, error = %e, "pod mount failed"),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_absolute_and_plain() {
        for bad in ["", "/", "rel", "/a/../b", "/a//b", "/a/", "/a\0b"] {
            assert!(checked(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            checked("/run/vm-pod/c1").unwrap(),
            Path::new("/run/vm-pod/c1")
        );
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/run/a\040b"), "/run/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape(r"/tail\04"), r"/tail\04");
    }

    #[test]
    fn an_upper_outside_the_bounds_is_refused_before_any_mount() {
        let e = root("/dev/null", "/run/vm-pod/c1", 1).unwrap_err();
        assert!(matches!(e, PodMountError::Size(1)), "{e}");
        let e = root("/dev/null", "/run/vm-pod/c1", MAX_POD_UPPER_BYTES + 1).unwrap_err();
        assert!(matches!(e, PodMountError::Size(_)), "{e}");
    }
}
