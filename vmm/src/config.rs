//! VM configuration and kernel command line construction.

use std::fmt;
use std::io::Write;

use crate::cpuid;
use crate::layout::{VIRTIO_GSI_BASE, VIRTIO_MMIO_SIZE, virtio_mmio_base};
use crate::serial::DEFAULT_RING_BYTES;

pub use vm_vmm_protocol::config::{CpuProfile, VmConfig};

/// `profile` with `Auto` decided for this host: [`CpuProfile::Baseline`] on a PVM-native host,
/// [`CpuProfile::Host`] otherwise.
pub fn resolve(profile: CpuProfile) -> CpuProfile {
    match profile {
        CpuProfile::Auto if cpuid::host_is_pvm_native() => CpuProfile::Baseline,
        CpuProfile::Auto => CpuProfile::Host,
        p => p,
    }
}

/// Where console output goes: the process that runs the VM decides, so it is no part of the
/// [`VmConfig`] a launcher sends.
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
    fn auto_resolves_for_this_host() {
        assert_eq!(resolve(CpuProfile::Host), CpuProfile::Host);
        let auto = resolve(CpuProfile::Auto);
        assert_eq!(auto == CpuProfile::Baseline, cpuid::host_is_pvm_native());
    }
}
