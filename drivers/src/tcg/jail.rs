//! The jails of the tcg driver's two processes, built by the kvm driver's builder
//! (`vm_jail::exec`): new mount, PID, IPC, UTS and network namespaces, a read-only
//! root, no capabilities, `no_new_privs`, rlimits with a memory cap sized from the plan, and an
//! unprivileged uid per process.
//!
//! - **vm-vsock** (our vhost-user vsock backend) starts first, as uid = gid = `JAIL_ID_BASE` + its reaper's pid. Its
//!   root: the program, the system's shared libraries (read-only, exec) and the run directory
//!   (read-write, `noexec`), which it gets as group with mode `01770` (sticky: it may remove
//!   only the sockets it made; the agent token stays root's, mode `0600`). Its seccomp filter
//!   (`vm_jail::seccomp::vhost`) is installed just before `exec`.
//! - **vm-virtiofs** (one per host mount: our read-only file server as a vhost-user backend)
//!   runs as its own uid with the vsock backend's gid (QEMU, in that group, connects to its
//!   socket). Its root: the program, the libraries, the run directory (for its socket) and the
//!   share, bound read-only, `nosuid`, `nodev`, `noexec`, at its own path: nothing else of the
//!   host's files. Its `RLIMIT_NOFILE` fits its inode cap (one descriptor each). Its seccomp
//!   filter (`vm_jail::seccomp::vhost::vm_virtiofs`) has no `connect` and no call that writes
//!   a file.
//! - **QEMU** runs as its own uid with the vsock backend's gid (so it can connect to the
//!   vhost-user socket, which the backend creates with umask `007`). Its root: the program,
//!   the libraries, QEMU's firmware directory, the kernel (read-only) and the run directory
//!   (read-only: connecting to a socket needs no write access to the mount); the per-boot
//!   initrd is handed to its uid with mode `0400`, so the vsock backend cannot read the boot
//!   token in it. Disks are not in its root at all: the driver opens them read-only and passes
//!   the descriptors (`-add-fd` + `/dev/fdset/N`), so a disk the jail's uid could not read
//!   still works and no other file of its directory is visible. QEMU's own `-sandbox` filter
//!   stays on.
//!
//! The system libraries are bound as directories (`/usr/lib/x86_64-linux-gnu`, `/usr/lib64`,
//! and `/lib`, `/lib64` as the host has them: links on a merged-`/usr` system): the exact
//! closure of a program's libraries (plus QEMU's modules, loaded at run time) would be
//! narrower; that is future work.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::sys::resource::Resource;
use vm_jail::exec::{ExecJail, ExecJailConfig, Group};
use vm_jail::{JAIL_ID_BASE, JailConfig, JailError, MemoryCap};

use crate::DriverError;

/// QEMU's firmware and option ROMs (the microvm machine loads `bios-microvm.bin` from here).
const QEMU_DATA_DIR: &str = "/usr/share/qemu";

/// QEMU's address space beyond guest RAM (`RLIMIT_AS`): its 1 GiB translation-block cache,
/// libraries, thread stacks, allocator arenas (measured peak: 1.33 GiB beyond a 256 MiB
/// guest).
pub const QEMU_OVERHEAD_MIB: u64 = 2048;

/// vm-vsock's address space beyond guest RAM (it maps the guest's memory too; the budget
/// kept from the previous backend, whose measured peak was 280 MiB beyond a 256 MiB guest,
/// mostly thread stacks and arenas: ours has three threads and 64 KiB per connection).
pub const VHOST_OVERHEAD_MIB: u64 = 1024;

/// The jail root directories inside the run dir (empty on the host).
const VHOST_ROOT: &str = "root-vhost";
const QEMU_ROOT: &str = "root-qemu";

/// The shared-library directories and links every jailed program needs.
fn system_libraries() -> (Vec<PathBuf>, Vec<(PathBuf, PathBuf)>) {
    let mut dirs = Vec::new();
    let mut links = Vec::new();
    for top in ["/lib", "/lib64"] {
        let p = PathBuf::from(top);
        match std::fs::read_link(&p) {
            Ok(target) => links.push((p, target)),
            Err(_) if p.is_dir() => dirs.push(p),
            Err(_) => {}
        }
    }
    for d in ["/usr/lib/x86_64-linux-gnu", "/usr/lib64"] {
        let p = PathBuf::from(d);
        if p.is_dir() && !dirs.iter().any(|x| p.starts_with(x)) {
            dirs.push(p);
        }
    }
    (dirs, links)
}

fn jail_err(program: &str) -> impl FnOnce(JailError) -> DriverError + '_ {
    move |source| DriverError::Jail {
        program: program.into(),
        source,
    }
}

fn address_space(mem_mib: u32, overhead_mib: u64, file_size: u64) -> MemoryCap {
    MemoryCap {
        resource: Resource::RLIMIT_AS,
        bytes: (u64::from(mem_mib) + overhead_mib) << 20,
        file_size,
        open_files: vm_jail::NOFILE_LIMIT,
    }
}

