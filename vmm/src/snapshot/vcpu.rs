//! One vCPU's state out of KVM and back in.
//!
//! [`save`] runs on the vCPU's own thread while it is parked (`Control::park`), as Firecracker
//! does: the thread owns its `VcpuFd`, and it has left `KVM_RUN` after completing any I/O or
//! MMIO exit still in flight ([`crate::sys::KickableVcpu::complete_pending_io`]), so the
//! registers are the guest's and not half of an emulated instruction. [`restore`] runs on the
//! thread that creates the vCPU, before it ever runs.
//!
//! The MSRs saved are [`REQUIRED_MSRS`] (the boot list of [`crate::msr`], the syscall and
//! sysenter MSRs, EFER, APIC base, PAT, TSC_DEADLINE, TSC_AUX, MISC_ENABLE) plus every MSR
//! of `KVM_GET_MSR_INDEX_LIST` except the PMU's (fenced off from the guest,
//! [`crate::msr::PMU_MSR_RANGES`]) and the VMX capability MSRs (nested virtualization is
//! hidden). One KVM refuses to read on this host is left out of the state (logged). On
//! restore the list is filtered as on save: a state that lists an excluded MSR is refused
//! when it is decoded (`InvalidState::ExcludedMsr`), so KVM is never asked to set one; KVM
//! must take every required MSR, and another it refuses is logged and skipped.
//!
//! Restore order: CPUID (set by the caller, exactly as at boot), MP state, regs, sregs, FPU,
//! XSAVE, XCRs, debug registers, LAPIC (after sregs, which carry the APIC base), MSRs (after
//! the LAPIC: TSC_DEADLINE needs its timer mode) and the vCPU events last (pending
//! exceptions and interrupts, on top of everything else).

use kvm_bindings::{Msrs, kvm_msr_entry};
use kvm_ioctls::{Cap, Kvm, VcpuFd};

use super::state::{FpuState, MsrEntry, VcpuState};
use crate::msr;

/// EFER.
pub const MSR_EFER: u32 = 0xc000_0080;
/// IA32_APIC_BASE.
pub const MSR_IA32_APICBASE: u32 = 0x1b;
/// IA32_PAT.
pub const MSR_IA32_CR_PAT: u32 = 0x277;
/// IA32_TSC_DEADLINE.
pub const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;
/// TSC_AUX (RDTSCP, RDPID).
pub const MSR_TSC_AUX: u32 = 0xc000_0103;
/// The VMX capability MSRs (IA32_VMX_BASIC ..= IA32_VMX_VMFUNC).
const VMX_MSRS: std::ops::RangeInclusive<u32> = 0x480..=0x491;
/// Most entries one KVM_GET_MSRS / KVM_SET_MSRS call takes (kvm-bindings' limit).
const MSR_BATCH: usize = kvm_bindings::KVM_MAX_MSR_ENTRIES;

/// MSRs every snapshot holds and every restore must set.
pub const REQUIRED_MSRS: &[u32] = &[
    msr::MSR_IA32_TSC,
    msr::MSR_IA32_SYSENTER_CS,
    msr::MSR_IA32_SYSENTER_ESP,
    msr::MSR_IA32_SYSENTER_EIP,
    msr::MSR_STAR,
    msr::MSR_LSTAR,
    msr::MSR_CSTAR,
    msr::MSR_SYSCALL_MASK,
    msr::MSR_KERNEL_GS_BASE,
    msr::MSR_IA32_MISC_ENABLE,
    MSR_EFER,
    MSR_IA32_APICBASE,
    MSR_IA32_CR_PAT,
    MSR_IA32_TSC_DEADLINE,
];

