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
//! [`DeviceState::validate`] needs no device and no KVM: a device's queue count and maximum
//! sizes and its offered features follow from its kind, and guest RAM from the saved
//! regions. So a hostile state file is refused by the decoder, with a variant naming what,
//! before anything is opened. How a device is quiesced for a save and started again on a
//! restore is in `mmio/persist.rs`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_ids::{VIRTIO_ID_BLOCK, VIRTIO_ID_RNG, VIRTIO_ID_VSOCK};
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use crate::layout::MAX_VIRTIO_DEVICES;
use crate::snapshot::state::RegionState;

/// What a device is, as far as a restore must match it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    /// virtio-blk over a raw image file.
    Block {
        /// The image's host path.
        path: PathBuf,
        /// Its size in bytes when the snapshot was taken.
        size: u64,
        /// Opened read-only (a snapshot only carries read-only disks).
        read_only: bool,
    },
    /// virtio-vsock.
    Vsock {
        /// The guest's CID.
        guest_cid: u64,
    },
    /// virtio-rng.
    Rng,
    /// virtio-fs: the read-only file server of one host mount.
    Fs {
        /// The device's tag.
        tag: String,
        /// The mount's source on the host.
        share: PathBuf,
        /// The DAX window's size in bytes (0: none).
        dax_window: u64,
    },
}

impl DeviceKind {
    /// The virtio device id.
    pub fn device_type(&self) -> u32 {
        match self {
            DeviceKind::Block { .. } => VIRTIO_ID_BLOCK,
            DeviceKind::Vsock { .. } => VIRTIO_ID_VSOCK,
            DeviceKind::Rng => VIRTIO_ID_RNG,
            DeviceKind::Fs { .. } => super::fs::VIRTIO_ID_FS,
        }
    }

    /// Its short name in errors: `block`, `vsock`, `rng`, `fs`.
    pub fn name(&self) -> &'static str {
        match self {
            DeviceKind::Block { .. } => "block",
            DeviceKind::Vsock { .. } => "vsock",
            DeviceKind::Rng => "rng",
            DeviceKind::Fs { .. } => "fs",
        }
    }

    /// Maximum size of each queue, as the device model offers them.
    pub fn queue_max_sizes(&self) -> &'static [u16] {
        match self {
            DeviceKind::Block { .. } => super::block::QUEUE_SIZES,
            DeviceKind::Vsock { .. } => super::vsock::QUEUE_SIZES,
            DeviceKind::Rng => super::rng::QUEUE_SIZES,
            DeviceKind::Fs { .. } => super::fs::QUEUE_SIZES,
        }
    }

    /// Every feature the transport offers for this device (`VIRTIO_F_VERSION_1` included).
    pub fn offered_features(&self) -> u64 {
        let device = match self {
            DeviceKind::Block { read_only, .. } => super::block::offered_features(*read_only),
            DeviceKind::Vsock { .. } | DeviceKind::Rng | DeviceKind::Fs { .. } => 0,
        };
        device | (1u64 << VIRTIO_F_VERSION_1)
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
        if self.fs.is_some() != matches!(self.kind, DeviceKind::Fs { .. }) {
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
            kind: DeviceKind::Rng,
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
        let ro = DeviceKind::Block {
            path: "/d".into(),
            size: 512,
            read_only: true,
        };
        let rw = DeviceKind::Block {
            path: "/d".into(),
            size: 512,
            read_only: false,
        };
        assert_ne!(ro.offered_features(), rw.offered_features());
        assert_eq!(
            DeviceKind::Rng.offered_features(),
            1u64 << VIRTIO_F_VERSION_1
        );
        assert_eq!(
            DeviceKind::Vsock { guest_cid: 3 }.queue_max_sizes().len(),
            3
        );
    }
}
