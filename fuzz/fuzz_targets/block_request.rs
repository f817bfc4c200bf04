//! Fuzz the virtio-blk request parser: header bytes plus an arbitrary descriptor-chain shape.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vm_memory::GuestAddress;
use vmm::virtio::block::request::{DiskInfo, HEADER_SIZE, Op, SECTOR_SIZE, parse_request};
use vmm::virtio::queue::Buf;

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_SIZE + 9 {
        return;
    }
    let (header, rest) = data.split_at(HEADER_SIZE);
    let capacity_sectors = u64::from_le_bytes(rest[..8].try_into().unwrap());
    let read_only = rest[8] & 1 == 1;
    // Each further 5 bytes describe one descriptor: u32 length, flags byte (bit 0 = writable).
    let bufs: Vec<Buf> = rest[9..]
        .chunks_exact(5)
        .take(256)
        .enumerate()
        .map(|(i, c)| Buf {
            addr: GuestAddress(i as u64 * 0x1_0000),
            len: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            write: c[4] & 1 == 1,
        })
        .collect();
    let disk = DiskInfo {
        capacity_sectors,
        read_only,
    };
    match parse_request(header, &bufs, disk) {
        Ok(req) => {
            let cap_bytes = capacity_sectors.saturating_mul(SECTOR_SIZE);
            match req.op {
                Op::Read { offset } => {
                    assert!(offset + req.data_len <= cap_bytes);
                    assert!(req.data.iter().all(|b| b.write));
                }
                Op::Write { offset } => {
                    assert!(!read_only, "write accepted on a read-only disk");
                    assert!(offset + req.data_len <= cap_bytes);
                    assert!(req.data.iter().all(|b| !b.write));
                }
                Op::Flush => assert!(req.data.is_empty()),
                Op::GetId => assert!(req.data.iter().all(|b| b.write)),
            }
            assert!(req.status.write && req.status.len >= 1);
        }
        Err(refused) => {
            if let Some(s) = refused.status_buf {
                assert!(s.write);
            }
        }
    }
});
