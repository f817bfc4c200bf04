//! The backend without QEMU: `handle_event` driven as the library's event loop drives it, over
//! real guest memory in `VringMutex` queues configured as QEMU would, serving a real tree.

use vm_memory::{Bytes, GuestAddress};
use vm_virtiofs::abi::{InHeader, opcode};

use super::*;
use crate::virtio::test_utils::Seg;
use crate::virtio::test_utils::vring::Ring;

const REQ: u64 = 0x10_0000;
const REPLY: u64 = 0x20_0000;
const MEM: usize = 8 << 20;

struct Rig {
    backend: FsBackend,
    mem: Gm,
    vrings: Vec<Vring>,
    hiprio: Ring,
    req: Ring,
    unique: u64,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("weights.bin"), vec![5u8; 3 << 20]).unwrap();
        let fs = Fs::open(dir.path(), Limits::default()).unwrap();
        let mut backend = FsBackend::new(fs);
        let mem = GuestMemoryAtomic::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap(),
        );
        backend.update_memory(mem.clone()).unwrap();
        let vrings: Vec<Vring> = (0..NUM_QUEUES)
            .map(|_| Vring::new(mem.clone(), MAX_QUEUE_SIZE as u16).unwrap())
            .collect();
        let hiprio = Ring::new(0x1000, 16);
        let req = Ring::new(0x4000, 16);
        hiprio.configure(&vrings[0]);
        req.configure(&vrings[1]);
        Rig {
            backend,
            mem,
            vrings,
            hiprio,
            req,
            unique: 0,
            _dir: dir,
        }
    }

    /// Sends `body` as opcode `op` on queue `q` with `reply` writable buffers of `len` bytes
    /// each; returns the used length and the reply's bytes.
    fn call(&mut self, q: u16, op: u32, nodeid: u64, body: &[u8], reply: &[u32]) -> (u32, Vec<u8>) {
        self.unique += 1;
        let bytes = InHeader {
            opcode: op,
            unique: self.unique,
            nodeid,
            ..InHeader::default()
        }
        .request(body);
        let m = self.mem.memory();
        m.write_slice(&bytes, GuestAddress(REQ)).unwrap();
        let mut segs = vec![Seg::readable(REQ, bytes.len() as u32)];
        let mut at = REPLY;
        for &len in reply {
            segs.push(Seg::writable(at, len));
            at += u64::from(len);
        }
        let ring = if q == 0 {
            &mut self.hiprio
        } else {
            &mut self.req
        };
        let before = ring.used_idx(&m);
        ring.post_chain(&m, &segs);
        drop(m);
        self.backend
            .handle_event(q, EventSet::IN, &self.vrings, 0)
            .unwrap();
        let m = self.mem.memory();
        let ring = if q == 0 { &self.hiprio } else { &self.req };
        assert_eq!(ring.used_idx(&m), before.wrapping_add(1), "one chain used");
        let len = ring.used_len(&m, before);
        let mut out = vec![0u8; len as usize];
        m.read_slice(&mut out, GuestAddress(REPLY)).unwrap();
        (len, out)
    }

    fn errno(reply: &[u8]) -> i32 {
        -i32::from_le_bytes(reply[4..8].try_into().unwrap())
    }
}

fn init_body() -> Vec<u8> {
    let mut b = Vec::new();
    for v in [7u32, 41, 128 << 10, 0x0040_0000 | 1] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.resize(64, 0);
    b
}

fn read_body(fh: u64, offset: u64, size: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&fh.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b.resize(40, 0);
    b
}

