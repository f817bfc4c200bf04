//! [`Vm`]: build a VM from a [`VmConfig`]; [`RunningVm`]: its vCPU threads and lifecycle.
//!
//! `Vm::create` does all fallible setup (KVM VM, irqchip, PIT, memory, kernel, devices, vCPUs)
//! without running anything; `Vm::start` spawns the device control thread (`vm<N>-devctl`,
//! which starts device workers when the guest activates a device: `virtio::starter`) and one
//! thread per vCPU. The VM ends when the guest
//! resets (i8042), a vCPU faults, or the host calls [`RunningVm::stop`]; [`RunningVm::wait`]
//! joins every thread and then drops the VM (memory, KVM fds, device workers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use kvm_bindings::{CpuId, KVM_PIT_SPEAKER_DUMMY, kvm_pit_config};
use kvm_ioctls::{IoEventAddress, Kvm, VmFd};
use virtio_bindings::virtio_mmio::VIRTIO_MMIO_QUEUE_NOTIFY;
use vm_sync::Lock;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::boot::{self, BootInput};
use crate::bus::{Bus, BusError, SharedDevice};
use crate::config::{self, ConsoleConfig, CpuProfile, VmConfig, build_cmdline};
use crate::control::{Control, GuestFault, Outcome, install_kick_handler};
use crate::exit::VmExit;
use crate::i8042::{I8042, I8042_BASE, I8042_LEN};
use crate::layout::{
    IDENTITY_MAP_ADDR, MemoryLayout, TSS_ADDR, VIRTIO_GSI_BASE, VIRTIO_MMIO_SIZE, virtio_mmio_base,
};
use crate::legacy::{ABSORBED_PORTS, Sink};
use crate::memory::{self, GuestMemoryMmap};
use crate::metrics::{DeviceMetrics, MetricsReport};
use crate::serial::{COM1_IRQ, COM1_PORT, ConsoleRing, Serial, SharedConsole};
use crate::snapshot::ConfigFacts;
use crate::sys::{GuestVm, KickableVcpu};
use crate::vcpu::{self, VcpuSetup, VcpuThread};
use crate::virtio::{MmioDevice, Starter, StarterThread, VirtioError};

