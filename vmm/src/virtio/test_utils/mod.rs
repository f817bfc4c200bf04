//! A harness that plays the guest driver: it lays descriptor tables and rings in a real
//! `GuestMemoryMmap`, drives the MMIO registers through [`BusDevice`], notifies queues and waits
//! on the interrupt `EventFd`. Used by the tests in `vmm/tests/virtio_*.rs`; not for production.

pub mod vring;
pub mod walk;

use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::persist::DeviceState;
use super::{
    DeviceConfig, GuestMemoryMmap, MmioDevice, PersistError, Starter, StarterThread, VirtioError,
};
use crate::bus::BusDevice;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_mmio::{
    VIRTIO_MMIO_CONFIG, VIRTIO_MMIO_DEVICE_FEATURES, VIRTIO_MMIO_DEVICE_FEATURES_SEL,
    VIRTIO_MMIO_DRIVER_FEATURES, VIRTIO_MMIO_DRIVER_FEATURES_SEL, VIRTIO_MMIO_INTERRUPT_ACK,
    VIRTIO_MMIO_INTERRUPT_STATUS, VIRTIO_MMIO_QUEUE_AVAIL_HIGH, VIRTIO_MMIO_QUEUE_AVAIL_LOW,
    VIRTIO_MMIO_QUEUE_DESC_HIGH, VIRTIO_MMIO_QUEUE_DESC_LOW, VIRTIO_MMIO_QUEUE_NOTIFY,
    VIRTIO_MMIO_QUEUE_NUM, VIRTIO_MMIO_QUEUE_NUM_MAX, VIRTIO_MMIO_QUEUE_READY,
    VIRTIO_MMIO_QUEUE_SEL, VIRTIO_MMIO_QUEUE_USED_HIGH, VIRTIO_MMIO_QUEUE_USED_LOW,
    VIRTIO_MMIO_STATUS,
};

/// `VRING_DESC_F_NEXT`.
pub const F_NEXT: u16 = 1;
/// `VRING_DESC_F_WRITE`.
pub const F_WRITE: u16 = 2;

/// Guest RAM size of the harness.
pub const MEM_SIZE: usize = 64 << 20;
const RING_BASE: u64 = 0x10000;
const RING_STRIDE: u64 = 0x10000;
/// First address handed out by [`Driver::alloc`].
pub const DATA_BASE: u64 = 0x10_0000;

/// The driver side of one queue.
#[derive(Debug, Clone)]
pub struct DriverQueue {
    /// Queue size.
    pub size: u16,
    /// Descriptor table address.
    pub desc: u64,
    /// Available ring address.
    pub avail: u64,
    /// Used ring address.
    pub used: u64,
    avail_idx: u16,
    used_seen: u16,
    free: Vec<u16>,
}

/// A buffer the driver offers: address, length, device-writable.
#[derive(Debug, Clone, Copy)]
pub struct Seg {
    /// Guest address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Device-writable.
    pub write: bool,
}

impl Seg {
    /// A buffer the device reads (driver to device).
    pub fn readable(addr: u64, len: u32) -> Seg {
        Seg {
            addr,
            len,
            write: false,
        }
    }

    /// A buffer the device writes (device to driver).
    pub fn writable(addr: u64, len: u32) -> Seg {
        Seg {
            addr,
            len,
            write: true,
        }
    }
}

/// The fake guest driver.
pub struct Driver {
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// The device under test.
    pub dev: MmioDevice,
    /// The interrupt event of the device.
    pub irq: EventFd,
    /// Driver-side queues (after [`Driver::setup_queues`]).
    pub queues: Vec<DriverQueue>,
    next_alloc: u64,
    /// Where the device asks for its worker.
    pub starter: Starter,
    /// The device control thread that starts the worker, as a VM's does (after `dev` in
    /// drop order: the device stops its worker, then the thread ends); none for
    /// [`Driver::unserved`].
    _devctl: Option<StarterThread>,
}

/// Fresh guest memory for the harness.
pub fn guest_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).expect("guest memory")
}

impl Driver {
    /// Build the device for `cfg` over fresh memory, with a device control thread of its own
    /// that starts the worker at DRIVER_OK (as a VM's `vm<N>-devctl` does). Both run under the
    /// production seccomp filters (`vm_jail::seccomp`), as in `vm-vmm`: a device making a system
    /// call outside its allowlist kills the test process with `SIGSYS`.
    pub fn new(cfg: &DeviceConfig) -> Result<Driver, VirtioError> {
        let mut d = Self::unserved(cfg)?;
        d._devctl = Some(d.starter.spawn("test-devctl".into())?);
        Ok(d)
    }

