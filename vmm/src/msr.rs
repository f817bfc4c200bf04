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

/// The performance-monitoring MSRs the guest is denied (base, count): AMD's legacy K7
/// counters (`PERF_CTL0..3`, `PERF_CTR0..3`) and its core counters (`PERF_CTL0..5` /
/// `PERF_CTR0..5`, interleaved). The CPUID table already says "no PMU extensions"
/// ([`crate::cpuid::ALWAYS_HIDDEN`]), but Linux still probes the legacy counters on AMD: denied,
/// KVM injects #GP and the guest uses software events only, where a vPMU that is merely off
/// ignores the write and logs an "unhandled WRMSR" in the host's log at every boot. (Intel
/// guests see CPUID leaf 0xa's version 0 and do not probe.)
pub const PMU_MSR_RANGES: &[(u32, u32)] = &[(0xc001_0000, 8), (0xc001_0200, 12)];

/// How a VM is kept off the host's performance counters: no counter state shared with the
/// host, no perf events created on the guest's behalf, nothing in the host's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmuFence {
    /// The VM has no vPMU (`KVM_CAP_PMU_CAPABILITY`, Linux 5.18+, set before any vCPU
    /// exists; a host with `kvm.enable_pmu=N` offers none to begin with).
    pub vpmu_disabled: bool,
    /// The PMU's MSRs ([`PMU_MSR_RANGES`]) raise #GP (`KVM_X86_SET_MSR_FILTER`, Linux 5.10+).
    /// Installing a filter waits for an SRCU grace period (~11 ms measured here): the VM
    /// installs it beside its memory slots, which wait for one too.
    pub msrs_denied: bool,
}

impl PmuFence {
    /// What this host's KVM can do: `pmu_caps` is what `KVM_CAP_PMU_CAPABILITY` reports (0
    /// where unknown or where the host's vPMU is off), `has_filter` whether
    /// `KVM_CAP_X86_MSR_FILTER` exists.
    pub fn plan(pmu_caps: i32, has_filter: bool) -> Self {
        PmuFence {
            vpmu_disabled: pmu_caps > 0 && pmu_caps as u32 & KVM_PMU_CAP_DISABLE != 0,
            msrs_denied: has_filter,
        }
    }
}

/// Keeps a new VM (no vCPU created yet) off the host's performance counters as far as this
/// host's KVM allows ([`PmuFence`]), and says how.
pub fn fence_pmu(kvm: &Kvm, vm: &VmFd) -> Result<PmuFence, kvm_ioctls::Error> {
    let fence = PmuFence::plan(
        kvm.check_extension_raw(KVM_CAP_PMU_CAPABILITY.into()),
        kvm.check_extension(Cap::X86MsrFilter),
    );
    if fence.vpmu_disabled {
        let mut cap = kvm_enable_cap {
            cap: KVM_CAP_PMU_CAPABILITY,
            ..Default::default()
        };
        cap.args[0] = KVM_PMU_CAP_DISABLE.into();
        vm.enable_cap(&cap)?;
    }
    if fence.msrs_denied {
        deny_pmu_msrs(vm)?;
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
    fn the_pmu_fence_uses_what_kvm_has() {
        let disable = KVM_PMU_CAP_DISABLE as i32;
        let plan = |caps, filter| {
            let f = PmuFence::plan(caps, filter);
            (f.vpmu_disabled, f.msrs_denied)
        };
        assert_eq!(plan(disable, true), (true, true));
        assert_eq!(plan(disable, false), (true, false));
        // No capability (old kernel, or the host's vPMU off): the filter alone.
        assert_eq!(plan(0, true), (false, true));
        // A capability without the disable bit, or an error, is no capability.
        assert_eq!(plan(2, true), (false, true));
        assert_eq!(plan(-1, false), (false, false));
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
