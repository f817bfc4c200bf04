//! KVM availability: facts gathered from the host, then a pure verdict over them.
//!
//! [`HostFacts::gather`] is the only part that touches the host (`/dev/kvm`, `/sys/module`,
//! `/proc/cpuinfo`); [`classify`] turns facts into an [`Availability`] and is unit-tested with
//! fabricated facts for every branch.

use std::fs;
use std::io;
use std::path::Path;

use crate::Availability;

/// The KVM API version every supported kernel reports (`KVM_GET_API_VERSION`).
pub const KVM_API_VERSION: i32 = 12;

/// What opening `/dev/kvm` showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmDevice {
    /// The device node does not exist.
    Missing,
    /// The node exists but this user may not open it (EACCES / EPERM).
    PermissionDenied,
    /// Opening failed for another reason (the message says which).
    OpenFailed(String),
    /// Opened; `KVM_GET_API_VERSION` returned this value.
    Opened {
        /// The API version the kernel reported.
        api_version: i32,
    },
}

/// The host facts the KVM verdict depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// The result of opening `/dev/kvm`.
    pub device: KvmDevice,
    /// `/sys/module/kvm_pvm` exists (the PVM paravirtualized-KVM module is loaded).
    pub pvm_module: bool,
    /// `/sys/module/kvm_pvm/parameters/pvm_native` reads `Y`.
    pub pvm_native: bool,
    /// `/sys/module/kvm_intel` exists.
    pub kvm_intel: bool,
    /// `/sys/module/kvm_amd` exists.
    pub kvm_amd: bool,
    /// `/proc/cpuinfo` flags contain `vmx` (Intel VT-x).
    pub cpu_vmx: bool,
    /// `/proc/cpuinfo` flags contain `svm` (AMD-V).
    pub cpu_svm: bool,
}

impl HostFacts {
    /// Reads the facts from this host.
    pub fn gather() -> HostFacts {
        Self::gather_from(Path::new("/"))
    }

    /// Reads the facts with every path prefixed by `root` (sysfs/procfs fixtures in tests).
    /// `/dev/kvm` is opened only when `root` is `/`.
    pub fn gather_from(root: &Path) -> HostFacts {
        let device = if root == Path::new("/") {
            probe_device()
        } else if root.join("dev/kvm").exists() {
            KvmDevice::Opened {
                api_version: KVM_API_VERSION,
            }
        } else {
            KvmDevice::Missing
        };
        let flags = cpu_flags(&root.join("proc/cpuinfo"));
        let has = |f: &str| flags.iter().any(|x| x == f);
        let pvm_native = fs::read_to_string(root.join("sys/module/kvm_pvm/parameters/pvm_native"))
            .map(|s| matches!(s.trim(), "Y" | "y" | "1"))
            .unwrap_or(false);
        HostFacts {
            device,
            pvm_module: root.join("sys/module/kvm_pvm").exists(),
            pvm_native,
            kvm_intel: root.join("sys/module/kvm_intel").exists(),
            kvm_amd: root.join("sys/module/kvm_amd").exists(),
            cpu_vmx: has("vmx"),
            cpu_svm: has("svm"),
        }
    }

    fn hardware_virt(&self) -> bool {
        self.kvm_intel || self.kvm_amd || self.cpu_vmx || self.cpu_svm
    }
}

fn probe_device() -> KvmDevice {
    match kvm_ioctls::Kvm::new() {
        Ok(kvm) => KvmDevice::Opened {
            api_version: kvm.get_api_version(),
        },
        Err(e) => match e.errno() {
            libc::ENOENT | libc::ENODEV | libc::ENXIO => KvmDevice::Missing,
            libc::EACCES | libc::EPERM => KvmDevice::PermissionDenied,
            _ => KvmDevice::OpenFailed(io::Error::from_raw_os_error(e.errno()).to_string()),
        },
    }
}