/// Errors of creating or running a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// Invalid configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A KVM system or VM ioctl failed.
    #[error("{what} failed")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// Cause.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Memory layout.
    #[error(transparent)]
    Layout(#[from] crate::layout::LayoutError),
    /// Guest memory.
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    /// Kernel loading / boot structures.
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    /// vCPU setup.
    #[error(transparent)]
    Vcpu(#[from] vcpu::VcpuError),
    /// Device placement.
    #[error("cannot place device")]
    Bus(#[source] BusError),
    /// A virtio device.
    #[error("cannot create virtio device {index}")]
    Virtio {
        /// Device index.
        index: usize,
        /// Cause.
        #[source]
        source: VirtioError,
    },
    /// The device control thread (or its eventfd) could not be created.
    #[error("device control thread")]
    DeviceControl(#[source] VirtioError),
    /// Host resource (eventfd, signal handler, thread).
    #[error("{what} failed")]
    Host {
        /// The operation.
        what: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The guest stopped on an exit it cannot continue from.
    #[error(transparent)]
    Guest(#[from] GuestFault),
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { what, source }
}

fn host_err(what: &'static str) -> impl FnOnce(std::io::Error) -> VmmError {
    move |source| VmmError::Host { what, source }
}

/// The limits a configuration must respect before anything is created.
pub(crate) fn check_config(cfg: &VmConfig) -> Result<(), VmmError> {
    if cfg.vcpus == 0 || cfg.vcpus > boot::mptable::MAX_CPUS {
        return Err(VmmError::Config(format!(
            "vcpus must be 1..={}, got {}",
            boot::mptable::MAX_CPUS,
            cfg.vcpus
        )));
    }
    let max_devices = crate::layout::MAX_VIRTIO_DEVICES;
    if cfg.devices.len() > max_devices {
        return Err(VmmError::Config(format!(
            "at most {max_devices} virtio devices, got {}",
            cfg.devices.len()
        )));
    }
    Ok(())
}

/// The KVM VM with its TSS, identity map, in-kernel irqchip and PIT.
pub(crate) fn create_kvm_vm() -> Result<(Kvm, VmFd), VmmError> {
    let kvm = Kvm::new().map_err(kvm_err("opening /dev/kvm"))?;
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    vm.set_tss_address(TSS_ADDR as usize)
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    vm.set_identity_map_address(IDENTITY_MAP_ADDR)
        .map_err(kvm_err("KVM_SET_IDENTITY_MAP_ADDR"))?;
    vm.create_irq_chip()
        .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit).map_err(kvm_err("KVM_CREATE_PIT2"))?;
    Ok((kvm, vm))
}

/// `mem` registered in the new `vm`, and beside it (another thread) the PMU fenced off
/// ([`crate::msr::fence_pmu`]) and KVM's CPUID table read for the vCPUs
/// ([`crate::cpuid::supported_for_vm`]). The MSR filter and the memory slots each wait for an
/// SRCU grace period, and waiting at once they share one: a start is ~11 ms shorter than one
/// after the other.
pub(crate) fn register_fenced(
    kvm: &Kvm,
    vm: VmFd,
    mem: GuestMemoryMmap,
    profile: CpuProfile,
) -> Result<(GuestVm, CpuId), VmmError> {
    let baseline = profile == CpuProfile::Baseline;
    let (guest, (fence, cpuid)) = memory::register(vm, mem, |vm| {
        (
            crate::msr::fence_pmu(kvm, vm),
            crate::cpuid::supported_for_vm(kvm, baseline),
        )
    })?;
    let fence = fence.map_err(kvm_err("fencing off the PMU"))?;
    tracing::debug!(?fence, "guest kept off the host's PMU");
    let cpuid = cpuid.map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    Ok((guest, cpuid))
}

/// The port-I/O bus: the serial console (its interrupt registered, its eventfd kept in
/// `irq_events`), the i8042 (a reset stops the VM) and the absorbed legacy ports.
fn legacy_devices(
    vm: &VmFd,
    control: &Arc<Control>,
    console: &SharedConsole,
    sink: Option<Box<dyn std::io::Write + Send>>,
    irq_events: &mut Vec<EventFd>,
) -> Result<Bus, VmmError> {
    let mut pio = Bus::new();
    let serial_irq = EventFd::new(EFD_NONBLOCK).map_err(host_err("eventfd"))?;
    vm.register_irqfd(&serial_irq, COM1_IRQ)
        .map_err(kvm_err("KVM_IRQFD (serial)"))?;
    let serial_trigger = serial_irq.try_clone().map_err(host_err("eventfd clone"))?;
    irq_events.push(serial_irq);
    let serial = Serial::new(console.clone(), sink, Some(serial_trigger));
    pio.insert(Arc::new(Mutex::new(serial)), COM1_PORT, 8)
        .map_err(VmmError::Bus)?;

    let reset_control = control.clone();
    let i8042 = I8042::new(Arc::new(move || {
        reset_control.request_stop(Ok(VmExit::Reset))
    }));
    pio.insert(Arc::new(Mutex::new(i8042)), I8042_BASE, I8042_LEN)
        .map_err(VmmError::Bus)?;
    for (base, len, value) in ABSORBED_PORTS {
        pio.insert(Arc::new(Mutex::new(Sink(*value))), *base, *len)
            .map_err(VmmError::Bus)?;
    }
    #[cfg(feature = "test-hooks")]
    pio.insert(
        Arc::new(Mutex::new(crate::legacy::ForbiddenSyscall)),
        crate::legacy::TEST_FORBIDDEN_SYSCALL_PORT,
        1,
    )
    .map_err(VmmError::Bus)?;
    Ok(pio)
}

/// The MMIO bus with one virtio-mmio device per configured device: its queue-notify
/// ioeventfds and its irqfd registered (the eventfds kept in `irq_events`).
fn virtio_devices(
    kvm: &Kvm,
    guest: &mut GuestVm,
    cfg: &VmConfig,
    starter: &Starter,
    irq_events: &mut Vec<EventFd>,
) -> Result<(Bus, Vec<SharedMmio>), VmmError> {
    let mut mmio = Bus::new();
    let mut virtio = Vec::new();
    for (index, dev_cfg) in cfg.devices.iter().enumerate() {
        let dev = MmioDevice::new_at(dev_cfg, index, guest.memory().clone(), starter)
            .map_err(|source| VmmError::Virtio { index, source })?;
        if let Some(w) = dev.window() {
            if !kvm.check_extension(kvm_ioctls::Cap::ReadonlyMem) {
                return Err(VmmError::Config(
                    "KVM has no read-only memory slots (KVM_CAP_READONLY_MEM): no DAX window"
                        .into(),
                ));
            }
            guest
                .add_window(w.guest_base, w.mapping.clone())
                .map_err(|e| VmmError::Kvm {
                    what: "registering a DAX window",
                    source: e.source,
                })?;
        }
        let vm = guest.vm();
        let base = virtio_mmio_base(index);
        for (queue, evt) in dev.queue_notify_events() {
            vm.register_ioevent(
                &evt,
                &IoEventAddress::Mmio(base + u64::from(VIRTIO_MMIO_QUEUE_NOTIFY)),
                queue,
            )
            .map_err(kvm_err("KVM_IOEVENTFD"))?;
            irq_events.push(evt);
        }
        let irq = dev
            .interrupt_event()
            .map_err(|source| VmmError::Virtio { index, source })?;
        vm.register_irqfd(&irq, VIRTIO_GSI_BASE + index as u32)
            .map_err(kvm_err("KVM_IRQFD (virtio)"))?;
        irq_events.push(irq);
        let dev = Arc::new(Mutex::new(dev));
        mmio.insert(dev.clone(), base, VIRTIO_MMIO_SIZE)
            .map_err(VmmError::Bus)?;
        virtio.push(dev);
    }
    Ok((mmio, virtio))
}

/// The kick handler every vCPU thread relies on (installed once per process).
pub(crate) fn install_kick() -> Result<(), VmmError> {
    install_kick_handler().map_err(|e| VmmError::Host {
        what: "installing the vCPU kick handler",
        source: e.into(),
    })
}

/// A VM on `guest` with every device of `cfg` and no vCPUs yet: the lifecycle state, the
/// console, the port bus, the device control thread's starter and the virtio devices.
pub(crate) fn assemble(
    kvm: Kvm,
    mut guest: GuestVm,
    cfg: &VmConfig,
    console: ConsoleConfig,
    cmdline: String,
) -> Result<Vm, VmmError> {
    let control = Arc::new(Control::new(usize::from(cfg.vcpus)));
    let ring: SharedConsole = Arc::new(Mutex::new(ConsoleRing::new(console.ring_bytes)));
    let mut irq_events = Vec::new();
    let pio = legacy_devices(guest.vm(), &control, &ring, console.sink, &mut irq_events)?;
    let starter = Starter::new().map_err(VmmError::DeviceControl)?;
    let (mmio, virtio) = virtio_devices(&kvm, &mut guest, cfg, &starter, &mut irq_events)?;
    let metrics = virtio.iter().map(|d| d.locked().metrics()).collect();
    Ok(Vm {
        seq: VM_SEQ.fetch_add(1, Ordering::Relaxed),
        vcpus: Vec::new(),
        virtio,
        starter,
        pio,
        mmio,
        console: ring,
        control,
        _irq_events: irq_events,
        guest,
        kvm,
        cmdline,
        metrics,
        facts: ConfigFacts {
            vcpus: cfg.vcpus,
            mem_mib: cfg.mem_mib,
            cpu_profile: config::resolve(cfg.cpu_profile),
        },
    })
}

/// One configured vCPU per `setup.vcpus`.
fn create_vcpus(vm: &GuestVm, setup: &VcpuSetup<'_>) -> Result<Vec<KickableVcpu>, VmmError> {
    let mut vcpus = Vec::with_capacity(usize::from(setup.vcpus));
    for index in 0..setup.vcpus {
        let v = vm
            .create_vcpu(u64::from(index))
            .map_err(kvm_err("KVM_CREATE_VCPU"))?;
        vcpu::configure(v.fd(), index, setup)?;
        vcpus.push(v);
    }
    Ok(vcpus)
}

/// A virtio-mmio device shared by the MMIO bus and the VM.
type SharedMmio = Arc<Mutex<MmioDevice>>;

static VM_SEQ: AtomicU64 = AtomicU64::new(0);

/// A created, not yet running VM.
pub struct Vm {
    seq: u64,
    // Field order is drop order: vCPUs and devices before the VM fd and memory.
    pub(crate) vcpus: Vec<KickableVcpu>,
    pub(crate) virtio: Vec<SharedMmio>,
    starter: Starter,
    pio: Bus,
    mmio: Bus,
    console: SharedConsole,
    pub(crate) control: Arc<Control>,
    _irq_events: Vec<EventFd>,
    pub(crate) guest: GuestVm,
    pub(crate) kvm: Kvm,
    cmdline: String,
    /// The virtio devices' counters, in device order.
    metrics: Vec<Arc<DeviceMetrics>>,
    /// What a snapshot of this VM records of its config (and a restore must match).
    pub(crate) facts: ConfigFacts,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("seq", &self.seq)
            .field("vcpus", &self.vcpus.len())
            .finish()
    }
}

impl Vm {
    /// Create the VM: memory, kernel, boot structures, devices and vCPUs; its console kept
    /// in a ring of the default size.
    pub fn create(cfg: VmConfig) -> Result<Vm, VmmError> {
        Vm::create_with_console(cfg, ConsoleConfig::default())
    }

    /// [`Vm::create`], the console as `console` says.
    pub fn create_with_console(cfg: VmConfig, console: ConsoleConfig) -> Result<Vm, VmmError> {
        check_config(&cfg)?;
        install_kick()?;
        let layout = MemoryLayout::new(cfg.mem_mib)?;
        let profile = config::resolve(cfg.cpu_profile);
        let (kvm, vm) = create_kvm_vm()?;
        let (guest, supported) = register_fenced(&kvm, vm, memory::allocate(&layout)?, profile)?;
        let cmdline = build_cmdline(profile, cfg.devices.len(), &cfg.cmdline);
        let kernel = boot::prepare(
            guest.memory(),
            &BootInput {
                layout: &layout,
                kernel: &cfg.kernel,
                format: cfg.kernel_format,
                initrd: cfg.initrd.as_deref(),
                cmdline: &cmdline,
                vcpus: cfg.vcpus,
            },
        )?;
        let mut vm = assemble(kvm, guest, &cfg, console, cmdline)?;
        let setup = VcpuSetup {
            supported_cpuid: &supported,
            vcpus: cfg.vcpus,
            baseline: profile == CpuProfile::Baseline,
            kernel: &kernel,
        };
        vm.vcpus = create_vcpus(&vm.guest, &setup)?;
        Ok(vm)
    }

    /// Add a port I/O device (e.g. a test probe) before starting.
    pub fn add_pio_device(
        &mut self,
        device: SharedDevice,
        base: u64,
        len: u64,
    ) -> Result<(), VmmError> {
        self.pio.insert(device, base, len).map_err(VmmError::Bus)
    }

    /// Add an MMIO device (outside guest RAM) before starting.
    pub fn add_mmio_device(
        &mut self,
        device: SharedDevice,
        base: u64,
        len: u64,
    ) -> Result<(), VmmError> {
        self.mmio.insert(device, base, len).map_err(VmmError::Bus)
    }

    /// Guest memory (shared with the VM; reads see what the guest wrote).
    pub fn memory(&self) -> &GuestMemoryMmap {
        self.guest.memory()
    }

    /// Device `index`'s DAX window (a virtio-fs device with one), which the guest sees at
    /// its guest physical base through a read-only memory slot.
    pub fn dax_window(&self, index: usize) -> Option<crate::virtio::fs::Window> {
        let dev = self.virtio.get(index)?;
        dev.locked().window().cloned()
    }

    /// The full kernel command line passed to the guest.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    /// Names the vCPU threads will carry (unique per VM in this process).
    pub fn vcpu_thread_names(&self) -> Vec<String> {
        self.vcpu_thread_names_for(self.vcpus.len())
    }

    fn vcpu_thread_names_for(&self, n: usize) -> Vec<String> {
        (0..n).map(|i| thread_name(self.seq, i)).collect()
    }

    /// Open the devices' host files (a virtio-fs device's share: inside the jail when there is
    /// one), then spawn the device control thread, then the vCPU threads.
    pub fn start(mut self) -> Result<RunningVm, VmmError> {
        let shares = self
            .virtio
            .iter()
            .filter(|d| d.locked().serves_host_files())
            .count();
        let descriptors = crate::virtio::fs::descriptors_per_share(shares as u64);
        for (index, dev) in self.virtio.iter().enumerate() {
            dev.locked()
                .open_host_files(descriptors)
                .map_err(|source| VmmError::Virtio { index, source })?;
        }
        let devctl = self
            .starter
            .spawn(format!("vm{}-devctl", self.seq))
            .map_err(VmmError::DeviceControl)?;
        let pio = Arc::new(std::mem::take(&mut self.pio));
        let mmio = Arc::new(std::mem::take(&mut self.mmio));
        let names = self.vcpu_thread_names();
        let mut threads = Vec::with_capacity(self.vcpus.len());
        for (index, fd) in std::mem::take(&mut self.vcpus).into_iter().enumerate() {
            let t = VcpuThread {
                index: index as u8,
                fd,
                pio: pio.clone(),
                mmio: mmio.clone(),
                control: self.control.clone(),
            };
            self.control.add_live();
            let spawned = std::thread::Builder::new()
                .name(names[index].clone())
                .spawn(move || t.run());
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    // The closure (and its vCPU) was dropped; account for it and stop the rest.
                    self.control.thread_done();
                    let running = RunningVm {
                        vm: Some(self),
                        threads,
                        devctl: Some(devctl),
                    };
                    running.stop();
                    drop(running);
                    return Err(VmmError::Host {
                        what: "spawning a vCPU thread",
                        source: e,
                    });
                }
            }
        }
        Ok(RunningVm {
            vm: Some(self),
            threads,
            devctl: Some(devctl),
        })
    }
}

fn thread_name(seq: u64, index: usize) -> String {
    format!("vm{seq}-vcpu{index}")
}

/// A VM whose vCPUs are running.
pub struct RunningVm {
    pub(crate) vm: Option<Vm>,
    threads: Vec<JoinHandle<()>>,
    devctl: Option<StarterThread>,
}

impl std::fmt::Debug for RunningVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningVm")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl RunningVm {
    fn control(&self) -> Option<&Arc<Control>> {
        self.vm.as_ref().map(|v| &v.control)
    }

    /// Ask every vCPU to stop (returns at once; use [`Self::wait`] to join).
    pub fn stop(&self) {
        if let Some(c) = self.control() {
            c.request_stop(Ok(VmExit::Stopped));
        }
    }

    /// Whether every vCPU thread has finished.
    pub fn is_finished(&self) -> bool {
        self.control().is_none_or(|c| c.is_finished())
    }

    /// Wait up to `timeout` for the VM to end; `None` if it is still running.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Outcome> {
        self.control()?.wait_timeout(timeout)
    }

    /// Snapshot of the console ring.
    pub fn console(&self) -> String {
        self.vm
            .as_ref()
            .map(|v| v.console.locked().snapshot())
            .unwrap_or_default()
    }

    /// The virtio devices' counters now (no devices once waited for).
    pub fn metrics(&self) -> MetricsReport {
        let devices = self.vm.as_ref().map_or(&[][..], |v| &v.metrics[..]);
        crate::metrics::report(devices.iter().map(|m| &**m))
    }

    /// Names of the vCPU threads (see [`Vm::vcpu_thread_names`]); empty once waited for.
    pub fn vcpu_thread_names(&self) -> Vec<String> {
        self.vm
            .as_ref()
            .map(|v| v.vcpu_thread_names_for(self.threads.len()))
            .unwrap_or_default()
    }

    /// Guest memory.
    pub fn memory(&self) -> Option<&GuestMemoryMmap> {
        self.vm.as_ref().map(|v| v.guest.memory())
    }

    /// Wait for the VM to end, join every vCPU thread and release the VM.
    pub fn wait(mut self) -> Result<VmExit, VmmError> {
        let outcome = self.join_all();
        outcome.map_err(VmmError::Guest)
    }

    fn join_all(&mut self) -> Outcome {
        let Some(vm) = self.vm.as_ref() else {
            return Ok(VmExit::Stopped);
        };
        let control = vm.control.clone();
        let outcome = loop {
            if let Some(o) = control.wait_timeout(Duration::from_secs(1)) {
                break o;
            }
        };
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a vCPU thread panicked");
            }
        }
        // No worker starts once the vCPUs are gone; then every worker is stopped.
        if let Some(mut devctl) = self.devctl.take() {
            devctl.stop();
        }
        if let Some(vm) = self.vm.take() {
            for dev in &vm.virtio {
                dev.locked().shutdown();
            }
            drop(vm);
        }
        outcome
    }
}

impl Drop for RunningVm {
    fn drop(&mut self) {
        if self.vm.is_some() {
            self.stop();
            let _ = self.join_all();
        }
    }
}
