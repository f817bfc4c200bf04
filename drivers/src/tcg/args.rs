//! The QEMU and vm-vsock command lines, as pure functions of a [`QemuConfig`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::BlockDevice;

/// Everything the QEMU command line depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuConfig {
    /// Guest memory in MiB (also the size of the memfd memory backend).
    pub mem_mib: u32,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// The compressed kernel (`bzImage`).
    pub kernel: PathBuf,
    /// The initramfs (uncompressed newc cpio).
    pub initramfs: PathBuf,
    /// Words appended to the fixed kernel command line (the agent configuration).
    pub extra_cmdline: String,
    /// The vhost-user socket `vm-vsock` listens on.
    pub vhost_socket: PathBuf,
    /// Host files exposed as read-only virtio-blk disks, in order, each with its serial.
    pub disks: Vec<BlockDevice>,
    /// Open read-only descriptors of `disks`, in the same order, which QEMU inherits (a
    /// jailed QEMU cannot open the paths): each becomes `-add-fd` and `/dev/fdset/N`. Empty:
    /// QEMU opens the paths.
    pub disk_fds: Vec<i32>,
    /// The vhost-user sockets of the shares' `vm-virtiofs` backends, in order (share `N` gets
    /// the tag `fs<N>`).
    pub share_sockets: Vec<PathBuf>,
    /// How the kernel finds its devices ([`crate::boot::KernelKind`]): the tuned kernel from the
    /// `virtio_mmio.device=` words QEMU appends to its command line (`acpi=off`), a
    /// distribution kernel from the ACPI tables QEMU's microvm machine writes (`acpi=on`).
    pub kernel_kind: crate::boot::KernelKind,
    /// The host's TSC rate in kHz, which a TCG guest's TSC runs at (QEMU reads the host's), for
    /// a distribution kernel (see [`ACPI_TIMER_CMDLINE`]); `None` where it is not known.
    pub tsc_khz: Option<u64>,
}

/// The fixed part of the guest kernel command line: serial console, every reboot or panic ends
/// the VM (QEMU runs with `-no-reboot`), and `no_timer_check`.
///
/// Without `no_timer_check` the kernel checks at boot that the emulated timer's interrupt
/// arrives within a short busy-wait; on a loaded host a TCG vCPU can be descheduled for that
/// long, and the kernel panics with "IO-APIC + timer doesn't work!" (found as the 1-in-20..40
/// boot failure of 20 guests booted at once: QEMU exits 0 after the panic's triple fault).
/// The timer works; only the check is timing-sensitive. Our kvm VMM passes it too.
pub const BASE_CMDLINE: &str = "console=ttyS0 reboot=t panic=-1 no_timer_check";

/// What a distribution kernel is told on microvm with ACPI: the machine's ACPI is hardware
/// reduced (no PIT, HPET or PM timer to calibrate against), so without the local APIC timer's
/// period the kernel waits forever for its first tick. QEMU's APIC timer counts at 1 GHz: at
/// Debian's 250 Hz that is 4,000,000 a tick. With it goes `tsc_early_khz`
/// ([`QemuConfig::tsc_khz`]): the kernel's fast TSC calibration polls the PIT for a few
/// milliseconds and, on a loaded host where the vCPU thread is descheduled in between, fails;
/// the kernel then calibrates its delay loop by counting ticks that nothing delivers yet, and
/// hangs (5 of 6 boots beside two busy loops on 2 cores; 6 of 6 booted with the rate given).
pub const ACPI_TIMER_CMDLINE: &str = "lapic_timer_period=4000000";

/// The full kernel command line for `cfg`.
pub fn kernel_cmdline(cfg: &QemuConfig) -> String {
    let mut line = BASE_CMDLINE.to_string();
    if cfg.kernel_kind == crate::boot::KernelKind::Distribution {
        line = format!("{line} {ACPI_TIMER_CMDLINE}");
        if let Some(khz) = cfg.tsc_khz {
            line = format!("{line} tsc_early_khz={khz}");
        }
    }
    let extra = cfg.extra_cmdline.trim();
    if !extra.is_empty() {
        line = format!("{line} {extra}");
    }
    line
}

/// QEMU's own seccomp filter: on, with obsolete system calls, privilege changes, process
/// creation and resource-control calls denied (QEMU kills itself on any of them).
pub const QEMU_SANDBOX: &str =
    "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// QEMU arguments (without the program name). The serial console goes to QEMU's stdout, which
