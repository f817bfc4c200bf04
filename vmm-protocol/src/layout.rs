//! The limits of a VM's device layout a launcher plans by (the VMM's own address map,
//! `vmm::layout`, is built on them).

/// GSI of the first virtio-mmio device; device `i` uses `VIRTIO_GSI_BASE + i`.
pub const VIRTIO_GSI_BASE: u32 = 5;
/// Highest GSI the IOAPIC routes (24 pins).
pub const MAX_GSI: u32 = 23;
/// Most virtio-mmio devices a VM can have (one GSI each).
pub const MAX_VIRTIO_DEVICES: usize = (MAX_GSI - VIRTIO_GSI_BASE + 1) as usize;
/// The distance between two virtio-fs devices' DAX windows, and the largest window (16 GiB).
pub const DAX_WINDOW_STRIDE: u64 = 16 << 30;
/// Most connections (established, connecting and pending host clients) one vsock device
/// holds.
pub const VSOCK_MAX_CONNECTIONS: usize = 1023;
