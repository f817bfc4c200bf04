//! Boot steps shared by the real backends, by concern:
//! - here: checking a plan and turning it into the agent's configuration (kernel command-line
//!   words), and the names of the files and sockets in a run dir;
//! - [`run_dir`]: the run directory, the per-boot agent token and the initrd that carries it,
//!   and attaching to a booted VM's agent with that token;
//! - [`wait`]: waiting for the agent to answer (after its ready line on the console, for
//!   backends that need that).

mod run_dir;
mod wait;

use std::fs;
use std::path::Path;

use vm_agent_protocol::AGENT_PORT;
use vm_agent_protocol::config::{AgentConfig, DiskMount, RootDisk, ShareKind, ShareMount};
use vm_agent_protocol::initramfs::{MODULE_ORDER, has_entry};

use crate::{BootPlan, DriverError};

pub use run_dir::attach_client;
pub(crate) use run_dir::{RUN_FILES, RunDir, boot_secret, rekey};
pub(crate) use wait::{AGENT_READY_MARKER, wait_for_agent, wait_for_agent_after_console};

/// The guest's vsock context id.
pub(crate) const GUEST_CID: u64 = 3;

/// The hybrid-vsock socket the agent client connects to, inside the run dir (kvm; the tcg
/// driver pads this name, see [`unreachable_peer_socket_name`]).
pub(crate) const VSOCK_SOCKET: &str = "vsock.sock";

/// Longest Unix socket path (sun_path is 108 bytes including the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The virtio-blk serial (agent disk id) of disk `index`.
pub(crate) fn disk_id(index: usize) -> String {
    format!("disk{index}")
}

/// The virtio-fs tag of share `index`.
pub fn share_tag(index: usize) -> String {
    format!("fs{index}")
}

pub(crate) fn invalid(reason: String) -> DriverError {
    DriverError::InvalidPlan { reason }
}

/// The hybrid-vsock socket name for a backend whose vsock device connects a guest connection
/// to host port P to `<socket>_P` (vhost-device-vsock, the tcg driver's earlier backend, did;
/// our `vm-vsock` never does, and the padding stays as a second guard): `vsock.sock` padded so the socket
/// path in `run_dir` is exactly [`MAX_SOCKET_PATH`] bytes. Every `<socket>_P` is then longer
/// than any Unix socket path, so no host listener can ever be reached from the guest, whatever
/// is created in the directory. `None` when `run_dir` is already too long.
pub(crate) fn unreachable_peer_socket_name(run_dir: &Path) -> Option<String> {
    let base = run_dir.as_os_str().len() + 1 + VSOCK_SOCKET.len();
    let pad = MAX_SOCKET_PATH.checked_sub(base)?;
    Some(format!("vsock{}.sock", "-".repeat(pad)))
}

/// Checks that `path` is an existing regular file.
pub(crate) fn require_file(field: &str, path: &Path) -> Result<(), DriverError> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(invalid(format!(
            "{field}: {} is not a regular file",
            path.display()
        ))),
        Err(e) => Err(invalid(format!("{field}: {}: {e}", path.display()))),
    }
}

/// The kind of kernel a plan boots, told by what its initramfs carries: the tuned kernel
/// (`images/build.sh`) has every driver built in and finds its virtio-mmio devices on its
/// command line; a distribution kernel (`images/build.sh --kernel debian`) has them as modules,
/// which its initramfs carries with a load list ([`MODULE_ORDER`]), and finds the devices only
/// through the firmware's ACPI tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelKind {
    Tuned,
    Distribution,
}

/// [`KernelKind`] of `plan`: `Distribution` when its initramfs has [`MODULE_ORDER`].
pub(crate) fn kernel_kind(plan: &BootPlan) -> Result<KernelKind, DriverError> {
    let path = &plan.images.initramfs;
    let bad =
        |e: &dyn std::fmt::Display| invalid(format!("images.initramfs: {}: {e}", path.display()));
    let mut file = std::io::BufReader::new(fs::File::open(path).map_err(|e| bad(&e))?);
    match has_entry(&mut file, MODULE_ORDER) {
        Ok(true) => Ok(KernelKind::Distribution),
        Ok(false) => Ok(KernelKind::Tuned),
        Err(e) => {
            let cause = std::error::Error::source(&e).map(|c| format!(": {c}"));
            Err(bad(&format!("{e}{}", cause.unwrap_or_default())))
        }
    }
}