/// The jail of vm-vsock at `bin`, whose sockets go into `run_dir`.
pub(super) fn vhost(
    bin: &Path,
    run_dir: &Path,
    jail_root: PathBuf,
    mem_mib: u32,
) -> Result<ExecJail, DriverError> {
    let program = super::VM_VSOCK;
    let (mut exec, links) = system_libraries();
    exec.push(bin.to_path_buf());
    let seccomp = vm_jail::seccomp::vhost::vm_vsock()
        .map_err(|e| jail_err(program)(JailError::Seccomp(e)))?;
    ExecJail::new(ExecJailConfig {
        jail: JailConfig {
            root: jail_root,
            binds: vec![run_dir.to_path_buf()],
            exec,
            links,
            netns_fd: Some(crate::kvm::vm::shared_netns()?),
            ..JailConfig::default()
        },
        memory: address_space(mem_mib, VHOST_OVERHEAD_MIB, 0),
        group: Group::Own,
        group_dirs: vec![run_dir.to_path_buf()],
        own_files: Vec::new(),
        keep_fds: Vec::new(),
        seccomp: Some(seccomp),
    })
    .map_err(jail_err(program))
}

/// Descriptors `vm-virtiofs` keeps beyond its inodes (stdio, the socket, QEMU's memory and
/// queue descriptors, its event loop).
const VIRTIOFS_OWN_FDS: u64 = 64;

/// The jail of the `vm-virtiofs` at `bin` serving `share`, its socket in `run_dir`, in the
/// vsock backend's group (`vhost_pid`: the vsock backend's reaper).
pub(super) fn virtiofs(
    bin: &Path,
    run_dir: &Path,
    jail_root: PathBuf,
    share: &Path,
    mem_mib: u32,
    vhost_pid: u32,
) -> Result<ExecJail, DriverError> {
    let program = super::VM_VIRTIOFS;
    let (mut exec, links) = system_libraries();
    exec.push(bin.to_path_buf());
    let seccomp = vm_jail::seccomp::vhost::vm_virtiofs()
        .map_err(|e| jail_err(program)(JailError::Seccomp(e)))?;
    ExecJail::new(ExecJailConfig {
        jail: JailConfig {
            root: jail_root,
            binds: vec![run_dir.to_path_buf()],
            ro: vec![share.to_path_buf()],
            exec,
            links,
            netns_fd: Some(crate::kvm::vm::shared_netns()?),
            extra_open_files: super::MAX_INODES as u64 + VIRTIOFS_OWN_FDS,
        },
        memory: address_space(mem_mib, VHOST_OVERHEAD_MIB, 0),
        group: Group::Shared(JAIL_ID_BASE + vhost_pid),
        group_dirs: Vec::new(),
        own_files: Vec::new(),
        keep_fds: Vec::new(),
        seccomp: Some(seccomp),
    })
    .map_err(jail_err(program))
}

/// What QEMU's jail needs besides its root: the vsock backend's gid and the disk descriptors.
pub(super) struct QemuJail<'a> {
    pub bin: &'a Path,
    pub run_dir: &'a Path,
    pub jail_root: PathBuf,
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub mem_mib: u32,
    /// The vsock backend's pid (its reaper's, as the launcher sees it).
    pub vhost_pid: u32,
    pub disks: &'a [File],
}

/// The jail of QEMU.
pub(super) fn qemu(q: QemuJail<'_>) -> Result<ExecJail, DriverError> {
    let (mut exec, links) = system_libraries();
    exec.push(q.bin.to_path_buf());
    let mut ro = vec![q.kernel.to_path_buf()];
    if Path::new(QEMU_DATA_DIR).is_dir() {
        ro.push(QEMU_DATA_DIR.into());
    }
    // The run dir, read-only, holds the initrd and the vhost-user socket.
    ro.push(q.run_dir.to_path_buf());
    ExecJail::new(ExecJailConfig {
        jail: JailConfig {
            root: q.jail_root,
            ro,
            exec,
            links,
            netns_fd: Some(crate::kvm::vm::shared_netns()?),
            ..JailConfig::default()
        },
        // Its guest RAM is a memfd it sizes with ftruncate.
        memory: address_space(q.mem_mib, QEMU_OVERHEAD_MIB, u64::from(q.mem_mib) << 20),
        group: Group::Shared(JAIL_ID_BASE + q.vhost_pid),
        group_dirs: Vec::new(),
        own_files: vec![q.initrd.to_path_buf()],
        keep_fds: q.disks.iter().map(|f| f.as_raw_fd()).collect(),
        seccomp: None,
    })
    .map_err(jail_err(super::QEMU))
}

/// The two jail roots, made (empty) in the run dir.
pub(super) fn roots(run: &mut crate::boot::RunDir) -> Result<(PathBuf, PathBuf), DriverError> {
    Ok((run.make_dir(VHOST_ROOT)?, run.make_dir(QEMU_ROOT)?))
}

/// The jail root of share `i`'s backend, made (empty) in the run dir.
pub(super) fn share_root(run: &mut crate::boot::RunDir, i: usize) -> Result<PathBuf, DriverError> {
    run.make_dir(&format!("root-fs{i}"))
}

/// Opens the disks read-only (close-on-exec; the jail passes them on to QEMU).
pub(super) fn open_disks(disks: &[crate::BlockDevice]) -> Result<Vec<File>, DriverError> {
    disks
        .iter()
        .map(|d| {
            File::open(&d.host_path).map_err(|source| DriverError::Io {
                what: "opening a disk for the jailed QEMU",
                path: d.host_path.clone(),
                source,
            })
        })
        .collect()
}