/// The `flags` words of the first processor in a cpuinfo file (empty when unreadable).
fn cpu_flags(path: &Path) -> Vec<String> {
    let Ok(text) = fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "flags").then(|| value.split_whitespace().map(str::to_string).collect())
        })
        .unwrap_or_default()
}

/// The verdict for `facts`. Only a host whose `/dev/kvm` is backed by hardware virtualization
/// is OK; every other case says what is wrong and what would fix it.
pub fn classify(facts: &HostFacts) -> Availability {
    let api_version = match &facts.device {
        KvmDevice::Missing => {
            return Availability::no(
                "no /dev/kvm: the kvm module is not loaded or this host has no virtualization \
                 support (enable VT-x/AMD-V, load kvm_intel or kvm_amd)",
            );
        }
        KvmDevice::PermissionDenied => {
            return Availability::no(
                "/dev/kvm exists but permission to open it was denied: add this user to the \
                 kvm group or grant rw access to /dev/kvm",
            );
        }
        KvmDevice::OpenFailed(msg) => {
            return Availability::no(format!("/dev/kvm could not be opened: {msg}"));
        }
        KvmDevice::Opened { api_version } => *api_version,
    };
    if api_version != KVM_API_VERSION {
        return Availability::no(format!(
            "KVM API version mismatch: /dev/kvm reports {api_version}, this build requires \
             {KVM_API_VERSION}"
        ));
    }
    if facts.pvm_module && facts.pvm_native && !facts.cpu_vmx && !facts.cpu_svm {
        return Availability::no(
            "/dev/kvm is kvm_pvm in native mode on a CPU without vmx/svm: guest kernels are \
             emulated and guest user space cannot run, so no microVM can boot here",
        );
    }
    if facts.hardware_virt() {
        let kind = if facts.kvm_intel || facts.cpu_vmx {
            "Intel VT-x (kvm_intel)"
        } else {
            "AMD-V (kvm_amd)"
        };
        return Availability::yes(format!(
            "/dev/kvm API {api_version} backed by hardware virtualization: {kind}"
        ));
    }
    if facts.pvm_module {
        return Availability::no(
            "/dev/kvm is kvm_pvm (paravirtualized, not native): it needs PVM-enabled guest \
             kernels, which this build does not provide",
        );
    }
    Availability::no(
        "/dev/kvm opened but no hardware virtualization was found (no kvm_intel/kvm_amd module, \
         no vmx/svm CPU flag)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hardware_intel() -> HostFacts {
        HostFacts {
            device: KvmDevice::Opened { api_version: 12 },
            pvm_module: false,
            pvm_native: false,
            kvm_intel: true,
            kvm_amd: false,
            cpu_vmx: true,
            cpu_svm: false,
        }
    }

    fn pvm_native() -> HostFacts {
        HostFacts {
            pvm_module: true,
            pvm_native: true,
            kvm_intel: false,
            cpu_vmx: false,
            ..hardware_intel()
        }
    }

    #[test]
    fn missing_device() {
        let a = classify(&HostFacts {
            device: KvmDevice::Missing,
            ..hardware_intel()
        });
        assert!(!a.ok);
        assert!(a.detail.contains("no /dev/kvm"), "{}", a.detail);
    }

    #[test]
    fn permission_denied() {
        let a = classify(&HostFacts {
            device: KvmDevice::PermissionDenied,
            ..hardware_intel()
        });
        assert!(!a.ok);
        assert!(a.detail.contains("permission"), "{}", a.detail);
    }

    #[test]
    fn other_open_failure_carries_the_message() {
        let facts = HostFacts {
            device: KvmDevice::OpenFailed("boom".into()),
            ..hardware_intel()
        };
        let a = classify(&facts);
        assert!(!a.ok);
        assert!(a.detail.contains("boom"), "{}", a.detail);
    }

    #[test]
    fn api_version_mismatch() {
        let facts = HostFacts {
            device: KvmDevice::Opened { api_version: 11 },
            ..hardware_intel()
        };
        let a = classify(&facts);
        assert!(!a.ok);
        assert!(a.detail.contains("API version mismatch"), "{}", a.detail);
        assert!(a.detail.contains("11"), "{}", a.detail);
    }

    #[test]
    fn pvm_native_without_vmx_is_refused() {
        let a = classify(&pvm_native());
        assert!(!a.ok);
        assert!(
            a.detail.contains("PVM") || a.detail.contains("kvm_pvm"),
            "{}",
            a.detail
        );
        assert!(
            a.detail.contains("guest user space cannot run"),
            "{}",
            a.detail
        );
    }

    #[test]
    fn pvm_module_with_vmx_counts_as_hardware() {
        let facts = HostFacts {
            cpu_vmx: true,
            ..pvm_native()
        };
        assert!(classify(&facts).ok);
    }

    #[test]
    fn pvm_non_native_is_refused() {
        let facts = HostFacts {
            pvm_native: false,
            ..pvm_native()
        };
        let a = classify(&facts);
        assert!(!a.ok);
        assert!(a.detail.contains("not native"), "{}", a.detail);
    }

    #[test]
    fn hardware_intel_and_amd_are_ok() {
        let a = classify(&hardware_intel());
        assert!(a.ok, "{}", a.detail);
        assert!(a.detail.contains("VT-x"), "{}", a.detail);
        let amd = HostFacts {
            kvm_intel: false,
            cpu_vmx: false,
            kvm_amd: true,
            cpu_svm: true,
            ..hardware_intel()
        };
        let a = classify(&amd);
        assert!(a.ok, "{}", a.detail);
        assert!(a.detail.contains("AMD-V"), "{}", a.detail);
    }

    #[test]
    fn no_hardware_and_no_pvm_is_refused() {
        let facts = HostFacts {
            kvm_intel: false,
            cpu_vmx: false,
            ..hardware_intel()
        };
        let a = classify(&facts);
        assert!(!a.ok);
        assert!(
            a.detail.contains("no hardware virtualization"),
            "{}",
            a.detail
        );
    }

    #[test]
    fn gather_reads_a_sysfs_fixture() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("sys/module/kvm_pvm/parameters")).unwrap();
        fs::write(root.join("sys/module/kvm_pvm/parameters/pvm_native"), "Y\n").unwrap();
        fs::create_dir_all(root.join("proc")).unwrap();
        fs::write(
            root.join("proc/cpuinfo"),
            "processor\t: 0\nflags\t\t: fpu sse2 hypervisor\n\nprocessor\t: 1\nflags\t\t: fpu\n",
        )
        .unwrap();
        fs::create_dir_all(root.join("dev")).unwrap();
        fs::write(root.join("dev/kvm"), "").unwrap();
        let facts = HostFacts::gather_from(root);
        assert_eq!(facts, pvm_native_fixture());
        fs::write(root.join("proc/cpuinfo"), "flags\t: fpu vmx\n").unwrap();
        assert!(HostFacts::gather_from(root).cpu_vmx);
    }

    fn pvm_native_fixture() -> HostFacts {
        HostFacts {
            device: KvmDevice::Opened {
                api_version: KVM_API_VERSION,
            },
            pvm_module: true,
            pvm_native: true,
            kvm_intel: false,
            kvm_amd: false,
            cpu_vmx: false,
            cpu_svm: false,
        }
    }

    /// This development host is documented (shared/ENVIRONMENT.md) as kvm_pvm in native mode.
    #[test]
    fn this_host_is_reported_as_pvm_native() {
        let facts = HostFacts::gather();
        if !facts.pvm_module {
            let msg = "SKIP this_host_is_reported_as_pvm_native: host has no kvm_pvm module";
            crate::test_support::skip(msg);
            return;
        }
        let a = classify(&facts);
        assert!(!a.ok, "{}", a.detail);
        assert!(a.detail.contains("native mode"), "{}", a.detail);
    }
}
