//! Boot-time MSR values and local APIC LINT0/LINT1 setup.

use kvm_bindings::{
    KVM_CAP_PMU_CAPABILITY, KVM_PMU_CAP_DISABLE, Msrs, kvm_enable_cap, kvm_lapic_state,
    kvm_msr_entry,
};
use kvm_ioctls::{Cap, Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VmFd};

/// IA32_SYSENTER_CS.
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
/// IA32_SYSENTER_ESP.
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
/// IA32_SYSENTER_EIP.
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
/// STAR.
pub const MSR_STAR: u32 = 0xc000_0081;
/// LSTAR.
pub const MSR_LSTAR: u32 = 0xc000_0082;
/// CSTAR.
pub const MSR_CSTAR: u32 = 0xc000_0083;
/// SYSCALL_MASK.
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
/// KERNEL_GS_BASE.
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
/// TSC.
pub const MSR_IA32_TSC: u32 = 0x10;
/// MISC_ENABLE.
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
/// MISC_ENABLE: fast strings.
pub const MISC_ENABLE_FAST_STRING: u64 = 1;
/// MTRR default type.
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;

/// The performance-monitoring MSRs the guest is denied (base, count) where KVM can only keep
/// it off the PMU by an MSR filter: AMD's legacy K7 counters (`PERF_CTL0..3`, `PERF_CTR0..3`)
/// and its core counters (`PERF_CTL0..5` / `PERF_CTR0..5`, interleaved). The CPUID table
/// already says "no PMU extensions" ([`crate::cpuid::ALWAYS_HIDDEN`]), but Linux still probes
/// the legacy counters on AMD. (Intel guests see CPUID leaf 0xa's version 0 and do not probe.)
pub const PMU_MSR_RANGES: &[(u32, u32)] = &[(0xc001_0000, 8), (0xc001_0200, 12)];

/// Where the host says whether KVM offers guests a virtual PMU at all.
const ENABLE_PMU_PARAM: &str = "/sys/module/kvm/parameters/enable_pmu";

/// How a VM is kept off the host's performance counters (no counter state shared with the
/// host, no perf events created on the guest's behalf), cheapest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmuFence {
    /// KVM offers no guest a PMU on this host (`kvm.enable_pmu=N`): nothing to do.
    HostOff,
    /// The VM's PMU is disabled before any vCPU exists (`KVM_CAP_PMU_CAPABILITY`, Linux
    /// 5.18+): its MSRs read 0 and ignore writes.
    Disabled,
    /// Every MSR of [`PMU_MSR_RANGES`] is denied (#GP) by an MSR filter: kernels older than
    /// the capability. Installing a filter waits for an SRCU grace period (~12 ms measured
    /// here), which is why it comes last.
    Filtered,
    /// KVM has none of these (pre-5.10 kernels): the hidden CPUID bits are all there is.
    Unfenced,
}

impl PmuFence {
    /// The fence for a host: `enable_pmu` is the module parameter (`None` where the kernel
    /// has none, before 5.17), `pmu_caps` what `KVM_CAP_PMU_CAPABILITY` reports (0 where
    /// unknown or where the host's PMU is off), `has_filter` whether
    /// `KVM_CAP_X86_MSR_FILTER` exists.
    pub fn choose(enable_pmu: Option<bool>, pmu_caps: i32, has_filter: bool) -> Self {
        if enable_pmu == Some(false) {
            PmuFence::HostOff
        } else if pmu_caps > 0 && pmu_caps as u32 & KVM_PMU_CAP_DISABLE != 0 {
            PmuFence::Disabled
        } else if has_filter {
            PmuFence::Filtered
        } else {
            PmuFence::Unfenced
        }
    }
}

