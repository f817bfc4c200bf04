//! Port-I/O and MMIO dispatch.
//!
//! A [`Bus`] maps non-overlapping address ranges to devices. vCPU exit handling looks the
//! faulting address up here; the device sees the offset into its own range. Everything a guest
//! can send through here is bounded by the access width (at most 8 bytes for MMIO on x86).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use vm_sync::Lock;

/// A device reachable through port I/O or MMIO.
///
/// Implementations must tolerate any offset and access width the guest chooses: an access they do
/// not understand reads as zero (or all ones) and writes are ignored. They must never panic.
pub trait BusDevice: Send {
    /// Read `data.len()` bytes at `offset` into this device's range.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Write `data` at `offset` into this device's range.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// A shared handle to a bus device.
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// Errors of building a bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The new range overlaps one already inserted.
    #[error("bus range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap {
        /// Base of the rejected range.
        base: u64,
        /// Length of the rejected range.
        len: u64,
    },
    /// A zero-length range.
    #[error("bus range at {0:#x} has zero length")]
    ZeroLength(u64),
}

#[derive(Clone)]
struct Entry {
    len: u64,
    device: SharedDevice,
}

/// An address space of devices (one for port I/O, one for MMIO).
#[derive(Clone, Default)]
pub struct Bus {
    ranges: BTreeMap<u64, Entry>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.ranges.iter().map(|(b, e)| (*b, e.len)))
            .finish()
    }
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Map `device` at `[base, base + len)`.
    pub fn insert(&mut self, device: SharedDevice, base: u64, len: u64) -> Result<(), BusError> {
        if len == 0 {
            return Err(BusError::ZeroLength(base));
        }
        let end = base
            .checked_add(len)
            .ok_or(BusError::Overlap { base, len })?;
        if let Some((b, e)) = self.ranges.range(..end).next_back()
            && b.saturating_add(e.len) > base
        {
            return Err(BusError::Overlap { base, len });
        }
        self.ranges.insert(base, Entry { len, device });
        Ok(())
    }

    /// The device covering `addr` and the offset of `addr` within it.
    pub fn resolve(&self, addr: u64) -> Option<(SharedDevice, u64)> {
        let (base, entry) = self.ranges.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset < entry.len).then(|| (entry.device.clone(), offset))
    }

    /// Dispatch a read; returns false when no device covers `addr` (data is then left as is).
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr) {
            Some((dev, offset)) => {
                // A poisoned lock means a device thread panicked; keep serving the guest with
                // the device's last state rather than propagating the panic into the vCPU.
                let mut dev = dev.locked();
                dev.read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Dispatch a write; returns false when no device covers `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr) {
            Some((dev, offset)) => {
                let mut dev = dev.locked();
                dev.write(offset, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Reg(u8);
    impl BusDevice for Reg {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(self.0.wrapping_add(offset as u8));
        }
        fn write(&mut self, _offset: u64, data: &[u8]) {
            self.0 = data[0];
        }
    }

    #[test]
    fn dispatches_by_range_and_offset() {
        let mut bus = Bus::new();
        bus.insert(Arc::new(Mutex::new(Reg(10))), 0x100, 0x10)
            .unwrap();
        let mut b = [0u8; 1];
        assert!(bus.read(0x104, &mut b));
        assert_eq!(b[0], 14);
        assert!(!bus.read(0x110, &mut b));
        assert!(bus.write(0x100, &[7]));
        assert!(bus.read(0x100, &mut b));
        assert_eq!(b[0], 7);
    }

    #[test]
    fn refuses_overlap_and_zero_length() {
        let mut bus = Bus::new();
        bus.insert(Arc::new(Mutex::new(Reg(0))), 0x100, 0x10)
            .unwrap();
        let e = bus.insert(Arc::new(Mutex::new(Reg(0))), 0x10f, 0x10);
        assert_eq!(
            e,
            Err(BusError::Overlap {
                base: 0x10f,
                len: 0x10
            })
        );
        let e = bus.insert(Arc::new(Mutex::new(Reg(0))), 0xf8, 0x10);
        assert!(e.is_err());
        assert_eq!(
            bus.insert(Arc::new(Mutex::new(Reg(0))), 0x200, 0),
            Err(BusError::ZeroLength(0x200))
        );
        bus.insert(Arc::new(Mutex::new(Reg(0))), 0x110, 0x10)
            .unwrap();
    }
}
