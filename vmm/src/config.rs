//! VM configuration and kernel command line construction.

use std::fmt;
use std::io::Write;
use std::path::PathBuf;

use crate::boot::KernelFormat;
use crate::cpuid;
use crate::layout::{VIRTIO_GSI_BASE, VIRTIO_MMIO_SIZE, virtio_mmio_base};
use crate::serial::DEFAULT_RING_BYTES;
use crate::virtio::DeviceConfig;

/// Which CPU model the guest sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CpuProfile {
    /// [`CpuProfile::Baseline`] on a PVM-native host, [`CpuProfile::Host`] otherwise.
    #[default]
    Auto,
    /// Everything KVM supports.
    Host,
    /// Hides CX16 (cmpxchg16b), XSAVE, AVX*, BMI*, POPCNT, FSGSBASE, SMAP/SMEP, ERMS/FSRM, RDRAND/RDSEED, MOVBE,
    /// PCID/INVPCID, UMIP, RDPID and ABM, which KVM's emulator on a PVM host cannot execute at
    /// CPL0; the command line also gets `noxsave clearcpuid=...` and calibration shortcuts.
    Baseline,
}

impl CpuProfile {
    /// Resolve `Auto` for this host.
    pub fn resolve(self) -> CpuProfile {
        match self {
            CpuProfile::Auto if cpuid::host_is_pvm_native() => CpuProfile::Baseline,
            CpuProfile::Auto => CpuProfile::Host,
            p => p,
        }
    }

    /// Parse `auto`, `host` or `baseline`.
    pub fn parse(s: &str) -> Option<CpuProfile> {
        match s {
            "auto" => Some(CpuProfile::Auto),
            "host" => Some(CpuProfile::Host),
            "baseline" => Some(CpuProfile::Baseline),
            _ => None,
        }
    }
}

/// Where console output goes.
pub struct ConsoleConfig {
    /// Size of the ring buffer holding the newest console bytes.
    pub ring_bytes: usize,
    /// Optional writer that also receives all output (line buffered).
    pub sink: Option<Box<dyn Write + Send>>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            ring_bytes: DEFAULT_RING_BYTES,
            sink: None,
        }
    }
}

impl fmt::Debug for ConsoleConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsoleConfig")
            .field("ring_bytes", &self.ring_bytes)
            .field("sink", &self.sink.is_some())
            .finish()
    }
}

/// Everything needed to create a VM. Serialisable (it is what `vm-vmm` reads from its
/// launcher, inside [`crate::process::ProcessConfig`]) except the console, which belongs to the
/// process that runs the VM.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct VmConfig {
    /// Guest RAM in MiB; the guest gets exactly this much (hard cap).
    pub mem_mib: u32,
    /// vCPUs (1..=32).
    pub vcpus: u8,
    /// Kernel: ELF vmlinux or bzImage (or raw code with [`KernelFormat::Raw`]).
    pub kernel: PathBuf,
    /// How to read `kernel`.
    pub kernel_format: KernelFormat,
    /// Optional initrd.
    pub initrd: Option<PathBuf>,
    /// Appended to the default command line.
    pub cmdline: String,
    /// CPU model.
    pub cpu_profile: CpuProfile,
    /// virtio-mmio devices, in order: device `i` at 0xd000_0000 + i*0x1000, GSI 5+i.
    pub devices: Vec<DeviceConfig>,
    /// Console capture (not serialised: each process sets its own).
    #[serde(skip)]
    pub console: ConsoleConfig,
}

impl Default for VmConfig {
    fn default() -> Self {
        Self {
            mem_mib: 128,
            vcpus: 1,
            kernel: PathBuf::new(),
            kernel_format: KernelFormat::Auto,
            initrd: None,
            cmdline: String::new(),
            cpu_profile: CpuProfile::Auto,
            devices: Vec::new(),
            console: ConsoleConfig::default(),
        }
    }
}

/// The command line every guest gets.
pub const DEFAULT_CMDLINE: &str =
    "console=ttyS0 reboot=k panic=-1 i8042.noaux i8042.nomux i8042.dumbkbd";

/// Extra words for the baseline profile: hide what the PVM emulator cannot run, and skip
/// calibration loops that take minutes when interpreted.
pub fn baseline_cmdline() -> String {
    format!(
        "noxsave clearcpuid={} mitigations=off lpj=1000000 tsc=reliable no_timer_check",
        cpuid::baseline_clearcpuid()
    )
}

/// `virtio_mmio.device=` entry of device `index`.
pub fn virtio_mmio_arg(index: usize) -> String {
    format!(
        "virtio_mmio.device={}K@{:#x}:{}",
        VIRTIO_MMIO_SIZE / 1024,
        virtio_mmio_base(index),
        VIRTIO_GSI_BASE + index as u32
    )
}

/// Full command line: defaults, profile words, one entry per virtio device, then the user's.
pub fn build_cmdline(profile: CpuProfile, devices: usize, user: &str) -> String {
    let mut words = vec![DEFAULT_CMDLINE.to_string()];
    if profile == CpuProfile::Baseline {
        words.push(baseline_cmdline());
    }
    words.extend((0..devices).map(virtio_mmio_arg));
    let user = user.trim();
    if !user.is_empty() {
        words.push(user.to_string());
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_for_host_profile_with_devices() {
        let c = build_cmdline(CpuProfile::Host, 2, " vm.hostname=x ");
        assert_eq!(
            c,
            "console=ttyS0 reboot=k panic=-1 i8042.noaux i8042.nomux i8042.dumbkbd \
             virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6 vm.hostname=x"
        );
    }

    #[test]
    fn cmdline_for_baseline_profile() {
        let c = build_cmdline(CpuProfile::Baseline, 0, "");
        assert!(c.starts_with(DEFAULT_CMDLINE));
        assert!(c.contains(" noxsave clearcpuid=cx16,pcid,movbe,popcnt,avx,rdrand,fsgsbase,bmi1,avx2,smep,bmi2,erms,invpcid,rdseed,smap,umip,rdpid,fsrm,abm "));
        assert!(c.ends_with("mitigations=off lpj=1000000 tsc=reliable no_timer_check"));
    }

    #[test]
    fn profile_parse_and_resolve() {
        assert_eq!(CpuProfile::parse("baseline"), Some(CpuProfile::Baseline));
        assert_eq!(CpuProfile::parse("x"), None);
        assert_eq!(CpuProfile::Host.resolve(), CpuProfile::Host);
        let auto = CpuProfile::Auto.resolve();
        assert_eq!(auto == CpuProfile::Baseline, cpuid::host_is_pvm_native());
    }
}