/// Reads the host's `kvm.enable_pmu` (`None` where absent or unreadable).
fn host_enable_pmu() -> Option<bool> {
    let v = std::fs::read_to_string(ENABLE_PMU_PARAM).ok()?;
    match v.trim() {
        "Y" | "y" | "1" => Some(true),
        "N" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// Keeps a new VM (no vCPU created yet) off the host's performance counters, the cheapest
/// way this host allows ([`PmuFence`]), and says which way.
pub fn fence_pmu(kvm: &Kvm, vm: &VmFd) -> Result<PmuFence, kvm_ioctls::Error> {
    let fence = PmuFence::choose(
        host_enable_pmu(),
        kvm.check_extension_raw(KVM_CAP_PMU_CAPABILITY.into()),
        kvm.check_extension(Cap::X86MsrFilter),
    );
    match fence {
        PmuFence::HostOff | PmuFence::Unfenced => {}
        PmuFence::Disabled => {
            let mut cap = kvm_enable_cap {
                cap: KVM_CAP_PMU_CAPABILITY,
                ..Default::default()
            };
            cap.args[0] = KVM_PMU_CAP_DISABLE.into();
            vm.enable_cap(&cap)?;
        }
        PmuFence::Filtered => deny_pmu_msrs(vm)?,
    }
    Ok(fence)
}

/// Denies the guest every MSR of [`PMU_MSR_RANGES`] (reads and writes); every other MSR is
/// as KVM handles it.
fn deny_pmu_msrs(vm: &VmFd) -> Result<(), kvm_ioctls::Error> {
    // One bit per MSR, 0 = denied; 12 MSRs fit in two bytes.
    let denied = [0u8; 2];
    let ranges: Vec<MsrFilterRange<'_>> = PMU_MSR_RANGES
        .iter()
        .map(|&(base, msr_count)| MsrFilterRange {
            flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
            base,
            msr_count,
            bitmap: &denied,
        })
        .collect();
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &ranges)
}

/// Errors of programming MSRs or the LAPIC.
#[derive(Debug, thiserror::Error)]
pub enum MsrError {
    /// Building the FAM wrapper failed.
    #[error("cannot build the MSR list")]
    Build(#[source] vmm_sys_util::fam::Error),
}

/// (index, value) of every MSR set at boot.
pub fn boot_msr_values() -> Vec<(u32, u64)> {
    vec![
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        // MTRRs enabled, default type write-back.
        (MSR_MTRR_DEF_TYPE, (1 << 11) | 6),
    ]
}

/// The boot MSRs as a KVM_SET_MSRS argument.
pub fn boot_msrs() -> Result<Msrs, MsrError> {
    let entries: Vec<kvm_msr_entry> = boot_msr_values()
        .into_iter()
        .map(|(index, data)| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        })
        .collect();
    Msrs::from_entries(&entries).map_err(MsrError::Build)
}

/// LVT LINT0 register offset.
const APIC_LVT0: usize = 0x350;
/// LVT LINT1 register offset.
const APIC_LVT1: usize = 0x360;
/// Delivery mode ExtINT.
const APIC_MODE_EXTINT: u32 = 0x7;
/// Delivery mode NMI.
const APIC_MODE_NMI: u32 = 0x4;

fn get_reg(lapic: &kvm_lapic_state, off: usize) -> u32 {
    let b = &lapic.regs[off..off + 4];
    u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
}

fn set_reg(lapic: &mut kvm_lapic_state, off: usize, v: u32) {
    for (i, byte) in v.to_le_bytes().iter().enumerate() {
        lapic.regs[off + i] = *byte as _;
    }
}

fn with_delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

/// LINT0 -> ExtINT (the PIC), LINT1 -> NMI, as a BIOS would leave them.
pub fn setup_lint(lapic: &mut kvm_lapic_state) {
    let lvt0 = get_reg(lapic, APIC_LVT0);
    set_reg(lapic, APIC_LVT0, with_delivery_mode(lvt0, APIC_MODE_EXTINT));
    let lvt1 = get_reg(lapic, APIC_LVT1);
    set_reg(lapic, APIC_LVT1, with_delivery_mode(lvt1, APIC_MODE_NMI));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pmu_fence_is_the_cheapest_the_host_allows() {
        use PmuFence::*;
        let disable = KVM_PMU_CAP_DISABLE as i32;
        // The host's PMU off wins over everything: nothing to fence.
        assert_eq!(PmuFence::choose(Some(false), 0, true), HostOff);
        assert_eq!(PmuFence::choose(Some(false), disable, true), HostOff);
        // Otherwise the per-VM disable, then the filter, then nothing.
        assert_eq!(PmuFence::choose(Some(true), disable, true), Disabled);
        assert_eq!(PmuFence::choose(None, disable, false), Disabled);
        assert_eq!(PmuFence::choose(Some(true), 0, true), Filtered);
        assert_eq!(PmuFence::choose(None, 0, true), Filtered);
        // A capability without the disable bit, or an error, is no capability.
        assert_eq!(PmuFence::choose(Some(true), 2, true), Filtered);
        assert_eq!(PmuFence::choose(Some(true), -1, true), Filtered);
        assert_eq!(PmuFence::choose(None, 0, false), Unfenced);
    }

    #[test]
    fn boot_msrs_have_fast_strings_and_zero_syscall_state() {
        let v = boot_msr_values();
        assert!(v.contains(&(MSR_IA32_MISC_ENABLE, 1)));
        assert!(v.contains(&(MSR_LSTAR, 0)) && v.contains(&(MSR_IA32_TSC, 0)));
        assert_eq!(boot_msrs().unwrap().as_slice().len(), v.len());
    }

    #[test]
    fn lint_delivery_modes() {
        let mut l = kvm_lapic_state::default();
        set_reg(&mut l, APIC_LVT0, 0x0001_0000); // masked
        setup_lint(&mut l);
        assert_eq!(get_reg(&l, APIC_LVT0), 0x0001_0700);
        assert_eq!(get_reg(&l, APIC_LVT1), 0x400);
    }
}
