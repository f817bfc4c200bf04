//! Helpers over `virtio-queue`: pop a descriptor chain with every descriptor validated.
//!
//! `virtio-queue` bounds a chain's walk by the queue size (so a loop ends) and stops at a chain
//! longer than 4 GiB or at a descriptor it cannot read, but it reports all of those as a plain
//! end of chain. [`pop_chain`] notices them (the last descriptor still says NEXT) and also checks
//! that every buffer lies inside guest RAM, so devices only ever see well-formed chains.

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{GuestAddress, GuestMemory, Permissions};

use super::GuestMemoryMmap;

/// Most descriptors a chain may have (the largest queue any device here offers).
pub const MAX_CHAIN_LEN: usize = 256;

/// One buffer of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Guest address.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
    /// Device-writable.
    pub write: bool,
}

/// A popped chain: its head index and its buffers (or why it is malformed).
#[derive(Debug)]
pub struct Chain {
    /// Head descriptor index, to return in the used ring.
    pub head: u16,
    /// The buffers, or the reason the chain is unusable.
    pub bufs: Result<Vec<Buf>, ChainError>,
}

/// Why a chain is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// Loop, bad index, bad indirect table or total length over 4 GiB.
    #[error("malformed descriptor chain")]
    Malformed,
    /// A buffer outside guest RAM.
    #[error("descriptor buffer outside guest memory")]
    OutOfRange,
    /// An empty chain.
    #[error("empty descriptor chain")]
    Empty,
}

/// The queue itself is broken: the device must enter DEVICE_NEEDS_RESET.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// Avail index ahead of the device by more than the queue size, or unreadable ring.
    #[error("invalid available ring")]
    AvailRing,
    /// Writing the used ring failed (bad head index or ring outside memory).
    #[error("cannot add to used ring")]
    UsedRing,
}

/// Pop the next available chain, if any.
pub fn pop_chain(queue: &mut Queue, mem: &GuestMemoryMmap) -> Result<Option<Chain>, QueueError> {
    let mut iter = queue.iter(mem).map_err(|_| QueueError::AvailRing)?;
    let Some(chain) = iter.next() else {
        return Ok(None);
    };
    let head = chain.head_index();
    let mut bufs = Vec::new();
    let mut last_has_next = false;
    let mut err = None;
    for desc in chain {
        last_has_next = desc.has_next();
        if bufs.len() >= MAX_CHAIN_LEN {
            err = Some(ChainError::Malformed);
            break;
        }
        let len = desc.len();
        let ok = usize::try_from(len)
            .is_ok_and(|l| mem.check_range(desc.addr(), l, Permissions::ReadWrite));
        if !ok && len != 0 {
            err.get_or_insert(ChainError::OutOfRange);
        }
        bufs.push(Buf {
            addr: desc.addr(),
            len,
            write: desc.is_write_only(),
        });
    }
    let bufs = match err {
        Some(e) => Err(e),
        None if last_has_next => Err(ChainError::Malformed),
        None if bufs.is_empty() => Err(ChainError::Empty),
        None => Ok(bufs),
    };
    Ok(Some(Chain { head, bufs }))
}

/// Whether the queue has a chain available (without consuming it).
pub fn has_available(queue: &Queue, mem: &GuestMemoryMmap) -> Result<bool, QueueError> {
    let idx = queue
        .avail_idx(mem, std::sync::atomic::Ordering::Acquire)
        .map_err(|_| QueueError::AvailRing)?;
    let pending = idx.0.wrapping_sub(queue.next_avail());
    if pending > queue.size() {
        return Err(QueueError::AvailRing);
    }
    Ok(pending != 0)
}

/// Put a chain back so the next pop returns it again.
pub fn undo_pop(queue: &mut Queue) {
    queue.go_to_previous_position();
}

/// Return a chain to the driver with `len` bytes written.
pub fn add_used(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    head: u16,
    len: u32,
) -> Result<(), QueueError> {
    queue
        .add_used(mem, head, len)
        .map_err(|_| QueueError::UsedRing)
}

