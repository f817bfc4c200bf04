//! `vmm`: a small KVM virtual machine monitor that boots Linux directly in 64-bit mode.
//!
//! # Design
//! - [`layout`]: guest physical layout. RAM is exactly the requested size (hard cap): below the
//!   32-bit MMIO gap at 3.25 GiB, the rest above 4 GiB. The e820 map matches, with the EBDA and
//!   the legacy 0xa0000..0x100000 area not RAM.
//! - [`boot`]: loads an ELF vmlinux (entered at its 64-bit ELF entry) or a bzImage (entered at
//!   load address + 0x200), the initrd (top of low memory, page aligned, below
//!   `initrd_addr_max`), writes the zero page, identity page tables (4 GiB of 2 MiB pages), a
//!   flat GDT, an empty IDT and an MP table; [`boot::regs`] gives the long-mode register state.
//! - [`cpuid`] / [`msr`]: the CPU model. [`config::CpuProfile::Baseline`] hides what KVM's
//!   instruction emulator on a PVM host cannot execute; `Auto` picks it on PVM-native hosts.
//! - Devices: [`serial`] (COM1 into a bounded ring), [`i8042`] (reset ends the VM), [`legacy`]
//!   (absorbed ports), and `virtio` (virtio-mmio block/vsock/rng, owned separately) at
//!   0xd000_0000 + i*0x1000, GSI 5+i, with ioeventfds and irqfds. Dispatch goes through [`bus`].
//! - [`vm`]: [`Vm::create`] does all setup, [`Vm::start`] spawns the device control thread (which
//!   starts device workers: `virtio::starter`) and one thread per vCPU;
//!   [`control`] holds the stop flag and kicks vCPU threads out of KVM_RUN with a real-time
//!   signal whose handler sets `immediate_exit`. [`exit`] maps every vCPU exit to an action in a
//!   plain function; faults become a typed [`control::GuestFault`] with the RIP, never a panic.
//!
//! - [`snapshot`]: snapshot and restore of a VM and its virtio devices: the vCPUs parked
//!   through [`control`], the device workers stopped, their KVM state, the VM's and the
//!   devices' (registers, queue positions) in a checksummed state file, guest RAM in a memory
//!   file mapped back copy-on-write.
//!
//! - [`logger`]: the process's log on stderr (one bounded line per event, write errors
//!   ignored) and the one rate limiter of every line a guest can trigger; [`metrics`]: the
//!   per-device counters `vm-vmm` reports to its launcher.
//!
//! # API
//! [`Vm`] (`create`, `restore`, `start`) and [`RunningVm`] (`stop`, `wait`, `wait_timeout`,
//! `console`, `snapshot`); see their docs.

pub mod boot;
pub mod bus;
pub mod config;
pub mod control;
pub mod cpuid;
pub mod exit;
pub mod i8042;
pub mod layout;
pub mod legacy;
pub mod logger;
pub mod memory;
pub mod metrics;
pub mod msr;
pub mod process;
pub mod serial;
pub mod snapshot;
pub mod sys;
pub mod vcpu;
pub mod virtio;
pub mod vm;

pub use boot::KernelFormat;
pub use config::{ConsoleConfig, CpuProfile, VmConfig};
pub use control::GuestFault;
pub use exit::VmExit;
pub use vm::{RunningVm, Vm, VmmError};
