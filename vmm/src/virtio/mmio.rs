//! The virtio-mmio transport, version 2 (virtio 1.2 §4.2.2).
//!
//! The register state machine is enforced: driver features are accepted only between DRIVER
//! and FEATURES_OK; FEATURES_OK sticks only if the driver acked nothing the device did not
//! offer and acked `VIRTIO_F_VERSION_1`; queue registers are accepted only after FEATURES_OK and
//! before DRIVER_OK. DRIVER_OK with a missing or invalid queue puts the device into
//! DEVICE_NEEDS_RESET instead of starting it. Writing 0 to the status register stops the worker
//! (dropping every connection and in-flight buffer) and returns all registers to their initial
//! values.
//!
//! DRIVER_OK does not start the worker on the vCPU thread that wrote it: the worker is prepared
//! there and started by the VM's device control thread ([`super::starter`]).
//!
//! Snapshots (`persist`): [`MmioDevice::save_state`] stops the worker and takes its queues
//! back, [`MmioDevice::resume_after_save`] and [`MmioDevice::restore_state`] start one again
//! through the same starter path as DRIVER_OK.

mod persist;

pub use persist::PersistError;

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_sync::Lock;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::queue::{clone_queue, queue_usable};
use super::starter::{SharedSlot, Starter};
use super::worker::{Interrupt, WorkerIo, WorkerSetup};
use super::{DeviceConfig, GuestMemoryMmap, VirtioDevice, VirtioError};
use crate::bus::BusDevice;
use crate::metrics::DeviceMetrics;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FEATURES_OK,
    VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio::{
    VIRTIO_MMIO_CONFIG, VIRTIO_MMIO_CONFIG_GENERATION, VIRTIO_MMIO_DEVICE_FEATURES,
    VIRTIO_MMIO_DEVICE_FEATURES_SEL, VIRTIO_MMIO_DEVICE_ID, VIRTIO_MMIO_DRIVER_FEATURES,
    VIRTIO_MMIO_DRIVER_FEATURES_SEL, VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INTERRUPT_STATUS,
    VIRTIO_MMIO_MAGIC_VALUE, VIRTIO_MMIO_QUEUE_AVAIL_HIGH, VIRTIO_MMIO_QUEUE_AVAIL_LOW,
    VIRTIO_MMIO_QUEUE_DESC_HIGH, VIRTIO_MMIO_QUEUE_DESC_LOW, VIRTIO_MMIO_QUEUE_NOTIFY,
    VIRTIO_MMIO_QUEUE_NUM, VIRTIO_MMIO_QUEUE_NUM_MAX, VIRTIO_MMIO_QUEUE_READY,
    VIRTIO_MMIO_QUEUE_SEL, VIRTIO_MMIO_QUEUE_USED_HIGH, VIRTIO_MMIO_QUEUE_USED_LOW,
    VIRTIO_MMIO_SHM_BASE_HIGH, VIRTIO_MMIO_SHM_BASE_LOW, VIRTIO_MMIO_SHM_LEN_HIGH,
    VIRTIO_MMIO_SHM_LEN_LOW, VIRTIO_MMIO_SHM_SEL, VIRTIO_MMIO_STATUS, VIRTIO_MMIO_VENDOR_ID,
    VIRTIO_MMIO_VERSION,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

const MAGIC: u32 = 0x7472_6976;
const VERSION: u32 = 2;
const VENDOR_ID: u32 = 0x554d_4551; // any constant; Linux does not check it

/// A virtio device behind one MMIO register window (`crate::layout::VIRTIO_MMIO_SIZE` bytes).
pub struct MmioDevice {
    device: Box<dyn VirtioDevice>,
    /// What the device is (`VirtioDevice::kind`, fixed once built): its type, queue sizes
    /// and offered features come from it.
    kind: super::persist::DeviceKind,
    mem: GuestMemoryMmap,
    queues: Vec<Queue>,
    /// Sizes the driver wrote (validated at DRIVER_OK).
    requested_sizes: Vec<u16>,
    queue_sel: u32,
    /// SHMSel: which shared-memory region the SHMLen/SHMBase registers describe.
    shm_sel: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    status: u32,
    config_generation: u32,
    irq: Arc<Interrupt>,
    notify: Vec<EventFd>,
    request: EventFd,
    slot: SharedSlot,
    starter: Starter,
    name: String,
    metrics: Arc<DeviceMetrics>,
}

impl MmioDevice {
    /// Build the device described by `cfg` over guest memory `mem`; `starter` starts its
    /// worker at DRIVER_OK.
    pub fn new(
        cfg: &DeviceConfig,
        mem: GuestMemoryMmap,
        starter: &Starter,
    ) -> Result<MmioDevice, VirtioError> {
        Self::new_at(cfg, 0, mem, starter)
    }

    /// [`MmioDevice::new`] as the VM's device `index` (where a DAX window goes follows from
    /// it).
    pub fn new_at(
        cfg: &DeviceConfig,
        index: usize,
        mem: GuestMemoryMmap,
        starter: &Starter,
    ) -> Result<MmioDevice, VirtioError> {
        let device = super::build_device(cfg, index)?;
        Self::with_device(device, mem, cfg.name(), starter)
    }

    /// The device's DAX window, which KVM must map read-only (a virtio-fs device with one).
    pub fn window(&self) -> Option<&super::fs::Window> {
        self.device.window()
    }

    /// `device` named `name` (in its log lines and counters).
    pub(crate) fn with_device(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        name: String,
        starter: &Starter,
    ) -> Result<Self, VirtioError> {
        let kind = device.kind();
        let sizes = kind.queue_max_sizes().to_vec();
        let queues = sizes
            .iter()
            .map(|&m| Queue::new(m).map_err(VirtioError::Queue))
            .collect::<Result<Vec<_>, _>>()?;
        let notify = sizes
            .iter()
            .map(|_| EventFd::new(EFD_NONBLOCK).map_err(VirtioError::os("notify eventfd")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MmioDevice {
            requested_sizes: sizes,
            device,
            kind,
            mem,
            queues,
            queue_sel: 0,
            shm_sel: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            status: 0,
            config_generation: 0,
            irq: Arc::new(Interrupt::new()?),
            notify,
            request: EventFd::new(EFD_NONBLOCK).map_err(VirtioError::os("request eventfd"))?,
            slot: starter.slot(),
            starter: starter.clone(),
            metrics: Arc::new(DeviceMetrics::new(&name)),
            name,
        })
    }

    /// Opens the host files the device serves (see `VirtioDevice::open_host_files`): once the
    /// VM process is jailed, before any vCPU runs.
    pub fn open_host_files(&mut self, descriptors: u64) -> Result<(), VirtioError> {
        self.device.open_host_files(descriptors)
    }

    /// Whether the device serves host files (a virtio-fs share).
    pub fn serves_host_files(&self) -> bool {
        self.device.serves_host_files()
    }

    /// The device's counters (shared with its worker thread).
    pub fn metrics(&self) -> Arc<DeviceMetrics> {
        self.metrics.clone()
    }

    /// One event per queue; the VMM registers each as an ioeventfd at `base + 0x50` with
    /// datamatch = queue index. Writing to the notify register through the bus signals the same
    /// events, so the device also works without ioeventfds.
    pub fn queue_notify_events(&self) -> Vec<(u32, EventFd)> {
        self.notify
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((i as u32, e.try_clone().ok()?)))
            .collect()
    }

    /// A handle on the interrupt event; the VMM registers it as the irqfd of the device's
    /// GSI. Each call duplicates the descriptor, which fails only when the process is out of
    /// file descriptors: that is an error for the caller (the VM cannot be built), never a
    /// panic and never a silently unconnected event.
    pub fn interrupt_event(&self) -> Result<EventFd, VirtioError> {
        self.irq
            .event()
            .try_clone()
            .map_err(VirtioError::os("irq eventfd handle"))
    }

    /// Ask an active vsock device to send VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (and drop its
    /// connections); a no-op for other devices or before DRIVER_OK.
    pub fn request_transport_reset(&self) {
        if self.is_active() {
            let _ = self.request.write(1);
        }
    }

    /// Stop the worker thread, or drop the one about to start (idempotent; also done on drop).
    /// The device stops serving until the guest resets it.
    pub fn shutdown(&self) {
        self.slot.locked().clear();
    }

    /// Whether the device is active: its worker runs, or the control thread is about to start
    /// it.
    pub fn is_active(&self) -> bool {
        self.slot.locked().active()
    }

    /// Whether the worker thread runs (the control thread has started it).
    pub fn worker_running(&self) -> bool {
        self.slot.locked().running()
    }

    /// The device status register as the guest reads it.
    pub fn device_status(&self) -> u32 {
        let nr = if self.irq.needs_reset() {
            VIRTIO_CONFIG_S_NEEDS_RESET
        } else {
            0
        };
        self.status | nr
    }

    fn offered_features(&self) -> u64 {
        self.kind.offered_features()
    }

    fn selected_queue(&mut self) -> Option<(&mut Queue, &mut u16)> {
        let i = usize::try_from(self.queue_sel).ok()?;
        Some((self.queues.get_mut(i)?, self.requested_sizes.get_mut(i)?))
    }

    fn queue_config_allowed(&self) -> bool {
        self.status & VIRTIO_CONFIG_S_FEATURES_OK != 0
            && self.status & VIRTIO_CONFIG_S_DRIVER_OK == 0
    }

    fn reset(&mut self) {
        self.shutdown();
        for (q, s) in self.queues.iter_mut().zip(self.requested_sizes.iter_mut()) {
            q.reset();
            *s = q.max_size();
        }
        self.queue_sel = 0;
        self.shm_sel = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.acked_features = 0;
        self.status = 0;
        self.irq.clear();
        let _ = self.request.read();
        for n in &self.notify {
            let _ = n.read();
        }
    }

    fn set_status(&mut self, v: u32) {
        if v == 0 {
            self.reset();
            return;
        }
        // Bits may only be added (except by a reset).
        if v & self.status != self.status {
            tracing::debug!(
                "virtio: status write {v:#x} clears bits of {:#x}; ignored",
                self.status
            );
            return;
        }
        let new = v & !self.status;
        let mut v = v & !VIRTIO_CONFIG_S_NEEDS_RESET;
        if new & VIRTIO_CONFIG_S_FEATURES_OK != 0 {
            let unoffered = self.acked_features & !self.offered_features();
            let has_v1 = self.acked_features & (1u64 << VIRTIO_F_VERSION_1) != 0;
            if unoffered != 0 || !has_v1 || self.status & VIRTIO_CONFIG_S_DRIVER == 0 {
                tracing::debug!(
                    "virtio: FEATURES_OK refused (acked {:#x})",
                    self.acked_features
                );
                v &= !VIRTIO_CONFIG_S_FEATURES_OK;
            }
        }
        if new & VIRTIO_CONFIG_S_DRIVER_OK != 0 && v & VIRTIO_CONFIG_S_FEATURES_OK == 0 {
            v &= !VIRTIO_CONFIG_S_DRIVER_OK;
        }
        self.status = v;
        if new & VIRTIO_CONFIG_S_DRIVER_OK != 0 && v & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            self.activate();
        }
    }

    fn activate(&mut self) {
        let all_valid = self
            .queues
            .iter()
            .zip(&self.requested_sizes)
            .all(|(q, &s)| queue_usable(q, s, &self.mem));
        if !all_valid {
            self.metrics.error();
            crate::warn_limited!(
                Some(&self.metrics),
                "{}: DRIVER_OK with an invalid queue",
                self.name
            );
            self.irq.set_needs_reset();
            return;
        }
        match self.request_worker() {
            Ok(()) => {}
            Err(e) => {
                self.metrics.error();
                crate::error_limited!(Some(&self.metrics), "{}: activation failed: {e}", self.name);
                self.irq.set_needs_reset();
            }
        }
    }

    /// Prepares the worker over the current queues and leaves it for the control thread.
    fn request_worker(&mut self) -> Result<(), VirtioError> {
        let setup = self.prepare_worker()?;
        // The thread is named after the device type (`virtio-2`: thread names are short).
        let thread = format!("virtio-{}", self.kind.device_type());
        self.slot.locked().request(setup, thread);
        self.starter.wake();
        Ok(())
    }

    /// Everything the worker owns, made on the vCPU thread with allocation and descriptor
    /// duplication only (the thread, its epoll set and stop event are the control thread's).
    fn prepare_worker(&mut self) -> Result<WorkerSetup, VirtioError> {
        let handler = self.device.activate(self.acked_features)?;
        let queues = self
            .queues
            .iter()
            .map(|q| {
                let mut q = clone_queue(q).map_err(VirtioError::Queue)?;
                q.set_event_idx(self.acked_features & (1u64 << VIRTIO_RING_F_EVENT_IDX) != 0);
                Ok(q)
            })
            .collect::<Result<Vec<_>, VirtioError>>()?;
        let notify = self
            .notify
            .iter()
            .map(|e| e.try_clone().map_err(VirtioError::os("notify eventfd")))
            .collect::<Result<Vec<_>, _>>()?;
        let _ = self.request.read();
        // Chains posted before DRIVER_OK must be seen: kick every queue once.
        for n in &self.notify {
            let _ = n.write(1);
        }
        let io = WorkerIo {
            mem: self.mem.clone(),
            queues,
            notify,
            request: self
                .request
                .try_clone()
                .map_err(VirtioError::os("request eventfd"))?,
            irq: self.irq.clone(),
            metrics: self.metrics.clone(),
        };
        Ok(WorkerSetup {
            io,
            handler,
            kind: self.device.worker_kind(),
        })
    }

    fn read_u32(&self, offset: u32) -> u32 {
        let q = usize::try_from(self.queue_sel)
            .ok()
            .and_then(|i| self.queues.get(i));
        match offset {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC,
            VIRTIO_MMIO_VERSION => VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.kind.device_type(),
            VIRTIO_MMIO_VENDOR_ID => VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.offered_features() as u32,
                1 => (self.offered_features() >> 32) as u32,
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => q.map_or(0, |q| u32::from(q.max_size())),
            VIRTIO_MMIO_QUEUE_READY => q.map_or(0, |q| u32::from(q.ready())),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.irq.status(),
            VIRTIO_MMIO_STATUS => self.device_status(),
            VIRTIO_MMIO_CONFIG_GENERATION => self.config_generation,
            // A region the device does not have reads as all ones (length and base).
            VIRTIO_MMIO_SHM_LEN_LOW..=VIRTIO_MMIO_SHM_BASE_HIGH => {
                match self.device.shm_region(self.shm_sel) {
                    None => u32::MAX,
                    Some((base, len)) => {
                        let v = match offset {
                            VIRTIO_MMIO_SHM_LEN_LOW | VIRTIO_MMIO_SHM_LEN_HIGH => len,
                            _ => base,
                        };
                        match offset {
                            VIRTIO_MMIO_SHM_LEN_LOW | VIRTIO_MMIO_SHM_BASE_LOW => v as u32,
                            _ => (v >> 32) as u32,
                        }
                    }
                }
            }
            _ => 0,
        }
    }

    fn write_u32(&mut self, offset: u32, v: u32) {
        match offset {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = v,
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            VIRTIO_MMIO_DRIVER_FEATURES => {
                let negotiating = self.status & VIRTIO_CONFIG_S_DRIVER != 0
                    && self.status & VIRTIO_CONFIG_S_FEATURES_OK == 0;
                if !negotiating {
                    return;
                }
                match self.driver_features_sel {
                    0 => self.acked_features = (self.acked_features & !0xffff_ffff) | u64::from(v),
                    1 => {
                        self.acked_features =
                            (self.acked_features & 0xffff_ffff) | (u64::from(v) << 32)
                    }
                    _ => {}
                }
            }
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = v,
            VIRTIO_MMIO_SHM_SEL => self.shm_sel = v,
            VIRTIO_MMIO_QUEUE_NOTIFY => {
                if let Some(e) = usize::try_from(v).ok().and_then(|i| self.notify.get(i)) {
                    let _ = e.write(1);
                }
            }
            VIRTIO_MMIO_INTERRUPT_ACK => self.irq.ack(v),
            VIRTIO_MMIO_STATUS => self.set_status(v),
            VIRTIO_MMIO_QUEUE_NUM
            | VIRTIO_MMIO_QUEUE_READY
            | VIRTIO_MMIO_QUEUE_DESC_LOW
            | VIRTIO_MMIO_QUEUE_DESC_HIGH
            | VIRTIO_MMIO_QUEUE_AVAIL_LOW
            | VIRTIO_MMIO_QUEUE_AVAIL_HIGH
            | VIRTIO_MMIO_QUEUE_USED_LOW
            | VIRTIO_MMIO_QUEUE_USED_HIGH => self.write_queue_reg(offset, v),
            _ => tracing::trace!("virtio: write to unknown register {offset:#x}"),
        }
    }

    fn write_queue_reg(&mut self, offset: u32, v: u32) {
        if !self.queue_config_allowed() {
            tracing::debug!(
                "virtio: queue register {offset:#x} written outside FEATURES_OK..DRIVER_OK"
            );
            return;
        }
        let Some((q, requested)) = self.selected_queue() else {
            return;
        };
        match offset {
            VIRTIO_MMIO_QUEUE_NUM => {
                *requested = u16::try_from(v).unwrap_or(0);
                if q.try_set_size(*requested).is_err() {
                    tracing::debug!("virtio: invalid queue size {v}");
                }
            }
            VIRTIO_MMIO_QUEUE_READY => q.set_ready(v == 1),
            VIRTIO_MMIO_QUEUE_DESC_LOW => q.set_desc_table_address(Some(v), None),
            VIRTIO_MMIO_QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(v)),
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => q.set_avail_ring_address(Some(v), None),
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => q.set_avail_ring_address(None, Some(v)),
            VIRTIO_MMIO_QUEUE_USED_LOW => q.set_used_ring_address(Some(v), None),
            VIRTIO_MMIO_QUEUE_USED_HIGH => q.set_used_ring_address(None, Some(v)),
            _ => {}
        }
    }
}

impl BusDevice for MmioDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let config = u64::from(VIRTIO_MMIO_CONFIG);
        if offset >= config {
            self.device.read_config(offset - config, data);
            return;
        }
        data.fill(0);
        // Below the configuration space, so the offset fits a register number.
        let Ok(reg) = u32::try_from(offset) else {
            return;
        };
        if data.len() != 4 || !reg.is_multiple_of(4) {
            return;
        }
        data.copy_from_slice(&self.read_u32(reg).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        // Device configuration (from VIRTIO_MMIO_CONFIG up) is read-only for every device here.
        let Ok(reg) = u32::try_from(offset) else {
            return;
        };
        if reg >= VIRTIO_MMIO_CONFIG {
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return;
        };
        if reg.is_multiple_of(4) {
            self.write_u32(reg, u32::from_le_bytes(bytes));
        }
    }
}

impl Drop for MmioDevice {
    fn drop(&mut self) {
        self.shutdown();
    }
}