/// Whether the driver wants an interrupt for what was just added.
pub fn needs_notification(queue: &mut Queue, mem: &GuestMemoryMmap) -> bool {
    queue.needs_notification(mem).unwrap_or(true)
}

/// A copy of a queue's configuration (for handing it to the worker).
pub fn clone_queue(queue: &Queue) -> Result<Queue, virtio_queue::Error> {
    Queue::try_from(queue.state())
}

/// Validate a queue configured by the driver: ready, size a power of two within the maximum,
/// rings inside guest memory.
pub fn queue_usable(queue: &Queue, requested_size: u16, mem: &GuestMemoryMmap) -> bool {
    requested_size != 0
        && requested_size.is_power_of_two()
        && requested_size <= queue.max_size()
        && queue.size() == requested_size
        && queue.ready()
        && queue.is_valid(mem)
}

/// Total length of the device-writable buffers of a chain.
pub fn writable_len(bufs: &[Buf]) -> u64 {
    bufs.iter()
        .filter(|b| b.write)
        .map(|b| u64::from(b.len))
        .sum()
}

/// Total length of the device-readable buffers of a chain.
pub fn readable_len(bufs: &[Buf]) -> u64 {
    bufs.iter()
        .filter(|b| !b.write)
        .map(|b| u64::from(b.len))
        .sum()
}

/// Copy from the readable buffers of a chain, starting `skip` bytes in, into `out`; returns
/// the number of bytes copied.
pub fn read_chain(mem: &GuestMemoryMmap, bufs: &[Buf], skip: u64, out: &mut [u8]) -> usize {
    copy_chain(bufs, false, skip, out.len(), |addr, range| {
        vm_memory::Bytes::read_slice(mem, &mut out[range], addr).is_ok()
    })
}

/// Copy `data` into the writable buffers of a chain, starting `skip` bytes in; returns the
/// number of bytes copied.
pub fn write_chain(mem: &GuestMemoryMmap, bufs: &[Buf], skip: u64, data: &[u8]) -> usize {
    copy_chain(bufs, true, skip, data.len(), |addr, range| {
        vm_memory::Bytes::write_slice(mem, &data[range], addr).is_ok()
    })
}

fn copy_chain(
    bufs: &[Buf],
    write: bool,
    mut skip: u64,
    total: usize,
    mut f: impl FnMut(GuestAddress, std::ops::Range<usize>) -> bool,
) -> usize {
    let mut done = 0usize;
    for b in bufs.iter().filter(|b| b.write == write) {
        if done == total {
            break;
        }
        let len = u64::from(b.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let avail = (len - skip) as usize;
        let n = avail.min(total - done);
        let Some(addr) = b.addr.0.checked_add(skip) else {
            break;
        };
        if !f(GuestAddress(addr), done..done + n) {
            break;
        }
        done += n;
        skip = 0;
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_copies_skip_and_span_buffers() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let bufs = [
            Buf {
                addr: GuestAddress(0x100),
                len: 4,
                write: true,
            },
            Buf {
                addr: GuestAddress(0x200),
                len: 8,
                write: false,
            },
            Buf {
                addr: GuestAddress(0x300),
                len: 4,
                write: true,
            },
        ];
        assert_eq!(write_chain(&mem, &bufs, 2, b"abcdefgh"), 6);
        let mut out = [0u8; 8];
        vm_memory::Bytes::read_slice(&mem, &mut out[..4], GuestAddress(0x100)).unwrap();
        vm_memory::Bytes::read_slice(&mem, &mut out[4..], GuestAddress(0x300)).unwrap();
        assert_eq!(&out, b"\0\0abcdef");
        assert_eq!(writable_len(&bufs), 8);
        assert_eq!(readable_len(&bufs), 8);
        vm_memory::Bytes::write_slice(&mem, b"12345678", GuestAddress(0x200)).unwrap();
        let mut r = [0u8; 16];
        assert_eq!(read_chain(&mem, &bufs, 3, &mut r), 5);
        assert_eq!(&r[..5], b"45678");
    }
}
