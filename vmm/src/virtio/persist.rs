//! The saved state of a virtio-mmio device, as plain serde types, and the checks a decoded
//! one must pass before any device is built from it (Firecracker's `virtio/persist.rs` split).
//!
//! A [`DeviceState`] is the device's identity ([`DeviceKind`]: what a restore's device list
//! must match), the transport's registers ([`TransportState`]) and one [`QueueState`] per
//! queue. What the backends hold is not saved: a block disk is its file (reopened by path,
//! its size checked), rng has nothing, and vsock connections cannot outlive their host
//! sockets (a restored vsock device starts with none and tells the guest so with a
//! `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`).
//!
//! Each device declares its identity in its own module ([`Identity`]); [`DeviceKind`] holds
//! one, and `with_identity!` is the one dispatch over them.
//!
//! [`DeviceState::validate`] needs no device and no KVM: a device's queue count and maximum
//! sizes and its offered features follow from its kind, and guest RAM from the saved
//! regions. So a hostile state file is refused by the decoder, with a variant naming what,
//! before anything is opened. How a device is quiesced for a save and started again on a
//! restore is in `mmio/persist.rs`.

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use super::DeviceConfig;
pub use super::block::persist::BlockIdentity;
pub use super::fs::persist::FsIdentity;
pub use super::rng::persist::RngIdentity;
pub use super::vsock::persist::VsockIdentity;
use crate::layout::MAX_VIRTIO_DEVICES;
use crate::snapshot::state::RegionState;

/// The first field in which a device's saved identity and what it is compared with (a
/// configuration, the rebuilt device) differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The field: `type`, `path`, `size`, …
    pub field: &'static str,
    /// Its value in the snapshot.
    pub saved: String,
    /// Its value now.
    pub now: String,
}

impl Difference {
    /// `Some` naming `field` when `saved` and `now` differ.
    pub fn of<T: PartialEq>(
        field: &'static str,
        saved: &T,
        now: &T,
        show: impl Fn(&T) -> String,
    ) -> Option<Difference> {
        (saved != now).then(|| Difference {
            field,
            saved: show(saved),
            now: show(now),
        })
    }

    fn of_type(saved: &'static str, now: String) -> Difference {
        Difference {
            field: "type",
            saved: saved.into(),
            now,
        }
    }
}

/// A device's identity, declared in the device's own module (`block/persist.rs`,
/// `vsock/persist.rs`, `rng/persist.rs`, `fs/persist.rs`): what it is, what a restore must
/// match, and what the transport offers for it. [`DeviceKind`] holds one of them.
pub trait Identity: Sized {
    /// The virtio device id.
    fn device_type(&self) -> u32;
    /// Its short name in errors: `block`, `vsock`, `rng`, `fs`.
    fn name(&self) -> &'static str;
    /// Maximum size of each queue, as the device model offers them.
    fn queue_max_sizes(&self) -> &'static [u16];
    /// The device's own features the transport offers (beyond `VIRTIO_F_VERSION_1`).
    fn device_features(&self) -> u64 {
        0
    }
    /// This device's identity in `kind`, if `kind` is this device.
    fn of(kind: &DeviceKind) -> Option<&Self>;
    /// The first field in which `self` (saved) and `now` (the rebuilt device) differ.
    fn difference(&self, now: &Self) -> Option<Difference>;
    /// The first field in which `self` (saved) and `cfg` differ, `None` when `cfg` is this
    /// device as saved (what it learns once opened, a disk's size, is checked by
    /// [`Identity::difference`]); the type when `cfg` is another device.
    fn config_difference(&self, cfg: &DeviceConfig) -> Option<Difference>;
}

/// `Difference` of the types of `saved` and `cfg`.
pub(crate) fn other_type(saved: &impl Identity, cfg: &DeviceConfig) -> Option<Difference> {
    Some(Difference::of_type(saved.name(), cfg.name()))
}

/// What a device is, as far as a restore must match it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    /// virtio-blk over a raw image file.
    Block(BlockIdentity),
    /// virtio-vsock.
    Vsock(VsockIdentity),
    /// virtio-rng.
    Rng(RngIdentity),
    /// virtio-fs: the read-only file server of one host mount.
    Fs(FsIdentity),
}

