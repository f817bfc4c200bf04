//! Property tests of the virtqueue walker (`vmm::virtio::queue`) over real guest memory: any
//! descriptor table, available ring and indirect tables a guest can write (laid out with the
//! test-utils fixture's memory and flags) are popped and completed the way a device worker
//! does, and the walker never panics, never pops more chains than the ring offers, and never
//! hands a device a chain longer than `MAX_CHAIN_LEN` or a buffer outside guest RAM.

use proptest::prelude::*;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm::virtio::queue::{ChainError, queue_usable};
use vmm::virtio::test_utils::walk::walk_all;
use vmm::virtio::test_utils::{DATA_BASE, F_NEXT, F_WRITE, MEM_SIZE, guest_memory};

const F_INDIRECT: u16 = 4;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x3000;
const USED: u64 = 0x5000;
/// Where the indirect tables live (descriptors may point here with F_INDIRECT).
const INDIRECT: u64 = 0x8000;

/// One descriptor as the guest writes it.
#[derive(Debug, Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

impl Desc {
    fn bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

fn desc() -> impl Strategy<Value = Desc> {
    let mem = MEM_SIZE as u64;
    let addr = prop_oneof![
        4 => (0u64..0x10000).prop_map(|o| DATA_BASE + o),
        2 => (0u64..64).prop_map(|i| INDIRECT + 16 * i),
        1 => (0u64..0x2000).prop_map(move |o| mem - 0x1000 + o),
        1 => any::<u64>(),
    ];
    let len = prop_oneof![4 => 0u32..0x2000, 1 => any::<u32>()];
    let flags = prop_oneof![6 => 0u16..8, 1 => any::<u16>()];
    let next = prop_oneof![4 => 0u16..16, 2 => 0u16..256, 1 => any::<u16>()];
    (addr, len, flags, next).prop_map(|(addr, len, flags, next)| Desc {
        addr,
        len,
        flags,
        next,
    })
}

/// The guest's side of one queue.
#[derive(Debug, Clone)]
struct GuestQueue {
    size_log2: u32,
    event_idx: bool,
    table: Vec<Desc>,
    indirect: Vec<Desc>,
    heads: Vec<u16>,
    avail_idx: u16,
}

fn guest_queue() -> impl Strategy<Value = GuestQueue> {
    (
        0u32..=8,
        any::<bool>(),
        proptest::collection::vec(desc(), 0..=256),
        proptest::collection::vec(desc(), 0..64),
        proptest::collection::vec(prop_oneof![4 => 0u16..16, 1 => any::<u16>()], 0..=256),
        prop_oneof![3 => Just(None), 1 => any::<u16>().prop_map(Some)],
    )
        .prop_map(|(size_log2, event_idx, table, indirect, heads, idx)| {
            let avail_idx = idx.unwrap_or(heads.len() as u16);
            GuestQueue {
                size_log2,
                event_idx,
                table,
                indirect,
                heads,
                avail_idx,
            }
        })
}

fn write_desc_run(mem: &vmm::virtio::GuestMemoryMmap, at: u64, descs: &[Desc]) {
    for (i, d) in descs.iter().enumerate() {
        mem.write_slice(&d.bytes(), GuestAddress(at + 16 * i as u64))
            .unwrap();
    }
}

/// Walks the queue as a device worker does; each popped chain's buffer count or error.
fn run(g: &GuestQueue) -> Vec<Result<usize, ChainError>> {
    let mem = guest_memory();
    let size: u16 = 1 << g.size_log2;
    write_desc_run(&mem, DESC, &g.table[..g.table.len().min(usize::from(size))]);
    write_desc_run(&mem, INDIRECT, &g.indirect);
    // Available ring: flags, idx, ring[size], used_event.
    mem.write_obj(0u16, GuestAddress(AVAIL)).unwrap();
    mem.write_obj(g.avail_idx, GuestAddress(AVAIL + 2)).unwrap();
    for (i, h) in g.heads.iter().take(usize::from(size)).enumerate() {
        mem.write_obj(*h, GuestAddress(AVAIL + 4 + 2 * i as u64))
            .unwrap();
    }

    let mut q = Queue::new(256).unwrap();
    q.set_size(size);
    q.set_desc_table_address(Some(DESC as u32), Some(0));
    q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
    q.set_used_ring_address(Some(USED as u32), Some(0));
    q.set_event_idx(g.event_idx);
    q.set_ready(true);
    assert!(queue_usable(&q, size, &mem), "a well-placed queue refused");

    walk_all(&mut q, &mem)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_guest_queue_is_walked_within_bounds(g in guest_queue()) {
        run(&g);
    }
}

/// The shapes a random table rarely hits: a maximal chain (accepted whole), a loop and a
/// chain running off the table (malformed), an out-of-RAM buffer (refused), each on its own.
#[test]
fn loops_and_maximal_chains_are_classified_exactly() {
    let chain = |n: u16, last_next: Option<u16>| -> Vec<Desc> {
        (0..n)
            .map(|i| Desc {
                addr: DATA_BASE + 0x100 * u64::from(i),
                len: 16,
                flags: if i + 1 < n || last_next.is_some() {
                    F_NEXT
                } else {
                    F_WRITE
                },
                next: if i + 1 < n {
                    i + 1
                } else {
                    last_next.unwrap_or(0)
                },
            })
            .collect()
    };
    let with_indirect = |table: Vec<Desc>, indirect: Vec<Desc>| {
        run(&GuestQueue {
            size_log2: 8,
            event_idx: false,
            table,
            indirect,
            heads: vec![0],
            avail_idx: 1,
        })
    };
    let one = |table: Vec<Desc>| with_indirect(table, Vec::new());
    assert_eq!(one(chain(256, None)), [Ok(256)]);
    assert_eq!(one(chain(4, Some(0))), [Err(ChainError::Malformed)]);
    assert_eq!(one(chain(4, Some(300))), [Err(ChainError::Malformed)]);
    let mut outside = chain(2, None);
    outside[1].addr = MEM_SIZE as u64 - 8;
    assert_eq!(one(outside), [Err(ChainError::OutOfRange)]);
    let table = vec![Desc {
        addr: INDIRECT,
        len: 32,
        flags: F_INDIRECT,
        next: 0,
    }];
    assert_eq!(with_indirect(table, chain(2, None)), [Ok(2)]);
}
