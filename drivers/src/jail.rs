//! What isolation a driver builds around each VM's host processes, and whether this host lets
//! it ([`JailReport`], shown by `vm drivers --json` and `--dry-run --json`).

use serde::Serialize;

/// The jail a driver builds around every VM it boots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JailReport {
    /// Whether this host grants what the jail needs. A driver whose jail is not granted
    /// refuses to boot (there is no weaker mode to fall back to).
    pub granted: bool,
    /// Why (not).
    pub detail: String,
    /// The namespaces each VM process gets.
    pub namespaces: Vec<&'static str>,
    /// The root each VM process sees.
    pub root: &'static str,
    /// The identity it runs as.
    pub uid: &'static str,
    /// Capabilities left.
    pub capabilities: &'static str,
    /// `no_new_privs`.
    pub no_new_privs: bool,
    /// The seccomp filters.
    pub seccomp: &'static str,
    /// The memory cap beyond guest RAM.
    pub memory_cap: &'static str,
}

/// The kvm driver's jail (`vmm::process::jail` and `vmm::seccomp`): it needs root (unsharing
/// namespaces without a user namespace, mounting, switching uid).
pub fn kvm_report() -> JailReport {
    let root = nix::unistd::geteuid().is_root();
    JailReport {
        granted: root,
        detail: if root {
            "running as root: namespaces, pivot_root and a per-VM uid are available".into()
        } else {
            "needs root to unshare namespaces, mount the jail root and switch to a per-VM uid; \
             kvm boots fail with a jail error"
                .into()
        },
        namespaces: vec!["mnt", "pid", "ipc", "uts", "net"],
        root: "read-only tmpfs holding only the run directory (images and /dev/kvm are opened before pivot_root)",
        uid: "per VM: 1000000000 + pid, no supplementary groups",
        capabilities: "none (bounding set empty)",
        no_new_privs: true,
        seccomp: "per thread kind (main, control, vCPU, device worker, reaper), kill-process",
        memory_cap: "RLIMIT_DATA = guest RAM + 64 MiB",
    }
}

/// The tcg driver's jail: QEMU's own seccomp sandbox; no namespaces yet.
pub fn tcg_report() -> JailReport {
    JailReport {
        granted: true,
        detail: "QEMU runs with -sandbox on (obsolete, elevateprivileges, spawn and \
                 resourcecontrol denied); QEMU and vhost-device-vsock get no namespaces, \
                 uid change or rlimits yet"
            .into(),
        namespaces: Vec::new(),
        root: "the host's",
        uid: "the caller's",
        capabilities: "the caller's",
        no_new_privs: false,
        seccomp: "QEMU: its own -sandbox filter; vhost-device-vsock: none",
        memory_cap: "none",
    }
}