/// `$body` with `$id` bound to the identity inside `$kind`, whichever device it is: the one
/// place a new device is added to the dispatch.
macro_rules! with_identity {
    ($kind:expr, $id:ident => $body:expr) => {
        match $kind {
            DeviceKind::Block($id) => $body,
            DeviceKind::Vsock($id) => $body,
            DeviceKind::Rng($id) => $body,
            DeviceKind::Fs($id) => $body,
        }
    };
}

impl DeviceKind {
    /// The virtio device id.
    pub fn device_type(&self) -> u32 {
        with_identity!(self, id => id.device_type())
    }

    /// Its short name in errors: `block`, `vsock`, `rng`, `fs`.
    pub fn name(&self) -> &'static str {
        with_identity!(self, id => id.name())
    }

    /// Maximum size of each queue, as the device model offers them.
    pub fn queue_max_sizes(&self) -> &'static [u16] {
        with_identity!(self, id => id.queue_max_sizes())
    }

    /// Every feature the transport offers for this device (`VIRTIO_F_VERSION_1` included).
    pub fn offered_features(&self) -> u64 {
        with_identity!(self, id => id.device_features()) | (1u64 << VIRTIO_F_VERSION_1)
    }

    /// The first field in which `self` (saved) and `now` (the rebuilt device) differ.
    pub fn difference(&self, now: &DeviceKind) -> Option<Difference> {
        fn pair<I: Identity>(saved: &I, now: &DeviceKind) -> Option<Difference> {
            match I::of(now) {
                Some(n) => saved.difference(n),
                None => Some(Difference::of_type(saved.name(), now.name().into())),
            }
        }
        with_identity!(self, id => pair(id, now))
    }

    /// The first field in which `self` (saved) and the configuration `cfg` differ.
    pub fn config_difference(&self, cfg: &DeviceConfig) -> Option<Difference> {
        with_identity!(self, id => id.config_difference(cfg))
    }
}

/// The transport's registers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportState {
    /// The device status register (without DEVICE_NEEDS_RESET, which is `needs_reset`).
    pub status: u32,
    /// Whether the device was in DEVICE_NEEDS_RESET.
    pub needs_reset: bool,
    /// Features the driver acknowledged.
    pub acked_features: u64,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// QueueSel.
    pub queue_sel: u32,
    /// ConfigGeneration.
    pub config_generation: u32,
    /// InterruptStatus (bits the driver had not acknowledged yet).
    pub interrupt_status: u32,
}

/// One virtqueue's configuration and positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// The size the driver selected.
    pub size: u16,
    /// QueueReady.
    pub ready: bool,
    /// Descriptor table address.
    pub desc: u64,
    /// Available ring address.
    pub avail: u64,
    /// Used ring address.
    pub used: u64,
    /// The next available-ring entry the device reads.
    pub next_avail: u16,
    /// The next used-ring entry the device writes.
    pub next_used: u16,
    /// `VIRTIO_RING_F_EVENT_IDX` in force.
    pub event_idx: bool,
}

/// One device's saved state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    /// What the device is.
    pub kind: DeviceKind,
    /// Its transport registers.
    pub transport: TransportState,
    /// Its queues, by index.
    pub queues: Vec<QueueState>,
    /// A virtio-fs device's FUSE session (the guest's node ids, handles and DAX window),
    /// resolved again and checked against the host tree on restore; `None` for others.
    pub fs: Option<vm_virtiofs::SessionState>,
}

