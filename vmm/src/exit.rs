//! vCPU exit handling as a plain function over [`Exit`], so it is testable without KVM.
//!
//! The vCPU loop maps `kvm_ioctls::VcpuExit` into [`Exit`] ([`from_kvm`]), calls [`handle`], and
//! acts on the returned [`Action`]. Guest-triggerable logging (unhandled ports) goes through the one rate limiter
//! ([`crate::logger::rate_limited`]).

use kvm_ioctls::VcpuExit;

use crate::bus::Bus;

/// A vCPU exit, decoupled from KVM's types.
#[derive(Debug)]
pub enum Exit<'a> {
    /// Port read.
    IoIn {
        /// Port.
        port: u16,
        /// Data to fill.
        data: &'a mut [u8],
    },
    /// Port write.
    IoOut {
        /// Port.
        port: u16,
        /// Written data.
        data: &'a [u8],
    },
    /// MMIO read.
    MmioRead {
        /// Address.
        addr: u64,
        /// Data to fill.
        data: &'a mut [u8],
    },
    /// MMIO write.
    MmioWrite {
        /// Address.
        addr: u64,
        /// Written data.
        data: &'a [u8],
    },
    /// HLT reached user space (only without an in-kernel LAPIC).
    Hlt,
    /// KVM_EXIT_SHUTDOWN: a triple fault.
    Shutdown,
    /// KVM_EXIT_SYSTEM_EVENT with its type.
    SystemEvent(u32),
    /// KVM_EXIT_INTERNAL_ERROR.
    InternalError,
    /// KVM_EXIT_FAIL_ENTRY with the hardware reason.
    FailEntry(u64),
    /// KVM_RUN was interrupted by a signal (or immediate_exit).
    Interrupted,
    /// Anything else.
    Other(&'static str),
}

/// Why the VM ended normally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmExit {
    /// The guest reset the machine (i8042 reset, reset system event).
    Reset,
    /// The guest triple-faulted (KVM_EXIT_SHUTDOWN); on real hardware this resets the CPU.
    TripleFault,
    /// The guest powered off (shutdown system event).
    PowerOff,
    /// A vCPU halted and HLT reached the VMM.
    Halted,
    /// The host stopped the VM.
    Stopped,
}

/// Why a vCPU failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// KVM_EXIT_INTERNAL_ERROR (e.g. an instruction the emulator cannot run).
    InternalError,
    /// KVM_EXIT_FAIL_ENTRY.
    FailEntry(u64),
    /// A crash system event.
    Crash,
    /// An exit this VMM does not handle.
    Unexpected(String),
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultKind::InternalError => write!(f, "internal error"),
            FaultKind::FailEntry(r) => write!(f, "entry failed (reason {r:#x})"),
            FaultKind::Crash => write!(f, "guest crash event"),
            FaultKind::Unexpected(s) => write!(f, "unexpected exit {s}"),
        }
    }
}

/// What the vCPU loop does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Run the vCPU again.
    Continue,
    /// End the VM with this reason.
    Exit(VmExit),
    /// End the VM with a fault.
    Fault(FaultKind),
}

/// KVM_SYSTEM_EVENT_SHUTDOWN.
pub const SYSTEM_EVENT_SHUTDOWN: u32 = 1;
/// KVM_SYSTEM_EVENT_RESET.
pub const SYSTEM_EVENT_RESET: u32 = 2;
/// KVM_SYSTEM_EVENT_CRASH.
pub const SYSTEM_EVENT_CRASH: u32 = 3;

/// What [`handle`] works with.
#[derive(Debug)]
pub struct ExitContext<'a> {
    /// Port I/O devices.
    pub pio: &'a Bus,
    /// MMIO devices.
    pub mmio: &'a Bus,
}

fn unhandled(kind: &str, addr: u64, len: usize) {
    crate::log_limited!(
        DEBUG,
        None,
        kind,
        addr = format_args!("{addr:#x}"),
        len,
        "unhandled guest access"
    );
}

/// Decide what to do about one exit.
pub fn handle(exit: Exit<'_>, ctx: &mut ExitContext<'_>) -> Action {
    match exit {
        Exit::IoIn { port, data } => {
            if !ctx.pio.read(u64::from(port), data) {
                data.fill(0xff);
                unhandled("pio read", u64::from(port), data.len());
            }
            Action::Continue
        }
        Exit::IoOut { port, data } => {
            if !ctx.pio.write(u64::from(port), data) {
                unhandled("pio write", u64::from(port), data.len());
            }
            Action::Continue
        }
        Exit::MmioRead { addr, data } => {
            if !ctx.mmio.read(addr, data) {
                data.fill(0xff);
                unhandled("mmio read", addr, data.len());
            }
            Action::Continue
        }
        Exit::MmioWrite { addr, data } => {
            if !ctx.mmio.write(addr, data) {
                unhandled("mmio write", addr, data.len());
            }
            Action::Continue
        }
        Exit::Interrupted => Action::Continue,
        Exit::Hlt => Action::Exit(VmExit::Halted),
        Exit::Shutdown => Action::Exit(VmExit::TripleFault),
        Exit::SystemEvent(SYSTEM_EVENT_SHUTDOWN) => Action::Exit(VmExit::PowerOff),
        Exit::SystemEvent(SYSTEM_EVENT_RESET) => Action::Exit(VmExit::Reset),
        Exit::SystemEvent(SYSTEM_EVENT_CRASH) => Action::Fault(FaultKind::Crash),
        Exit::SystemEvent(t) => Action::Fault(FaultKind::Unexpected(format!("system event {t}"))),
        Exit::InternalError => Action::Fault(FaultKind::InternalError),
        Exit::FailEntry(r) => Action::Fault(FaultKind::FailEntry(r)),
        Exit::Other(name) => Action::Fault(FaultKind::Unexpected(name.to_string())),
    }
}