    /// Like [`Driver::new`] with no thread serving the starter: a worker the device asks for
    /// starts only when the test calls `starter.start_pending()`.
    pub fn unserved(cfg: &DeviceConfig) -> Result<Driver, VirtioError> {
        vm_jail::seccomp::enable();
        let mem = guest_memory();
        let starter = Starter::new()?;
        let dev = MmioDevice::new(cfg, mem.clone(), &starter)?;
        let irq = dev.interrupt_event()?;
        Ok(Driver {
            mem,
            dev,
            irq,
            queues: Vec::new(),
            next_alloc: DATA_BASE,
            starter,
            _devctl: None,
        })
    }

    /// The device's state, as a snapshot saves it (its worker stopped; no vCPU runs here).
    pub fn save(&mut self) -> Result<DeviceState, PersistError> {
        self.dev.save_state()
    }

    /// A restored copy: a fresh device for `cfg` over a copy of this guest memory, set to
    /// `state` (its worker started by a control thread of its own), with this driver's
    /// bookkeeping (queues, allocations) carried over, as a guest's own memory would.
    pub fn restore_copy(
        &self,
        cfg: &DeviceConfig,
        state: &DeviceState,
    ) -> Result<Driver, PersistError> {
        let mem = guest_memory();
        let bytes = self.read_mem(0, MEM_SIZE);
        mem.write_slice(&bytes, GuestAddress(0))
            .expect("copy guest memory");
        let device_err = |source| PersistError::Device {
            device: cfg.name(),
            source,
        };
        let starter = Starter::new().map_err(device_err)?;
        let mut dev = MmioDevice::new(cfg, mem.clone(), &starter).map_err(device_err)?;
        dev.restore_state(state)?;
        let irq = dev.interrupt_event().map_err(device_err)?;
        let devctl = starter.spawn("test-devctl".into()).map_err(device_err)?;
        Ok(Driver {
            mem,
            dev,
            irq,
            queues: self.queues.clone(),
            next_alloc: self.next_alloc,
            starter,
            _devctl: Some(devctl),
        })
    }

    /// The device's counters now.
    pub fn metrics(&self) -> crate::metrics::DeviceSnapshot {
        self.dev.metrics().snapshot()
    }

    /// Waits (up to 5 s) until the control thread has started the worker the device asked
    /// for, or the device gave up (DEVICE_NEEDS_RESET); whether a worker runs.
    pub fn wait_worker(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.dev.is_active() && !self.dev.worker_running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.dev.worker_running()
    }

    /// Read a 32-bit register.
    pub fn read_reg(&mut self, offset: u32) -> u32 {
        let mut b = [0u8; 4];
        self.dev.read(u64::from(offset), &mut b);
        u32::from_le_bytes(b)
    }

    /// Write a 32-bit register. The status register is written as a vCPU thread writes it:
    /// on a thread under the vCPU seccomp filter, so every activation and reset path is proven
    /// to need nothing that filter lacks (a forbidden call kills the test process).
    pub fn write_reg(&mut self, offset: u32, v: u32) {
        if offset != VIRTIO_MMIO_STATUS {
            self.dev.write(u64::from(offset), &v.to_le_bytes());
            return;
        }
        let dev = &mut self.dev;
        std::thread::scope(|s| {
            let vcpu = std::thread::Builder::new()
                .name("test-vcpu".into())
                .spawn_scoped(s, || {
                    vm_jail::seccomp::apply_or_exit(vm_jail::seccomp::ThreadKind::Vcpu);
                    dev.write(u64::from(offset), &v.to_le_bytes());
                })
                .expect("a vCPU-like thread");
            vcpu.join().expect("the status write panicked");
        });
    }

    /// Read `len` bytes of device config space.
    pub fn read_config(&mut self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.dev
            .read(u64::from(VIRTIO_MMIO_CONFIG) + offset, &mut v);
        v
    }

    /// The device status register.
    pub fn status(&mut self) -> u32 {
        self.read_reg(VIRTIO_MMIO_STATUS)
    }

