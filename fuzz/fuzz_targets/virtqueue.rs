//! Fuzz the virtqueue walker over real guest memory: the input is the guest's side of one queue
//! (descriptor table, available ring, indirect tables, all in guest RAM), and the device pops
//! and completes every chain the way a device worker does (`vmm::virtio::queue`).
//!
//! Input: byte 0 picks the queue size (1 << (b % 9): 1..=256), byte 1 bit 0 turns on
//! VIRTIO_F_RING_EVENT_IDX, the rest is written to guest memory from address 0. Guest RAM is two
//! 64 KiB regions with a hole between them, so chains can point into the hole and past the end.
//! Layout: descriptor table at 0x0, available ring at 0x1000, used ring at 0x2000.
#![no_main]

use libfuzzer_sys::fuzz_target;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm::virtio::queue::queue_usable;
use vmm::virtio::test_utils::walk::walk_all;

const REGION: usize = 0x1_0000;
const SECOND_REGION: u64 = 0x2_0000;
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;

fn set_addr(addr: u64, f: impl FnOnce(Option<u32>, Option<u32>)) {
    f(Some(addr as u32), Some((addr >> 32) as u32));
}

fuzz_target!(|data: &[u8]| {
    let Some((&size_byte, rest)) = data.split_first() else {
        return;
    };
    let Some((&flags, image)) = rest.split_first() else {
        return;
    };
    let size: u16 = 1 << (size_byte % 9);
    let mem: GuestMemoryMmap<()> = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), REGION),
        (GuestAddress(SECOND_REGION), REGION),
    ])
    .unwrap();
    let image = &image[..image.len().min(REGION)];
    mem.write_slice(image, GuestAddress(0)).unwrap();

    let mut q = Queue::new(256).unwrap();
    q.set_size(size);
    set_addr(DESC, |l, h| q.set_desc_table_address(l, h));
    set_addr(AVAIL, |l, h| q.set_avail_ring_address(l, h));
    set_addr(USED, |l, h| q.set_used_ring_address(l, h));
    q.set_event_idx(flags & 1 == 1);
    q.set_ready(true);
    assert!(
        queue_usable(&q, size, &mem),
        "a well-placed queue of size {size} refused"
    );

    // The available index is fixed in memory (the device never writes the descriptor table or
    // the available ring), so at most `size` chains can be popped before the queue is empty.
    walk_all(&mut q, &mem);
});