/// Checks the parts of a plan every backend depends on.
pub(crate) fn check_plan(plan: &BootPlan) -> Result<(), DriverError> {
    if plan.vcpus == 0 || plan.vcpus > 255 {
        return Err(invalid(format!("vcpus: {} is not in 1..=255", plan.vcpus)));
    }
    // The spec's floor (vm_spec::MIN_MEM_MIB): a validated spec always passes this check.
    if i64::from(plan.mem_mib) < vm_spec::MIN_MEM_MIB {
        return Err(invalid(format!(
            "mem_mib: {} is below {}",
            plan.mem_mib,
            vm_spec::MIN_MEM_MIB
        )));
    }
    require_file("images.initramfs", &plan.images.initramfs)?;
    for (i, d) in plan.disks.iter().enumerate() {
        require_file(&format!("disks[{i}].host_path"), &d.host_path)?;
    }
    if let Some(r) = &plan.rootfs {
        require_file("rootfs.host_path", &r.host_path)?;
    }
    for (i, s) in plan.shares.iter().enumerate() {
        let field = format!("shares[{i}].host_path");
        let meta = fs::symlink_metadata(&s.host_path)
            .map_err(|e| invalid(format!("{field}: {}: {e}", s.host_path.display())))?;
        let ok = match s.kind {
            ShareKind::Dir => meta.is_dir(),
            ShareKind::File => meta.is_file(),
        };
        if !ok {
            return Err(invalid(format!(
                "{field}: {} is not a {}",
                s.host_path.display(),
                if s.kind == ShareKind::Dir {
                    "directory"
                } else {
                    "regular file"
                }
            )));
        }
    }
    let sock = plan.run_dir.join(VSOCK_SOCKET);
    if sock.as_os_str().len() > MAX_SOCKET_PATH - 8 {
        return Err(invalid(format!(
            "run_dir: {} is too long for a Unix socket path",
            plan.run_dir.display()
        )));
    }
    Ok(())
}

/// Checks that the plan's disks, root and shares fit in the `max` device slots a backend has
/// for them (each is one virtio-mmio device).
pub(crate) fn check_device_count(plan: &BootPlan, max: usize) -> Result<(), DriverError> {
    let n = plan.block_devices().len() + plan.shares.len();
    if n > max {
        return Err(invalid(format!(
            "{} disks and {} shares need {n} devices; this driver has room for {max}",
            plan.block_devices().len(),
            plan.shares.len()
        )));
    }
    Ok(())
}

/// A hostname the agent accepts, derived from the plan name.
pub(crate) fn hostname(name: &str) -> String {
    let h: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if h.is_empty() { "vm".into() } else { h }
}