/// Map KVM's exit into [`Exit`].
pub fn from_kvm<'a>(e: VcpuExit<'a>) -> Exit<'a> {
    match e {
        VcpuExit::IoIn(port, data) => Exit::IoIn { port, data },
        VcpuExit::IoOut(port, data) => Exit::IoOut { port, data },
        VcpuExit::MmioRead(addr, data) => Exit::MmioRead { addr, data },
        VcpuExit::MmioWrite(addr, data) => Exit::MmioWrite { addr, data },
        VcpuExit::Hlt => Exit::Hlt,
        VcpuExit::Shutdown => Exit::Shutdown,
        VcpuExit::SystemEvent(t, _) => Exit::SystemEvent(t),
        VcpuExit::InternalError => Exit::InternalError,
        VcpuExit::FailEntry(r, _) => Exit::FailEntry(r),
        VcpuExit::Intr => Exit::Interrupted,
        VcpuExit::Unknown => Exit::Other("unknown"),
        VcpuExit::Exception => Exit::Other("exception"),
        VcpuExit::Debug(_) => Exit::Other("debug"),
        VcpuExit::IrqWindowOpen => Exit::Other("irq window open"),
        VcpuExit::Nmi => Exit::Other("nmi"),
        VcpuExit::IoapicEoi(_) => Exit::Interrupted,
        VcpuExit::Unsupported(_) => Exit::Other("unsupported"),
        _ => Exit::Other("other"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::BusDevice;
    use std::sync::{Arc, Mutex};
    use vm_sync::Lock;

    #[derive(Default)]
    struct Recorder(Vec<(u64, Vec<u8>)>);
    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8 + 1);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatches_io_and_mmio_and_fills_unhandled_reads() {
        let rec = Arc::new(Mutex::new(Recorder::default()));
        let mut pio = Bus::new();
        pio.insert(rec.clone(), 0x3f8, 8).unwrap();
        let mut mmio = Bus::new();
        mmio.insert(rec.clone(), 0xd000_0000, 0x1000).unwrap();
        let mut ctx = ExitContext {
            pio: &pio,
            mmio: &mmio,
        };

        assert_eq!(
            handle(
                Exit::IoOut {
                    port: 0x3f9,
                    data: &[7]
                },
                &mut ctx
            ),
            Action::Continue
        );
        let mut b = [0u8; 2];
        handle(
            Exit::IoIn {
                port: 0x3fa,
                data: &mut b,
            },
            &mut ctx,
        );
        assert_eq!(b, [3, 3]);
        handle(
            Exit::IoIn {
                port: 0x1234,
                data: &mut b,
            },
            &mut ctx,
        );
        assert_eq!(b, [0xff, 0xff]);
        handle(
            Exit::MmioWrite {
                addr: 0xd000_0010,
                data: &[1, 2, 3, 4],
            },
            &mut ctx,
        );
        let mut m = [0u8; 4];
        handle(
            Exit::MmioRead {
                addr: 0xe000_0000,
                data: &mut m,
            },
            &mut ctx,
        );
        assert_eq!(m, [0xff; 4]);
        assert_eq!(rec.locked().0, vec![(1, vec![7]), (0x10, vec![1, 2, 3, 4])]);
    }

    #[test]
    fn maps_terminal_exits() {
        let pio = Bus::new();
        let mut ctx = ExitContext {
            pio: &pio,
            mmio: &pio,
        };
        assert_eq!(handle(Exit::Hlt, &mut ctx), Action::Exit(VmExit::Halted));
        assert_eq!(
            handle(Exit::Shutdown, &mut ctx),
            Action::Exit(VmExit::TripleFault)
        );
        assert_eq!(
            handle(Exit::SystemEvent(2), &mut ctx),
            Action::Exit(VmExit::Reset)
        );
        assert_eq!(
            handle(Exit::SystemEvent(1), &mut ctx),
            Action::Exit(VmExit::PowerOff)
        );
        assert_eq!(
            handle(Exit::SystemEvent(3), &mut ctx),
            Action::Fault(FaultKind::Crash)
        );
        assert_eq!(
            handle(Exit::InternalError, &mut ctx),
            Action::Fault(FaultKind::InternalError)
        );
        assert_eq!(
            handle(Exit::FailEntry(0x21), &mut ctx),
            Action::Fault(FaultKind::FailEntry(0x21))
        );
        assert_eq!(handle(Exit::Interrupted, &mut ctx), Action::Continue);
        assert!(matches!(
            handle(Exit::Other("nmi"), &mut ctx),
            Action::Fault(FaultKind::Unexpected(_))
        ));
    }
}
