//! The driver's side of a split queue laid in guest memory for the vhost-user backends' tests,
//! where the queues are rust-vmm's `VringMutex`es configured as QEMU would configure them
//! (the mmio harness drives its queues through the transport registers instead).

use vhost_user_backend::{VringMutex, VringT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryAtomic};

use super::{F_NEXT, F_WRITE, Seg};
use crate::virtio::GuestMemoryMmap;

/// One split queue: descriptor table, available and used rings in guest memory.
#[derive(Debug)]
pub struct Ring {
    /// Descriptor table address.
    pub desc: u64,
    /// Available ring address.
    pub avail: u64,
    /// Used ring address.
    pub used: u64,
    /// Queue size.
    pub size: u16,
    posted: u16,
    next_desc: u16,
}

impl Ring {
    /// A queue of `size` entries at `base` (the table, then the rings at +0x800 and +0x1000:
    /// room for 128 entries).
    pub fn new(base: u64, size: u16) -> Ring {
        Ring {
            desc: base,
            avail: base + 0x800,
            used: base + 0x1000,
            size,
            posted: 0,
            next_desc: 0,
        }
    }

    /// Configures `v` as QEMU does (size, addresses, ready, enabled).
    pub fn configure(&self, v: &VringMutex<GuestMemoryAtomic<GuestMemoryMmap>>) {
        v.set_queue_size(self.size);
        v.set_queue_info(self.desc, self.avail, self.used).unwrap();
        v.set_queue_ready(true);
        v.set_enabled(true);
    }

    /// Posts one single-descriptor chain.
    pub fn post(&mut self, mem: &GuestMemoryMmap, addr: u64, len: u32, write: bool) {
        self.post_chain(mem, &[Seg { addr, len, write }]);
    }

    /// Posts one chain of `segs` (descriptors taken in order from the table), and returns its
    /// head index.
    pub fn post_chain(&mut self, mem: &GuestMemoryMmap, segs: &[Seg]) -> u16 {
        let head = self.next_desc % self.size;
        self.next_desc = self.next_desc.wrapping_add(segs.len() as u16);
        for (k, s) in segs.iter().enumerate() {
            let i = (head + k as u16) % self.size;
            let d = self.desc + 16 * u64::from(i);
            let mut flags = if s.write { F_WRITE } else { 0 };
            let next = (i + 1) % self.size;
            if k + 1 < segs.len() {
                flags |= F_NEXT;
            }
            mem.write_obj(s.addr, GuestAddress(d)).unwrap();
            mem.write_obj(s.len, GuestAddress(d + 8)).unwrap();
            mem.write_obj(flags, GuestAddress(d + 12)).unwrap();
            mem.write_obj(next, GuestAddress(d + 14)).unwrap();
        }
        let slot = self.avail + 4 + 2 * u64::from(self.posted % self.size);
        mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.posted = self.posted.wrapping_add(1);
        mem.write_obj(self.posted, GuestAddress(self.avail + 2))
            .unwrap();
        head
    }

    /// The used ring's index.
    pub fn used_idx(&self, mem: &GuestMemoryMmap) -> u16 {
        mem.read_obj(GuestAddress(self.used + 2)).unwrap()
    }

    /// The length the device wrote into used element `n`.
    pub fn used_len(&self, mem: &GuestMemoryMmap, n: u16) -> u32 {
        let at = self.used + 4 + 8 * u64::from(n % self.size) + 4;
        mem.read_obj(GuestAddress(at)).unwrap()
    }
}