#[test]
fn a_file_is_read_through_the_request_queue() {
    let mut r = Rig::new();
    let (len, reply) = r.call(1, opcode::INIT, 0, &init_body(), &[4096]);
    assert_eq!((len, Rig::errno(&reply)), (80, 0));
    let (_, reply) = r.call(1, opcode::LOOKUP, 1, b"weights.bin\0", &[4096]);
    assert_eq!(Rig::errno(&reply), 0);
    let node = u64::from_le_bytes(reply[16..24].try_into().unwrap());
    let (_, reply) = r.call(1, opcode::OPEN, node, &[0u8; 8], &[4096]);
    let fh = u64::from_le_bytes(reply[16..24].try_into().unwrap());
    // A 1 MiB READ into a header buffer and 8 data buffers of 128 KiB.
    let mut bufs = vec![16u32];
    bufs.extend([128 << 10; 8]);
    let (len, reply) = r.call(1, opcode::READ, node, &read_body(fh, 0, 1 << 20), &bufs);
    assert_eq!(len, 16 + (1 << 20));
    assert!(reply[16..].iter().all(|&b| b == 5));
    // A READ asking for more than its buffers hold gets what fits.
    let (len, _) = r.call(1, opcode::READ, node, &read_body(fh, 0, 1 << 20), &[4096]);
    assert_eq!(len, 4096);
    // FORGET on the high-priority queue: used, nothing written.
    let (len, _) = r.call(0, opcode::FORGET, node, &1u64.to_le_bytes(), &[]);
    assert_eq!(len, 0);
    // Write-like opcodes are refused by the server behind the transport.
    let (_, reply) = r.call(1, opcode::WRITE, node, &[0u8; 4096], &[4096]);
    assert_eq!(Rig::errno(&reply), libc::EROFS);
    assert_eq!(r.backend.counters().malformed, 0);
    assert_eq!(r.backend.counters().errors, 1);
}

#[test]
fn malformed_chains_are_counted_and_a_broken_queue_is_left_until_a_reset() {
    let mut r = Rig::new();
    r.call(1, opcode::INIT, 0, &init_body(), &[4096]);
    // A buffer outside guest memory: used with length 0, counted, the queue still served.
    let m = r.mem.memory();
    r.req.post_chain(
        &m,
        &[Seg::readable(MEM as u64 - 8, 64), Seg::writable(REPLY, 64)],
    );
    drop(m);
    r.backend
        .handle_event(1, EventSet::IN, &r.vrings, 0)
        .unwrap();
    assert_eq!(r.backend.counters().malformed, 1);
    let (_, reply) = r.call(1, opcode::STATFS, 1, &[], &[4096]);
    assert_eq!(Rig::errno(&reply), 0);
    // An available index far ahead of the device: nothing more is served.
    let m = r.mem.memory();
    m.write_obj(0x7fffu16, GuestAddress(r.req.avail + 2))
        .unwrap();
    drop(m);
    r.backend
        .handle_event(1, EventSet::IN, &r.vrings, 0)
        .unwrap();
    assert!(r.backend.broken);
    r.backend.reset_device();
    assert!(!r.backend.broken);
}

#[test]
fn no_queue_is_served_before_qemu_enables_it_or_shares_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = FsBackend::new(Fs::open(dir.path(), Limits::default()).unwrap());
    let mem =
        GuestMemoryAtomic::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap());
    let vrings: Vec<Vring> = (0..NUM_QUEUES)
        .map(|_| Vring::new(mem.clone(), MAX_QUEUE_SIZE as u16).unwrap())
        .collect();
    let mut ring = Ring::new(0x4000, 16);
    ring.post(&mem.memory(), REQ, 64, false);
    // No memory table from QEMU yet, then a queue that is not enabled.
    b.handle_event(1, EventSet::IN, &vrings, 0).unwrap();
    b.update_memory(mem.clone()).unwrap();
    b.handle_event(1, EventSet::IN, &vrings, 0).unwrap();
    assert_eq!(ring.used_idx(&mem.memory()), 0);
    assert_eq!(
        b.features() & (1 << VIRTIO_F_VERSION_1),
        1 << VIRTIO_F_VERSION_1
    );
    assert_eq!(b.num_queues(), 2);
}
