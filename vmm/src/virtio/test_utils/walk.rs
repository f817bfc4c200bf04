//! The reference walk of one queue, shared by the virtqueue fuzz target and property tests:
//! pop and complete every available chain the way a device worker does, asserting the walker's
//! guarantees on the way.

use vm_memory::{GuestMemory, Permissions};

use crate::virtio::GuestMemoryMmap;
use crate::virtio::queue::{
    ChainError, MAX_CHAIN_LEN, add_used, has_available, needs_notification, pop_chain, read_chain,
    readable_len, writable_len,
};

/// Pops and completes every chain of `q` (the guest's available index is fixed, so at most the
/// queue size); returns each chain's buffer count or error. Panics if `has_available` and
/// `pop_chain` disagree, if more chains than the queue size come out, or if a chain handed to a
/// device is empty, longer than [`MAX_CHAIN_LEN`] (or allocated past it), or has a buffer
/// outside guest RAM.
pub fn walk_all(
    q: &mut virtio_queue::Queue,
    mem: &GuestMemoryMmap,
) -> Vec<Result<usize, ChainError>> {
    use virtio_queue::QueueT;
    let size = usize::from(q.size());
    let mut seen = Vec::new();
    loop {
        let available = has_available(q, mem);
        let chain = pop_chain(q, mem);
        match (&available, &chain) {
            (Ok(true), Ok(Some(_))) | (Ok(false), Ok(None)) | (Err(_), Err(_)) => {}
            _ => panic!("has_available {available:?} but pop_chain {chain:?}"),
        }
        // An error here is DEVICE_NEEDS_RESET for the device: it stops using the queue.
        let Ok(Some(chain)) = chain else { break };
        assert!(seen.len() < size, "popped more than {size} chains");
        seen.push(chain.bufs.as_ref().map(Vec::len).map_err(|e| *e));
        let mut written = 0u32;
        if let Ok(bufs) = &chain.bufs {
            assert!(
                !bufs.is_empty() && bufs.len() <= MAX_CHAIN_LEN,
                "{} bufs",
                bufs.len()
            );
            assert!(
                bufs.capacity() <= MAX_CHAIN_LEN,
                "{} slots",
                bufs.capacity()
            );
            for b in bufs {
                assert!(
                    b.len == 0 || mem.check_range(b.addr, b.len as usize, Permissions::ReadWrite),
                    "accepted a buffer outside guest RAM: {b:?}"
                );
            }
            let mut scratch = vec![0u8; readable_len(bufs).min(4096) as usize];
            assert!(read_chain(mem, bufs, 0, &mut scratch) <= scratch.len());
            written = writable_len(bufs).min(u64::from(u32::MAX)) as u32;
        }
        if add_used(q, mem, chain.head, written).is_err() {
            break;
        }
        needs_notification(q, mem);
    }
    seen
}
