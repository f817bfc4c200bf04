//! What isolation a driver builds around each VM's host processes, and whether this host lets
//! it ([`JailReport`], shown by `vm drivers --json` and `--dry-run --json`).

use serde::Serialize;

/// The jail a driver builds around every VM it boots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JailReport {
    /// Whether this host grants what the jail needs. A driver whose jail is not granted
    /// refuses untrusted work unless the caller accepts a weaker jail (`--allow-weaker-jail`).
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

/// Whether this process can build a jail: it needs root (unsharing namespaces without a user
/// namespace, mounting, switching uid).
pub fn host_grants() -> Result<(), String> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(
            "needs root to unshare namespaces, mount the jail root and switch to a per-VM uid"
                .into(),
        )
    }
}

impl JailReport {
    /// What a boot does with this jail: `Ok(true)` builds it, `Ok(false)` runs without it (the
    /// host cannot build it and the caller accepted that), `Err` refuses, naming why.
    pub fn decide(&self, allow_weaker_jail: bool) -> Result<bool, String> {
        match (self.granted, allow_weaker_jail) {
            (true, _) => Ok(true),
            (false, true) => Ok(false),
            (false, false) => Err(self.detail.clone()),
        }
    }

    /// [`decide`](Self::decide) in words, for `--dry-run`.
    pub fn applied(&self, allow_weaker_jail: bool) -> String {
        match self.decide(allow_weaker_jail) {
            Ok(true) => "full".into(),
            Ok(false) => "none: the host cannot build it and --allow-weaker-jail accepts that; \
                          the VM's processes run with the caller's privileges (seccomp filters \
                          stay on)"
                .into(),
            Err(why) => {
                format!("refused: {why}; --allow-weaker-jail would accept running without it")
            }
        }
    }
}

fn detail(granted: &Result<(), String>) -> String {
    match granted {
        Ok(()) => "running as root: namespaces, pivot_root and a per-VM uid are available".into(),
        Err(why) => why.clone(),
    }
}

/// The kvm driver's jail (`vm_jail` and `vm_jail::seccomp`).
pub fn kvm_report() -> JailReport {
    let granted = host_grants();
    JailReport {
        granted: granted.is_ok(),
        detail: detail(&granted),
        namespaces: vm_jail::NAMESPACES.to_vec(),
        root: "read-only tmpfs holding only the run directory (images and /dev/kvm are opened before pivot_root)",
        uid: "per VM: 1000000000 + pid, no supplementary groups",
        capabilities: "none (bounding set empty)",
        no_new_privs: true,
        seccomp: "per thread kind (main, control, vCPU, device worker, reaper), kill-process",
        memory_cap: "RLIMIT_DATA = guest RAM + 64 MiB",
    }
}

/// The tcg driver's jail around QEMU and vm-vsock (`tcg::jail`).
pub fn tcg_report() -> JailReport {
    let granted = host_grants();
    JailReport {
        granted: granted.is_ok(),
        detail: detail(&granted),
        namespaces: vm_jail::NAMESPACES.to_vec(),
        root: "read-only tmpfs per process: the program, the shared-library directories, the run \
               directory; QEMU also its firmware directory and the kernel (disks are passed as \
               descriptors)",
        uid: "per process: 1000000000 + pid; QEMU shares the vsock backend's gid",
        capabilities: "none (bounding set empty)",
        no_new_privs: true,
        seccomp: "QEMU: its own -sandbox filter (obsolete, elevateprivileges, spawn and \
                  resourcecontrol denied); vm-vsock: our allowlist, installed before exec, \
                  kill-process",
        memory_cap: "RLIMIT_AS = guest RAM + 2048 MiB (QEMU), + 1024 MiB (vm-vsock)",
    }
}