/// Errors of reading or setting one vCPU's state.
#[derive(Debug, thiserror::Error)]
pub enum VcpuStateError {
    /// A KVM vCPU ioctl failed.
    #[error("vcpu {vcpu}: {what} failed")]
    Kvm {
        /// vCPU index.
        vcpu: u8,
        /// The operation.
        what: &'static str,
        /// Cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A required MSR could not be read, or KVM refused to set it.
    #[error("vcpu {vcpu}: KVM refused required MSR {index:#x}")]
    RequiredMsr {
        /// vCPU index.
        vcpu: u8,
        /// MSR index.
        index: u32,
    },
    /// Building an MSR list failed.
    #[error("vcpu {vcpu}: cannot build the MSR list")]
    MsrList {
        /// vCPU index.
        vcpu: u8,
        /// Cause.
        #[source]
        source: vmm_sys_util::fam::Error,
    },
}

/// What [`save`] reads, decided once per snapshot from the KVM system fd.
#[derive(Clone, Debug)]
pub struct SavePlan {
    /// KVM has `KVM_CAP_XSAVE`.
    pub xsave: bool,
    /// KVM has `KVM_CAP_XCRS`.
    pub xcrs: bool,
    /// The MSRs to read ([`msrs_to_save`]).
    pub msrs: Vec<u32>,
}

impl SavePlan {
    /// The plan for this host's KVM.
    pub fn new(kvm: &Kvm) -> Self {
        Self {
            xsave: kvm.check_extension(Cap::Xsave),
            xcrs: kvm.check_extension(Cap::Xcrs),
            msrs: msrs_to_save(kvm),
        }
    }
}

/// Whether a snapshot leaves the MSR `index` out: the PMU's (fenced off from the guest) and
/// the VMX capability MSRs (nested virtualization is hidden). A save never reads one and a
/// state that lists one is refused (`InvalidState::ExcludedMsr`).
pub(crate) fn excluded(index: u32) -> bool {
    VMX_MSRS.contains(&index)
        || msr::PMU_MSR_RANGES
            .iter()
            .any(|&(base, n)| (base..base + n).contains(&index))
}

/// [`REQUIRED_MSRS`], then every other MSR of KVM's index list but the excluded ones.
pub fn msrs_to_save(kvm: &Kvm) -> Vec<u32> {
    let mut out = REQUIRED_MSRS.to_vec();
    match kvm.get_msr_index_list() {
        Ok(list) => {
            for &i in list.as_slice() {
                if !excluded(i) && !out.contains(&i) {
                    out.push(i);
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "KVM_GET_MSR_INDEX_LIST failed: required MSRs only"),
    }
    out
}

fn entries(vcpu: u8, list: &[kvm_msr_entry]) -> Result<Msrs, VcpuStateError> {
    Msrs::from_entries(list).map_err(|source| VcpuStateError::MsrList { vcpu, source })
}

/// Run `op` (KVM_GET_MSRS or KVM_SET_MSRS, which stop at the first MSR KVM refuses and return
/// how many they did) over `list` until every entry was done or refused, and return the
/// entries done (with the values read). A refused required MSR is an error; another is
/// logged and skipped.
fn each_msr(
    vcpu: u8,
    list: &[kvm_msr_entry],
    what: &'static str,
    mut op: impl FnMut(&mut Msrs) -> Result<usize, kvm_ioctls::Error>,
) -> Result<Vec<kvm_msr_entry>, VcpuStateError> {
    let (mut done, mut refused) = (Vec::new(), Vec::new());
    let mut rest = list;
    while !rest.is_empty() {
        let batch = &rest[..rest.len().min(MSR_BATCH)];
        let mut msrs = entries(vcpu, batch)?;
        let n = op(&mut msrs).map_err(|source| VcpuStateError::Kvm { vcpu, what, source })?;
        let n = n.min(batch.len());
        done.extend_from_slice(&msrs.as_slice()[..n]);
        if let Some(bad) = batch.get(n) {
            refused.push(bad.index);
            rest = &rest[n + 1..];
        } else {
            rest = &rest[n..];
        }
    }
    if let Some(&index) = refused.iter().find(|i| REQUIRED_MSRS.contains(i)) {
        return Err(VcpuStateError::RequiredMsr { vcpu, index });
    }
    if !refused.is_empty() {
        let refused: Vec<String> = refused.iter().map(|i| format!("{i:#x}")).collect();
        tracing::warn!(
            vcpu,
            op = what,
            ?refused,
            "KVM refused MSRs that are not required: skipped"
        );
    }
    Ok(done)
}

fn kvm_entries(msrs: impl Iterator<Item = MsrEntry>) -> Vec<kvm_msr_entry> {
    msrs.map(|e| kvm_msr_entry {
        index: e.index,
        data: e.data,
        ..Default::default()
    })
    .collect()
}

/// Read vCPU `index`'s state (on its own thread, parked, pending I/O completed).
pub fn save(fd: &VcpuFd, index: u8, plan: &SavePlan) -> Result<VcpuState, VcpuStateError> {
    let kvm = |what| {
        move |source| VcpuStateError::Kvm {
            vcpu: index,
            what,
            source,
        }
    };
    let mp_state = fd.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?;
    let regs = fd.get_regs().map_err(kvm("KVM_GET_REGS"))?;
    let sregs = fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    let fpu = FpuState::from(&fd.get_fpu().map_err(kvm("KVM_GET_FPU"))?);
    let xsave = match plan.xsave {
        true => Some(fd.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?),
        false => None,
    };
    let xcrs = match plan.xcrs {
        true => Some(fd.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?),
        false => None,
    };
    let debugregs = fd.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?;
    let lapic = fd.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?;
    let wanted = kvm_entries(plan.msrs.iter().map(|&index| MsrEntry { index, data: 0 }));
    let read = each_msr(index, &wanted, "KVM_GET_MSRS", |m| fd.get_msrs(m))?;
    let msrs = read
        .iter()
        .map(|e| MsrEntry {
            index: e.index,
            data: e.data,
        })
        .collect();
    let events = fd.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?;
    Ok(VcpuState {
        mp_state,
        regs,
        sregs,
        fpu,
        xsave,
        xcrs,
        debugregs,
        lapic,
        msrs,
        events,
    })
}

/// Set vCPU `index`'s saved state (its CPUID already set; see the module docs for the order).
pub fn restore(fd: &VcpuFd, index: u8, s: &VcpuState) -> Result<(), VcpuStateError> {
    let kvm = |what| {
        move |source| VcpuStateError::Kvm {
            vcpu: index,
            what,
            source,
        }
    };
    fd.set_mp_state(s.mp_state)
        .map_err(kvm("KVM_SET_MP_STATE"))?;
    fd.set_regs(&s.regs).map_err(kvm("KVM_SET_REGS"))?;
    fd.set_sregs(&s.sregs).map_err(kvm("KVM_SET_SREGS"))?;
    fd.set_fpu(&(&s.fpu).into()).map_err(kvm("KVM_SET_FPU"))?;
    if let Some(xsave) = &s.xsave {
        crate::sys::set_xsave(fd, xsave).map_err(kvm("KVM_SET_XSAVE"))?;
    }
    if let Some(xcrs) = &s.xcrs {
        fd.set_xcrs(xcrs).map_err(kvm("KVM_SET_XCRS"))?;
    }
    fd.set_debug_regs(&s.debugregs)
        .map_err(kvm("KVM_SET_DEBUGREGS"))?;
    fd.set_lapic(&s.lapic).map_err(kvm("KVM_SET_LAPIC"))?;
    each_msr(
        index,
        &kvm_entries(s.msrs.iter().copied()),
        "KVM_SET_MSRS",
        |m| fd.set_msrs(m),
    )?;
    fd.set_vcpu_events(&s.events)
        .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmu_and_vmx_msrs_are_excluded_and_required_ones_are_not() {
        assert!(excluded(0xc001_0000) && excluded(0xc001_0207) && excluded(0x480));
        assert!(REQUIRED_MSRS.iter().all(|&i| !excluded(i)));
        assert!(REQUIRED_MSRS.contains(&MSR_EFER) && REQUIRED_MSRS.contains(&msr::MSR_IA32_TSC));
    }
}