/// Why a saved device state is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDevice {
    /// A file system session on a device that is not virtio-fs, or none on one that is.
    #[error("device {0}: a file system session does not match its kind")]
    Session(usize),
    /// More devices than the VMM can place.
    #[error("{0} virtio devices (at most {MAX_VIRTIO_DEVICES})")]
    TooMany(usize),
    /// The queue count is not the device's.
    #[error("device {device} ({kind}) has {found} queues, the device {expected}")]
    QueueCount {
        /// Device index.
        device: usize,
        /// Its kind.
        kind: &'static str,
        /// Queues saved.
        found: usize,
        /// Queues the device has.
        expected: usize,
    },
    /// A queue size of 0, not a power of two, or above the queue's maximum.
    #[error("device {device} queue {queue} size {size} (maximum {max}, a power of two)")]
    QueueSize {
        /// Device index.
        device: usize,
        /// Queue index.
        queue: usize,
        /// Saved size.
        size: u16,
        /// The queue's maximum.
        max: u16,
    },
    /// A ring that is misaligned or not inside one guest RAM region.
    #[error("device {device} queue {queue} {ring} at {addr:#x} is not inside guest RAM")]
    QueueAddress {
        /// Device index.
        device: usize,
        /// Queue index.
        queue: usize,
        /// `desc`, `avail` or `used`.
        ring: &'static str,
        /// Its address.
        addr: u64,
    },
    /// Acked features the device never offered (or EVENT_IDX in force without being acked).
    #[error("device {device} acked features {acked:#x}, offered {offered:#x}")]
    Features {
        /// Device index.
        device: usize,
        /// Acked (or in force).
        acked: u64,
        /// Offered.
        offered: u64,
    },
    /// Status or interrupt bits that do not exist.
    #[error("device {device} {register} {value:#x} has unknown bits")]
    Register {
        /// Device index.
        device: usize,
        /// `status` or `interrupt_status`.
        register: &'static str,
        /// The value.
        value: u32,
    },
}

const STATUS_BITS: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE
    | VIRTIO_CONFIG_S_DRIVER
    | VIRTIO_CONFIG_S_FEATURES_OK
    | VIRTIO_CONFIG_S_DRIVER_OK
    | VIRTIO_CONFIG_S_FAILED;
const INTERRUPT_BITS: u32 = VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG;

/// Whether `[addr, addr + len)` is aligned to `align` and inside one of `regions`.
fn in_ram(regions: &[RegionState], addr: u64, len: u64, align: u64) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    addr.is_multiple_of(align)
        && regions
            .iter()
            .any(|r| addr >= r.guest_addr && end <= r.guest_addr.saturating_add(r.size))
}

/// Checks every device of a state against the VMM's device limit and `regions` (guest RAM).
pub fn validate_devices(
    devices: &[DeviceState],
    regions: &[RegionState],
) -> Result<(), InvalidDevice> {
    if devices.len() > MAX_VIRTIO_DEVICES {
        return Err(InvalidDevice::TooMany(devices.len()));
    }
    devices
        .iter()
        .enumerate()
        .try_for_each(|(i, d)| d.validate(i, regions))
}

