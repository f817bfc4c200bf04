//! vCPU setup (CPUID, MSRs, LAPIC, registers) and the vCPU thread's run loop, which parks the
//! thread while the VM is paused (for a snapshot: `Control::park`).

use std::sync::Arc;

use kvm_bindings::{CpuId, KVM_MP_STATE_RUNNABLE, kvm_mp_state};
use kvm_ioctls::VcpuFd;

use crate::boot::{LoadedKernel, regs};
use crate::bus::Bus;
use crate::control::{Control, GuestFault};
use crate::cpuid::{CpuidParams, normalize};
use crate::exit::{Action, ExitContext, FaultKind, from_kvm, handle};
use crate::msr;
use crate::sys::KickableVcpu;

/// Errors of configuring a vCPU.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
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
    /// MSR list.
    #[error(transparent)]
    Msr(#[from] msr::MsrError),
}

/// Per-VM inputs of [`configure`].
#[derive(Clone, Copy, Debug)]
pub struct VcpuSetup<'a> {
    /// KVM_GET_SUPPORTED_CPUID result.
    pub supported_cpuid: &'a CpuId,
    /// vCPUs in the VM.
    pub vcpus: u8,
    /// Baseline CPU profile.
    pub baseline: bool,
    /// The loaded kernel (entry point, AP start policy).
    pub kernel: &'a LoadedKernel,
}

/// Set vCPU `index`'s CPUID: KVM's supported table normalized for this VM (boot and restore
/// alike).
pub fn set_cpuid(
    vcpu: &VcpuFd,
    index: u8,
    supported: &CpuId,
    vcpus: u8,
    baseline: bool,
) -> Result<(), VcpuError> {
    let mut cpuid = supported.clone();
    normalize(
        cpuid.as_mut_slice(),
        CpuidParams {
            vcpu: index,
            vcpus,
            baseline,
        },
    );
    vcpu.set_cpuid2(&cpuid).map_err(|source| VcpuError::Kvm {
        vcpu: index,
        what: "KVM_SET_CPUID2",
        source,
    })
}

/// Configure vCPU `index` for a direct 64-bit entry.
pub fn configure(vcpu: &VcpuFd, index: u8, s: &VcpuSetup<'_>) -> Result<(), VcpuError> {
    let kvm = |what| {
        move |source| VcpuError::Kvm {
            vcpu: index,
            what,
            source,
        }
    };
    set_cpuid(vcpu, index, s.supported_cpuid, s.vcpus, s.baseline)?;

    let msrs = msr::boot_msrs()?;
    let written = vcpu.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
    if written != msrs.as_slice().len() {
        let failed = msrs.as_slice().get(written).map(|e| e.index).unwrap_or(0);
        tracing::debug!(
            vcpu = index,
            written,
            failed = format_args!("{failed:#x}"),
            "not every boot MSR was accepted"
        );
    }

    let mut lapic = vcpu.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?;
    msr::setup_lint(&mut lapic);
    vcpu.set_lapic(&lapic).map_err(kvm("KVM_SET_LAPIC"))?;

    let sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
    vcpu.set_sregs(&regs::long_mode_sregs(sregs))
        .map_err(kvm("KVM_SET_SREGS"))?;
    vcpu.set_regs(&regs::boot_regs(s.kernel.entry))
        .map_err(kvm("KVM_SET_REGS"))?;
    vcpu.set_fpu(&regs::boot_fpu())
        .map_err(kvm("KVM_SET_FPU"))?;
    if s.kernel.all_vcpus_start && index != 0 {
        vcpu.set_mp_state(kvm_mp_state {
            mp_state: KVM_MP_STATE_RUNNABLE,
        })
        .map_err(kvm("KVM_SET_MP_STATE"))?;
    }
    Ok(())
}

/// Most `KVM_RUN`s with `immediate_exit` a parking vCPU makes to complete an exit in flight.
const MAX_COMPLETION_RUNS: usize = 1024;

/// What a vCPU thread needs.
pub struct VcpuThread {
    /// vCPU index.
    pub index: u8,
    /// The vCPU.
    pub fd: KickableVcpu,
    /// Port I/O bus.
    pub pio: Arc<Bus>,
    /// MMIO bus.
    pub mmio: Arc<Bus>,
    /// Lifecycle state.
    pub control: Arc<Control>,
}

impl VcpuThread {
    /// Thread body: run until the VM stops, record the outcome, deregister.
    pub fn run(mut self) {
        vm_jail::seccomp::apply_or_exit(vm_jail::seccomp::ThreadKind::Vcpu);
        let control = self.control.clone();
        let outcome = control.run_registered(usize::from(self.index), || self.run_loop());
        if let Some(outcome) = outcome {
            control.request_stop(outcome);
        }
        control.thread_done();
    }

    fn fault(&self, kind: FaultKind) -> GuestFault {
        let rip = self.fd.fd().get_regs().map(|r| r.rip).unwrap_or(0);
        GuestFault {
            vcpu: self.index,
            kind,
            rip,
        }
    }

    /// Complete any exit still in flight, then park until the VM resumes or stops, serving
    /// save rounds meanwhile; `Some` if the completion ended the VM.
    fn park(&mut self) -> Option<crate::control::Outcome> {
        let mut completed = false;
        for _ in 0..MAX_COMPLETION_RUNS {
            let action = match self.fd.run_immediate_exit() {
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => None,
                Ok(exit) => {
                    let mut ctx = ExitContext {
                        pio: &self.pio,
                        mmio: &self.mmio,
                    };
                    Some(handle(from_kvm(exit), &mut ctx))
                }
                Err(e) => Some(Action::Fault(FaultKind::Unexpected(format!(
                    "KVM_RUN error {e}"
                )))),
            };
            self.fd.clear_immediate_exit();
            match action {
                None => {
                    completed = true;
                    break;
                }
                Some(Action::Continue) => {}
                Some(Action::Exit(x)) => return Some(Ok(x)),
                Some(Action::Fault(kind)) => return Some(Err(self.fault(kind))),
            }
        }
        if !completed {
            tracing::warn!(
                vcpu = self.index,
                "pending I/O still not complete; parking anyway"
            );
        }
        let (control, fd, index) = (self.control.clone(), self.fd.fd(), self.index);
        control.park(usize::from(index), |plan| {
            crate::snapshot::vcpu::save(fd, index, plan)
        });
        None
    }

    /// Returns `None` when stopped from outside, the VM outcome otherwise.
    fn run_loop(&mut self) -> Option<crate::control::Outcome> {
        loop {
            let control = &self.control;
            let stop_or_pause = || control.stop_requested() || control.pause_requested();
            let action = match self.fd.run_unless(stop_or_pause) {
                None if self.control.stop_requested() => return None,
                None => match self.park() {
                    Some(outcome) => return Some(outcome),
                    None => continue,
                },
                Some(Ok(exit)) => {
                    let mut ctx = ExitContext {
                        pio: &self.pio,
                        mmio: &self.mmio,
                    };
                    handle(from_kvm(exit), &mut ctx)
                }
                Some(Err(e)) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.fd.clear_immediate_exit();
                    Action::Continue
                }
                Some(Err(e)) => Action::Fault(FaultKind::Unexpected(format!("KVM_RUN error {e}"))),
            };
            match action {
                Action::Continue => {}
                Action::Exit(x) => return Some(Ok(x)),
                Action::Fault(kind) => {
                    let f = self.fault(kind);
                    tracing::warn!(error = %f, "vcpu fault");
                    return Some(Err(f));
                }
            }
        }
    }
}
