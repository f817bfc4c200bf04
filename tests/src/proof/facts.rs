//! Host facts for the kvm proof: what the CPU, the kernel modules, `/dev/kvm` and the machine
//! size say, read from procfs/sysfs text by pure parsers (unit-tested with fabricated text)
//! and judged by the kvm driver's own verdict ([`vm_drivers::kvm::classify`]), so the proof
//! and `vm drivers` can never disagree about whether this host runs kvm.

use std::fs;
use std::path::Path;

use serde::Serialize;
use vm_drivers::kvm::{HostFacts, KvmDevice, classify};

/// What `/proc/cpuinfo` says about the first processor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CpuInfo {
    /// `vendor_id` (`GenuineIntel`, `AuthenticAMD`, ...), empty when absent.
    pub vendor: String,
    /// `model name`, empty when absent.
    pub model: String,
    /// Number of `processor` entries.
    pub processors: usize,
    /// `vmx` is among the flags (Intel VT-x).
    pub vmx: bool,
    /// `svm` is among the flags (AMD-V).
    pub svm: bool,
}

/// Parses the text of `/proc/cpuinfo`.
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    let mut first_flags: Option<Vec<&str>> = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "processor" => info.processors += 1,
            "vendor_id" if info.vendor.is_empty() => info.vendor = value.to_string(),
            "model name" if info.model.is_empty() => info.model = value.to_string(),
            "flags" if first_flags.is_none() => {
                first_flags = Some(value.split_whitespace().collect());
            }
            _ => {}
        }
    }
    let flags = first_flags.unwrap_or_default();
    info.vmx = flags.contains(&"vmx");
    info.svm = flags.contains(&"svm");
    info
}

/// `MemTotal` of a `/proc/meminfo` text, in MiB.
pub fn parse_mem_total_mib(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => Some(kib / 1024),
        Some(_) => None,
    }
}

/// Everything the proof reports about the host, and the kvm verdict over it.
#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    pub cpu: CpuInfo,
    /// The kvm module that is loaded: `kvm_intel`, `kvm_amd`, `kvm_pvm` (with `native` when
    /// PVM runs in native mode), or `none`.
    pub kvm_module: String,
    /// What opening `/dev/kvm` showed.
    pub dev_kvm: String,
    /// CPUs this process may run on.
    pub cores: usize,
    /// Total memory.
    pub mem_total_mib: Option<u64>,
    /// The kvm driver can run guests here.
    pub kvm_ok: bool,
    /// The kvm driver's own words (why not, when it cannot).
    pub kvm_detail: String,
}

impl HostReport {
    /// Reads this host (`root` = `/`) or a fixture tree laid out like one.
    pub fn gather_from(root: &Path) -> HostReport {
        let read = |p: &str| fs::read_to_string(root.join(p)).unwrap_or_default();
        let facts = HostFacts::gather_from(root);
        let verdict = classify(&facts);
        let cpu = parse_cpuinfo(&read("proc/cpuinfo"));
        let cores = if root == Path::new("/") {
            std::thread::available_parallelism().map_or(cpu.processors, |n| n.get())
        } else {
            cpu.processors
        };
        HostReport {
            kvm_module: kvm_module(&facts),
            dev_kvm: describe_device(&facts.device),
            mem_total_mib: parse_mem_total_mib(&read("proc/meminfo")),
            cores,
            cpu,
            kvm_ok: verdict.ok,
            kvm_detail: verdict.detail,
        }
    }