impl DeviceState {
    /// Checks device `index` (see the module docs).
    pub fn validate(&self, index: usize, regions: &[RegionState]) -> Result<(), InvalidDevice> {
        let t = &self.transport;
        let register = |register, value| InvalidDevice::Register {
            device: index,
            register,
            value,
        };
        if t.status & !STATUS_BITS != 0 {
            return Err(register("status", t.status));
        }
        if t.interrupt_status & !INTERRUPT_BITS != 0 {
            return Err(register("interrupt_status", t.interrupt_status));
        }
        let offered = self.kind.offered_features();
        let features = |acked| InvalidDevice::Features {
            device: index,
            acked,
            offered,
        };
        if t.acked_features & !offered != 0 {
            return Err(features(t.acked_features));
        }
        if self.fs.is_some() != matches!(self.kind, DeviceKind::Fs(_)) {
            return Err(InvalidDevice::Session(index));
        }
        let maxes = self.kind.queue_max_sizes();
        if self.queues.len() != maxes.len() {
            return Err(InvalidDevice::QueueCount {
                device: index,
                kind: self.kind.name(),
                found: self.queues.len(),
                expected: maxes.len(),
            });
        }
        for (queue, (q, &max)) in self.queues.iter().zip(maxes).enumerate() {
            if q.size == 0 || !q.size.is_power_of_two() || q.size > max {
                return Err(InvalidDevice::QueueSize {
                    device: index,
                    queue,
                    size: q.size,
                    max,
                });
            }
            if q.event_idx && t.acked_features & (1u64 << VIRTIO_RING_F_EVENT_IDX) == 0 {
                return Err(features(
                    t.acked_features | (1u64 << VIRTIO_RING_F_EVENT_IDX),
                ));
            }
            let n = u64::from(q.size);
            // Split virtqueue layout (virtio 1.2 §2.7): sizes and alignments of each part.
            for (ring, addr, len, align) in [
                ("desc", q.desc, 16 * n, 16),
                ("avail", q.avail, 6 + 2 * n, 2),
                ("used", q.used, 6 + 8 * n, 4),
            ] {
                if !in_ram(regions, addr, len, align) {
                    return Err(InvalidDevice::QueueAddress {
                        device: index,
                        queue,
                        ring,
                        addr,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An rng device after DRIVER_OK with a few buffers served.
    pub(crate) fn sample_rng() -> DeviceState {
        DeviceState {
            kind: DeviceKind::Rng(RngIdentity),
            transport: TransportState {
                status: STATUS_BITS & !VIRTIO_CONFIG_S_FAILED,
                needs_reset: false,
                acked_features: 1u64 << VIRTIO_F_VERSION_1,
                device_features_sel: 1,
                driver_features_sel: 1,
                queue_sel: 0,
                config_generation: 0,
                interrupt_status: VIRTIO_MMIO_INT_VRING,
            },
            queues: vec![QueueState {
                size: 256,
                ready: true,
                desc: 0x10000,
                avail: 0x14000,
                used: 0x18000,
                next_avail: 3,
                next_used: 3,
                event_idx: false,
            }],
            fs: None,
        }
    }

    fn ram() -> Vec<RegionState> {
        vec![RegionState {
            guest_addr: 0,
            size: 16 << 20,
        }]
    }

    #[test]
    fn each_bad_field_has_its_own_error() {
        let check = |d: &DeviceState| d.validate(0, &ram());
        check(&sample_rng()).unwrap();
        let mut d = sample_rng();
        d.queues[0].size = 512;
        assert!(matches!(
            check(&d),
            Err(InvalidDevice::QueueSize {
                size: 512,
                max: 256,
                ..
            })
        ));
        d.queues[0].size = 48;
        assert!(matches!(
            check(&d),
            Err(InvalidDevice::QueueSize { size: 48, .. })
        ));
        let mut d = sample_rng();
        d.queues[0].used = (16 << 20) - 8;
        assert!(matches!(
            check(&d),
            Err(InvalidDevice::QueueAddress { ring: "used", .. })
        ));
        let mut d = sample_rng();
        d.queues[0].desc = u64::MAX - 4;
        assert!(matches!(
            check(&d),
            Err(InvalidDevice::QueueAddress { ring: "desc", .. })
        ));
        let mut d = sample_rng();
        d.queues[0].avail = 0x14001;
        assert!(matches!(
            check(&d),
            Err(InvalidDevice::QueueAddress { ring: "avail", .. })
        ));
        let mut d = sample_rng();
        d.transport.acked_features |= 1 << 5;
        assert!(matches!(check(&d), Err(InvalidDevice::Features { .. })));
        let mut d = sample_rng();
        d.queues[0].event_idx = true;
        assert!(matches!(check(&d), Err(InvalidDevice::Features { .. })));
        let mut d = sample_rng();
        d.queues.push(d.queues[0]);
        assert!(matches!(
            check(&d),
            Err(InvalidDevice::QueueCount {
                found: 2,
                expected: 1,
                kind: "rng",
                ..
            })
        ));
        let mut d = sample_rng();
        d.transport.status |= 0x100;
        assert!(matches!(
            check(&d),
            Err(InvalidDevice::Register {
                register: "status",
                ..
            })
        ));
        let mut d = sample_rng();
        d.transport.interrupt_status = 4;
        assert!(matches!(
            check(&d),
            Err(InvalidDevice::Register {
                register: "interrupt_status",
                ..
            })
        ));
        let many = vec![sample_rng(); MAX_VIRTIO_DEVICES + 1];
        assert_eq!(
            validate_devices(&many, &ram()),
            Err(InvalidDevice::TooMany(MAX_VIRTIO_DEVICES + 1))
        );
        validate_devices(&many[1..], &ram()).unwrap();
    }

    #[test]
    fn offered_features_follow_the_kind() {
        let ro = DeviceKind::Block(BlockIdentity {
            path: "/d".into(),
            size: 512,
            read_only: true,
        });
        let rw = DeviceKind::Block(BlockIdentity {
            path: "/d".into(),
            size: 512,
            read_only: false,
        });
        assert_ne!(ro.offered_features(), rw.offered_features());
        assert_eq!(
            DeviceKind::Rng(RngIdentity).offered_features(),
            1u64 << VIRTIO_F_VERSION_1
        );
        assert_eq!(
            DeviceKind::Vsock(VsockIdentity { guest_cid: 3 })
                .queue_max_sizes()
                .len(),
            3
        );
    }
}