/// the driver reads into a bounded ring; there is no network device of any kind.
pub fn qemu_args(cfg: &QemuConfig) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |s: &str| a.push(s.into());
    push("-machine");
    push(match cfg.kernel_kind {
        crate::boot::KernelKind::Tuned => "microvm,acpi=off,memory-backend=mem",
        crate::boot::KernelKind::Distribution => "microvm,acpi=on,memory-backend=mem",
    });
    push("-object");
    push(&format!(
        "memory-backend-memfd,id=mem,size={}M,share=on",
        cfg.mem_mib
    ));
    push("-accel");
    push("tcg");
    push("-cpu");
    push("max");
    push("-m");
    push(&cfg.mem_mib.to_string());
    push("-smp");
    push(&cfg.vcpus.max(1).to_string());
    push("-nodefaults");
    push("-no-user-config");
    push("-display");
    push("none");
    push("-serial");
    push("stdio");
    push("-no-reboot");
    push("-net");
    push("none");
    push("-sandbox");
    push(QEMU_SANDBOX);
    push("-append");
    push(&kernel_cmdline(cfg));
    a.push("-kernel".into());
    a.push(cfg.kernel.clone().into_os_string());
    a.push("-initrd".into());
    a.push(cfg.initramfs.clone().into_os_string());
    a.push("-chardev".into());
    a.push(chardev_socket("c0", &cfg.vhost_socket));
    a.push("-device".into());
    a.push("vhost-user-vsock-device,chardev=c0".into());
    for (i, sock) in cfg.share_sockets.iter().enumerate() {
        let tag = crate::boot::share_tag(i);
        a.push("-chardev".into());
        a.push(chardev_socket(&tag, sock));
        a.push("-device".into());
        a.push(format!("vhost-user-fs-device,chardev={tag},tag={tag}").into());
    }
    for (i, disk) in cfg.disks.iter().enumerate() {
        let file = match cfg.disk_fds.get(i) {
            Some(fd) => {
                a.push("-add-fd".into());
                a.push(format!("fd={fd},set={}", i + 1).into());
                PathBuf::from(format!("/dev/fdset/{}", i + 1))
            }
            None => disk.host_path.clone(),
        };
        a.push("-drive".into());
        a.push(drive(i, &file));
        a.push("-device".into());
        a.push(format!("virtio-blk-device,drive=d{i},serial={}", disk.serial).into());
    }
    a
}

/// QEMU option values are comma-separated; a comma inside a path is written `,,`.
fn escape_commas(p: &Path) -> OsString {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut out = Vec::with_capacity(p.as_os_str().len());
    for &b in p.as_os_str().as_bytes() {
        out.push(b);
        if b == b',' {
            out.push(b',');
        }
    }
    OsString::from_vec(out)
}

fn chardev_socket(id: &str, path: &Path) -> OsString {
    let mut s = OsString::from(format!("socket,id={id},path="));
    s.push(escape_commas(path));
    s
}

fn drive(index: usize, path: &Path) -> OsString {
    let mut s = OsString::from("file=");
    s.push(escape_commas(path));
    s.push(format!(",if=none,id=d{index},format=raw,readonly=on"));
    s
}

/// `vm-virtiofs` arguments: its vhost-user socket, the share, its inode cap.
pub fn virtiofs_args(socket: &Path, share: &Path, max_inodes: usize) -> Vec<OsString> {
    vec![
        "--socket".into(),
        socket.into(),
        "--share".into(),
        share.into(),
        "--max-inodes".into(),
        max_inodes.to_string().into(),
    ]
}