    /// The lines the runner prints and the summary starts with.
    pub fn lines(&self) -> Vec<String> {
        let mem = self
            .mem_total_mib
            .map_or_else(|| "unknown".to_string(), |m| format!("{m} MiB"));
        vec![
            format!("cpu:        {} ({})", self.cpu.model, self.cpu.vendor),
            format!(
                "virt flags: vmx={} svm={}",
                yes_no(self.cpu.vmx),
                yes_no(self.cpu.svm)
            ),
            format!("kvm module: {}", self.kvm_module),
            format!("/dev/kvm:   {}", self.dev_kvm),
            format!("cores:      {}", self.cores),
            format!("memory:     {mem}"),
            format!(
                "kvm driver: {} ({})",
                if self.kvm_ok {
                    "available"
                } else {
                    "unavailable"
                },
                self.kvm_detail
            ),
        ]
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn kvm_module(f: &HostFacts) -> String {
    let mut found = Vec::new();
    if f.kvm_intel {
        found.push("kvm_intel".to_string());
    }
    if f.kvm_amd {
        found.push("kvm_amd".to_string());
    }
    if f.pvm_module {
        found.push(
            if f.pvm_native {
                "kvm_pvm (native)"
            } else {
                "kvm_pvm"
            }
            .to_string(),
        );
    }
    if found.is_empty() {
        "none".into()
    } else {
        found.join(", ")
    }
}

fn describe_device(d: &KvmDevice) -> String {
    match d {
        KvmDevice::Missing => "missing".into(),
        KvmDevice::PermissionDenied => "present, permission denied".into(),
        KvmDevice::OpenFailed(e) => format!("open failed: {e}"),
        KvmDevice::Opened { api_version } => format!("opened, API version {api_version}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTEL: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\nflags\t\t: fpu vme vmx sse2 popcnt\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\nflags\t\t: fpu vme vmx sse2 popcnt\n";
    const AMD: &str =
        "processor : 0\nvendor_id : AuthenticAMD\nmodel name : AMD EPYC 9654\nflags : fpu svm lm\n";
    const PVM: &str = "processor : 0\nvendor_id : GenuineIntel\nmodel name : Intel Xeon Processor\nflags : fpu sse2 hypervisor\n";

    #[test]
    fn cpuinfo_intel_amd_and_pvm() {
        let i = parse_cpuinfo(INTEL);
        assert_eq!(i.vendor, "GenuineIntel");
        assert_eq!(i.model, "Intel(R) Xeon(R) Platinum 8480C");
        assert_eq!(i.processors, 2);
        assert!(i.vmx && !i.svm);
        let a = parse_cpuinfo(AMD);
        assert_eq!(
            (a.vendor.as_str(), a.vmx, a.svm),
            ("AuthenticAMD", false, true)
        );
        let p = parse_cpuinfo(PVM);
        assert!(!p.vmx && !p.svm);
        assert_eq!(parse_cpuinfo(""), CpuInfo::default());
    }

    #[test]
    fn a_flag_must_be_a_whole_word() {
        // "vmx" inside another flag (or in the model name) is not VT-x.
        let t = "vendor_id : X\nmodel name : vmx svm box\nflags : vmxnope nosvm\n";
        let c = parse_cpuinfo(t);
        assert!(!c.vmx && !c.svm);
    }

    #[test]
    fn meminfo_total() {
        assert_eq!(
            parse_mem_total_mib("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24000)
        );
        assert_eq!(parse_mem_total_mib("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total_mib("MemTotal: lots kB\n"), None);
        assert_eq!(parse_mem_total_mib("MemTotal: 5 MB\n"), None);
    }

    fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn a_pvm_native_host_cannot_run_kvm_and_says_why() {
        let root = fixture(&[
            ("proc/cpuinfo", PVM),
            ("proc/meminfo", "MemTotal: 2097152 kB\n"),
            ("sys/module/kvm_pvm/parameters/pvm_native", "Y\n"),
            ("dev/kvm", ""),
        ]);
        let r = HostReport::gather_from(root.path());
        assert!(!r.kvm_ok);
        assert_eq!(r.kvm_module, "kvm_pvm (native)");
        assert!(
            r.kvm_detail.contains("kvm_pvm in native mode"),
            "{}",
            r.kvm_detail
        );
        assert_eq!(r.mem_total_mib, Some(2048));
        assert_eq!(r.cores, 1);
        let text = r.lines().join("\n");
        assert!(text.contains("kvm driver: unavailable ("), "{text}");
    }

    #[test]
    fn a_vmx_host_with_kvm_intel_can() {
        let root = fixture(&[
            ("proc/cpuinfo", INTEL),
            ("sys/module/kvm_intel/parameters/nested", "N\n"),
            ("dev/kvm", ""),
        ]);
        let r = HostReport::gather_from(root.path());
        assert!(r.kvm_ok, "{}", r.kvm_detail);
        assert_eq!(r.kvm_module, "kvm_intel");
        assert_eq!(r.dev_kvm, "opened, API version 12");
        assert_eq!(r.cores, 2);
    }

    #[test]
    fn no_dev_kvm_is_unavailable() {
        let root = fixture(&[("proc/cpuinfo", AMD), ("sys/module/kvm_amd/x", "")]);
        let r = HostReport::gather_from(root.path());
        assert!(!r.kvm_ok);
        assert_eq!(r.dev_kvm, "missing");
    }
}