/// The agent configuration for a plan, rendered as kernel command-line words; `dax`: the
/// shares' devices have a DAX window.
pub(crate) fn agent_cmdline(plan: &BootPlan, dax: bool) -> Result<String, DriverError> {
    let cfg = AgentConfig {
        hostname: hostname(&plan.name),
        pids_max: (plan.pids_max > 0).then_some(plan.pids_max),
        disks: plan
            .disks
            .iter()
            .enumerate()
            .map(|(i, d)| DiskMount {
                id: disk_id(i),
                guest_path: d.guest_path.clone(),
                fs: d.fs,
            })
            .collect(),
        shares: plan
            .shares
            .iter()
            .enumerate()
            .map(|(i, s)| ShareMount {
                tag: share_tag(i),
                guest_path: s.guest_path.clone(),
                kind: s.kind,
                dax,
            })
            .collect(),
        root: plan.rootfs.as_ref().map(|r| RootDisk {
            id: crate::ROOT_DISK_SERIAL.into(),
            fs: r.fs,
        }),
        port: AGENT_PORT,
        ..AgentConfig::default()
    };
    cfg.to_cmdline()
        .map_err(|e| invalid(format!("agent configuration: {e}")))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::PathBuf;

    use super::*;
    use crate::test_support::dummy_plan;
    use crate::{DiskFs, DiskPlan};

    /// A plan whose image set is a temporary directory with an initramfs of `entries` (and a
    /// `bzImage`, no `vmlinux`).
    pub(crate) fn plan_with_initramfs(dir: &Path, entries: &[&str]) -> BootPlan {
        let mut archive = Vec::new();
        for e in entries {
            vm_agent_protocol::initramfs::push_entry(&mut archive, e, 0o100644, b"");
        }
        fs::write(dir.join("initramfs.cpio"), archive).unwrap();
        fs::write(dir.join("bzImage"), b"kernel").unwrap();
        let mut plan = dummy_plan();
        plan.images = crate::ImagePaths::in_dir(dir);
        plan
    }

    #[test]
    fn kernel_kind_is_told_by_the_initramfs() {
        let dir = tempfile::tempdir().unwrap();
        let plan = plan_with_initramfs(dir.path(), &["init", "lib/modules/vm/order", "TRAILER!!!"]);
        // No vmlinux in the set: its kernel is the bzImage.
        assert_eq!(plan.images.vmlinux, dir.path().join("bzImage"));
        assert_eq!(kernel_kind(&plan).unwrap(), KernelKind::Distribution);
        let plan = plan_with_initramfs(dir.path(), &["init", "lib/modules", "TRAILER!!!"]);
        assert_eq!(kernel_kind(&plan).unwrap(), KernelKind::Tuned);
        fs::write(dir.path().join("initramfs.cpio"), b"not an archive, long enough for a header........................................................................").unwrap();
        let err = kernel_kind(&plan).unwrap_err().to_string();
        assert!(
            err.contains("images.initramfs") && err.contains("not a newc header"),
            "{err}"
        );
    }

    #[test]
    fn hostname_is_sanitized() {
        assert_eq!(hostname("my box/1"), "my-box-1");
        assert_eq!(hostname(""), "vm");
        assert_eq!(hostname(&"x".repeat(100)).len(), 64);
    }

    #[test]
    fn agent_cmdline_carries_disks_and_pids() {
        let mut plan = dummy_plan();
        plan.pids_max = 64;
        plan.disks = vec![DiskPlan {
            host_path: "/x".into(),
            guest_path: "/data".into(),
            fs: DiskFs::Erofs,
        }];
        let words = agent_cmdline(&plan, false).unwrap();
        assert!(words.contains("vm.pids=64"), "{words}");
        assert!(words.contains("vm.disk=disk0:/data:erofs"), "{words}");
        assert!(words.contains(&format!("vm.port={AGENT_PORT}")), "{words}");
        let (parsed, _) = AgentConfig::from_cmdline(&words).unwrap();
        assert_eq!(parsed.disks[0].id, "disk0");
    }

    #[test]
    fn bad_guest_path_is_an_invalid_plan() {
        let mut plan = dummy_plan();
        plan.disks = vec![DiskPlan {
            host_path: "/x".into(),
            guest_path: "relative".into(),
            fs: DiskFs::Raw,
        }];
        assert!(matches!(
            agent_cmdline(&plan, false),
            Err(DriverError::InvalidPlan { .. })
        ));
    }

    #[test]
    fn check_plan_names_the_missing_file() {
        let err = check_plan(&dummy_plan()).unwrap_err().to_string();
        assert!(err.contains("images.initramfs"), "{err}");
    }

    #[test]
    fn the_spec_memory_floor_is_the_boot_floor() {
        let limits = |mem_mib| vm_spec::Limits {
            mem_mib,
            ..vm_spec::Limits::default()
        };
        // The least memory a spec validates with passes the boot check's memory rule (this
        // plan then fails on its missing initramfs, not on its memory) ...
        let least = limits(vm_spec::MIN_MEM_MIB).normalize().unwrap();
        let mut plan = dummy_plan();
        plan.mem_mib = least.mem_mib;
        let err = check_plan(&plan).unwrap_err().to_string();
        assert!(err.contains("images.initramfs"), "{err}");
        // ... and one MiB less is refused by both, the spec first.
        assert!(limits(vm_spec::MIN_MEM_MIB - 1).normalize().is_err());
        plan.mem_mib -= 1;
        let err = check_plan(&plan).unwrap_err().to_string();
        assert!(err.contains("mem_mib: 63 is below 64"), "{err}");
    }

    #[test]
    fn padded_socket_leaves_no_reachable_peer_path() {
        let tmp = tempfile::tempdir().unwrap();
        let name = unreachable_peer_socket_name(tmp.path()).unwrap();
        let sock = tmp.path().join(&name);
        assert_eq!(sock.as_os_str().len(), MAX_SOCKET_PATH);
        // The agent socket itself binds and connects ...
        let l = UnixListener::bind(&sock).unwrap();
        UnixStream::connect(&sock).unwrap();
        drop(l);
        // ... but nothing can ever listen where a guest connection to a host port would go.
        for port in [0u32, 1, 5555, u32::MAX] {
            let peer = format!("{}_{port}", sock.display());
            assert!(UnixListener::bind(&peer).is_err(), "{peer} bindable");
            assert!(UnixStream::connect(&peer).is_err(), "{peer} connectable");
        }
        let long = PathBuf::from(format!("/{}", "d".repeat(100)));
        assert_eq!(unreachable_peer_socket_name(&long), None);
    }
}