/// `vm-vsock` arguments for guest CID `cid`.
pub fn vsock_args(cid: u64, vhost_socket: &Path, uds_path: &Path) -> Vec<OsString> {
    vec![
        "--guest-cid".into(),
        cid.to_string().into(),
        "--socket".into(),
        vhost_socket.into(),
        "--uds-path".into(),
        uds_path.into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> QemuConfig {
        QemuConfig {
            mem_mib: 256,
            vcpus: 2,
            kernel: "/img/bzImage".into(),
            initramfs: "/img/initramfs.cpio".into(),
            extra_cmdline: "vm.hostname=box".into(),
            vhost_socket: "/run/x/vhu.sock".into(),
            disks: vec![
                BlockDevice {
                    host_path: "/data/a.erofs".into(),
                    serial: "disk0".into(),
                },
                BlockDevice {
                    host_path: "/data/b,c.img".into(),
                    serial: "root".into(),
                },
            ],
            disk_fds: Vec::new(),
            share_sockets: vec!["/run/x/fs0.sock".into(), "/run/x/fs1,a.sock".into()],
            kernel_kind: crate::KernelKind::Tuned,
            tsc_khz: Some(2_300_000),
        }
    }

    #[test]
    fn a_distribution_kernel_gets_acpi_and_its_timer_period() {
        let tuned = strings(&cfg());
        assert_eq!(
            value_of(&tuned, "-machine"),
            ["microvm,acpi=off,memory-backend=mem"]
        );
        assert!(!value_of(&tuned, "-append")[0].contains("lapic_timer_period"));
        let distro = QemuConfig {
            kernel_kind: crate::KernelKind::Distribution,
            ..cfg()
        };
        let args = strings(&distro);
        assert_eq!(
            value_of(&args, "-machine"),
            ["microvm,acpi=on,memory-backend=mem"]
        );
        assert_eq!(
            value_of(&args, "-append"),
            [format!(
                "{BASE_CMDLINE} {ACPI_TIMER_CMDLINE} tsc_early_khz=2300000 vm.hostname=box"
            )]
        );
    }

    fn strings(cfg: &QemuConfig) -> Vec<String> {
        qemu_args(cfg)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect()
    }

    fn value_of(args: &[String], flag: &str) -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].clone())
            .collect()
    }

    #[test]
    fn qemu_runs_under_its_own_seccomp_sandbox() {
        assert_eq!(
            value_of(&strings(&cfg()), "-sandbox"),
            vec!["on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]
        );
    }

    #[test]
    fn has_no_network_device() {
        let args = strings(&cfg());
        assert!(args.iter().any(|a| a == "-nodefaults"));
        assert_eq!(value_of(&args, "-net"), vec!["none"]);
        for forbidden in ["-netdev", "-nic"] {
            assert!(
                !args.iter().any(|a| a == forbidden),
                "{forbidden} present: {args:?}"
            );
        }
        assert!(!args.iter().any(|a| a.contains("virtio-net")), "{args:?}");
    }

    #[test]
    fn disks_are_read_only_with_serials() {
        let args = strings(&cfg());
        let drives = value_of(&args, "-drive");
        assert_eq!(drives.len(), 2);
        for d in &drives {
            assert!(d.contains("readonly=on"), "{d}");
            assert!(d.contains("format=raw"), "{d}");
        }
        assert!(
            drives[1].starts_with("file=/data/b,,c.img,"),
            "{}",
            drives[1]
        );
        let devices = value_of(&args, "-device");
        assert!(devices.contains(&"virtio-blk-device,drive=d0,serial=disk0".to_string()));
        assert!(devices.contains(&"virtio-blk-device,drive=d1,serial=root".to_string()));
    }

    #[test]
    fn memory_backend_matches_memory_size() {
        let mut c = cfg();
        c.mem_mib = 384;
        let args = strings(&c);
        assert_eq!(
            value_of(&args, "-object"),
            vec!["memory-backend-memfd,id=mem,size=384M,share=on"]
        );
        assert_eq!(value_of(&args, "-m"), vec!["384"]);
        assert_eq!(
            value_of(&args, "-machine"),
            vec!["microvm,acpi=off,memory-backend=mem"]
        );
        assert_eq!(value_of(&args, "-smp"), vec!["2"]);
    }

    #[test]
    fn cmdline_and_vsock_device() {
        let args = strings(&cfg());
        assert_eq!(
            value_of(&args, "-append"),
            vec!["console=ttyS0 reboot=t panic=-1 no_timer_check vm.hostname=box"]
        );
        assert_eq!(
            value_of(&args, "-chardev")[0],
            "socket,id=c0,path=/run/x/vhu.sock"
        );
        assert!(value_of(&args, "-device").contains(&"vhost-user-vsock-device,chardev=c0".into()));
        assert!(args.iter().any(|a| a == "-no-reboot"));
        assert_eq!(value_of(&args, "-accel"), vec!["tcg"]);
    }

    #[test]
    fn each_share_is_a_vhost_user_fs_device_with_its_tag() {
        let args = strings(&cfg());
        let chardevs = value_of(&args, "-chardev");
        assert!(chardevs.contains(&"socket,id=fs0,path=/run/x/fs0.sock".to_string()));
        assert!(chardevs.contains(&"socket,id=fs1,path=/run/x/fs1,,a.sock".to_string()));
        let devices = value_of(&args, "-device");
        assert!(devices.contains(&"vhost-user-fs-device,chardev=fs0,tag=fs0".to_string()));
        assert!(devices.contains(&"vhost-user-fs-device,chardev=fs1,tag=fs1".to_string()));
        let a: Vec<String> = virtiofs_args(Path::new("/r/fs0.sock"), Path::new("/w"), 64)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert_eq!(
            a,
            [
                "--socket",
                "/r/fs0.sock",
                "--share",
                "/w",
                "--max-inodes",
                "64"
            ]
        );
    }

    #[test]
    fn vhost_command_line() {
        let a: Vec<String> = vsock_args(3, Path::new("/r/vhu.sock"), Path::new("/r/vsock.sock"))
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        assert_eq!(
            a,
            [
                "--guest-cid",
                "3",
                "--socket",
                "/r/vhu.sock",
                "--uds-path",
                "/r/vsock.sock"
            ]
        );
    }
}