    /// The features the device offers.
    pub fn device_features(&mut self) -> u64 {
        self.write_reg(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
        let lo = self.read_reg(VIRTIO_MMIO_DEVICE_FEATURES);
        self.write_reg(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        let hi = self.read_reg(VIRTIO_MMIO_DEVICE_FEATURES);
        (u64::from(hi) << 32) | u64::from(lo)
    }

    /// ACKNOWLEDGE, DRIVER, write `features`, FEATURES_OK; returns whether FEATURES_OK stuck.
    pub fn negotiate(&mut self, features: u64) -> bool {
        self.write_reg(VIRTIO_MMIO_STATUS, 0);
        self.write_reg(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        self.write_reg(
            VIRTIO_MMIO_STATUS,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
        );
        self.write_reg(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        self.write_reg(VIRTIO_MMIO_DRIVER_FEATURES, features as u32);
        self.write_reg(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        self.write_reg(VIRTIO_MMIO_DRIVER_FEATURES, (features >> 32) as u32);
        self.write_reg(
            VIRTIO_MMIO_STATUS,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK,
        );
        self.status() & VIRTIO_CONFIG_S_FEATURES_OK != 0
    }

    /// Program queue `i` with `size` entries at the harness's fixed ring addresses.
    pub fn setup_queue(&mut self, i: u32, size: u16) {
        let base = RING_BASE + u64::from(i) * RING_STRIDE;
        let q = DriverQueue {
            size,
            desc: base,
            avail: base + 0x4000,
            used: base + 0x8000,
            avail_idx: 0,
            used_seen: 0,
            free: (0..size).rev().collect(),
        };
        // Zero the rings.
        let _ = self
            .mem
            .write_slice(&vec![0u8; RING_STRIDE as usize], GuestAddress(base));
        self.write_reg(VIRTIO_MMIO_QUEUE_SEL, i);
        self.write_reg(VIRTIO_MMIO_QUEUE_NUM, u32::from(size));
        for (lo, hi, addr) in [
            (
                VIRTIO_MMIO_QUEUE_DESC_LOW,
                VIRTIO_MMIO_QUEUE_DESC_HIGH,
                q.desc,
            ),
            (
                VIRTIO_MMIO_QUEUE_AVAIL_LOW,
                VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
                q.avail,
            ),
            (
                VIRTIO_MMIO_QUEUE_USED_LOW,
                VIRTIO_MMIO_QUEUE_USED_HIGH,
                q.used,
            ),
        ] {
            self.write_reg(lo, addr as u32);
            self.write_reg(hi, (addr >> 32) as u32);
        }
        self.write_reg(VIRTIO_MMIO_QUEUE_READY, 1);
        let idx = i as usize;
        if self.queues.len() <= idx {
            self.queues.resize(idx + 1, q.clone());
        }
        self.queues[idx] = q;
    }

    /// Set up every queue at its maximum size.
    pub fn setup_queues(&mut self) {
        let mut i = 0;
        loop {
            self.write_reg(VIRTIO_MMIO_QUEUE_SEL, i);
            let max = self.read_reg(VIRTIO_MMIO_QUEUE_NUM_MAX);
            if max == 0 {
                break;
            }
            self.setup_queue(i, max as u16);
            i += 1;
        }
    }

    /// Set DRIVER_OK.
    pub fn driver_ok(&mut self) {
        let s = self.status();
        self.write_reg(VIRTIO_MMIO_STATUS, s | VIRTIO_CONFIG_S_DRIVER_OK);
    }

    /// The usual bring-up: negotiate `VERSION_1 | extra`, set up all queues, DRIVER_OK, and
    /// wait for the control thread to start the worker.
    pub fn activate(&mut self, extra: u64) {
        self.bring_up(extra);
        assert!(self.wait_worker(), "device did not activate");
    }

    /// The bring-up of [`Driver::activate`] (no extra feature) without waiting for the
    /// worker: DRIVER_OK returns before any thread starts it.
    pub fn activate_unserved(&mut self) {
        self.bring_up(0);
    }

    fn bring_up(&mut self, extra: u64) {
        assert!(
            self.negotiate((1u64 << VIRTIO_F_VERSION_1) | extra),
            "FEATURES_OK refused"
        );
        self.setup_queues();
        self.driver_ok();
    }

    /// Allocate `len` bytes of guest memory (16-byte aligned; never freed).
    pub fn alloc(&mut self, len: u64) -> u64 {
        let a = self.next_alloc;
        self.next_alloc = (a + len + 15) & !15;
        assert!(
            self.next_alloc <= MEM_SIZE as u64,
            "harness out of guest memory"
        );
        a
    }

    /// Write bytes into guest memory.
    pub fn write_mem(&self, addr: u64, data: &[u8]) {
        self.mem
            .write_slice(data, GuestAddress(addr))
            .expect("write guest memory");
    }

    /// Read bytes from guest memory.
    pub fn read_mem(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .read_slice(&mut v, GuestAddress(addr))
            .expect("read guest memory");
        v
    }

    /// Write raw descriptor `idx` of queue `q`.
    pub fn write_desc(&self, q: usize, idx: u16, seg: Seg, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&seg.addr.to_le_bytes());
        d[8..12].copy_from_slice(&seg.len.to_le_bytes());
        let f = flags | if seg.write { F_WRITE } else { 0 };
        d[12..14].copy_from_slice(&f.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.write_mem(self.queues[q].desc + u64::from(idx) * 16, &d);
    }

    /// Put `head` in the available ring of `q` and publish it (no notify).
    pub fn push_avail(&mut self, q: usize, head: u16) {
        let dq = &self.queues[q];
        let slot = dq.avail + 4 + u64::from(dq.avail_idx % dq.size) * 2;
        let new_idx = dq.avail_idx.wrapping_add(1);
        self.write_mem(slot, &head.to_le_bytes());
        self.set_avail_idx(q, new_idx);
    }

    /// Overwrite the avail index of `q` (to test a driver that runs ahead).
    pub fn set_avail_idx(&mut self, q: usize, idx: u16) {
        self.queues[q].avail_idx = idx;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let a = self.queues[q].avail + 2;
        self.write_mem(a, &idx.to_le_bytes());
    }

    /// Lay `segs` out as a chain from free descriptors and publish it; returns the head.
    pub fn add_chain(&mut self, q: usize, segs: &[Seg]) -> u16 {
        assert!(
            !segs.is_empty() && segs.len() <= self.queues[q].free.len(),
            "no free descriptors"
        );
        let idxs: Vec<u16> = (0..segs.len())
            .map(|_| self.queues[q].free.pop().expect("free"))
            .collect();
        for (i, seg) in segs.iter().enumerate() {
            let (flags, next) = if i + 1 < segs.len() {
                (F_NEXT, idxs[i + 1])
            } else {
                (0, 0)
            };
            self.write_desc(q, idxs[i], *seg, flags, next);
        }
        self.push_avail(q, idxs[0]);
        idxs[0]
    }

    /// Notify queue `q` through the notify register.
    pub fn notify(&mut self, q: u32) {
        self.write_reg(VIRTIO_MMIO_QUEUE_NOTIFY, q);
    }

    /// The next used element of `q` if one is there: (head, len). Reclaims its descriptors.
    pub fn try_used(&mut self, q: usize) -> Option<(u16, u32)> {
        let dq = self.queues[q].clone();
        let mut idx = [0u8; 2];
        self.mem
            .read_slice(&mut idx, GuestAddress(dq.used + 2))
            .ok()?;
        if u16::from_le_bytes(idx) == dq.used_seen {
            return None;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let e = self.read_mem(dq.used + 4 + u64::from(dq.used_seen % dq.size) * 8, 8);
        let head = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as u16;
        let len = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        self.queues[q].used_seen = dq.used_seen.wrapping_add(1);
        // Reclaim the chain's descriptors (bounded walk).
        let mut i = head;
        for _ in 0..dq.size {
            if i >= dq.size {
                break;
            }
            self.queues[q].free.push(i);
            let d = self.read_mem(dq.desc + u64::from(i) * 16, 16);
            let flags = u16::from_le_bytes([d[12], d[13]]);
            if flags & F_NEXT == 0 {
                break;
            }
            i = u16::from_le_bytes([d[14], d[15]]);
        }
        Some((head, len))
    }

    /// Wait (on the irq eventfd) up to `timeout` for a used element of `q`.
    pub fn wait_used(&mut self, q: usize, timeout: Duration) -> Option<(u16, u32)> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(u) = self.try_used(q) {
                return Some(u);
            }
            let left = end.checked_duration_since(Instant::now())?;
            if !self.wait_irq(left.min(Duration::from_millis(50))) {
                continue;
            }
        }
    }

    /// Wait up to `timeout` for the interrupt; acks it. Returns whether it fired.
    pub fn wait_irq(&mut self, timeout: Duration) -> bool {
        if !crate::sys::wait_readable(&self.irq, timeout) {
            return false;
        }
        let _ = self.irq.read();
        let st = self.read_reg(VIRTIO_MMIO_INTERRUPT_STATUS);
        self.write_reg(VIRTIO_MMIO_INTERRUPT_ACK, st);
        true
    }

    /// Free descriptors left in queue `q`.
    pub fn free_descs(&self, q: usize) -> usize {
        self.queues[q].free.len()
    }
}

pub mod vsock_guest;
