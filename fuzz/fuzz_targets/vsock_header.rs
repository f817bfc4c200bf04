//! Fuzz the vsock TX header parser/validator and the hybrid-vsock CONNECT line parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vmm::virtio::vsock::packet::{HDR_SIZE, Header, MAX_PAYLOAD, op, parse_tx};
use vmm::virtio::vsock::unix::parse_connect_line;

fuzz_target!(|data: &[u8]| {
    let room = data.len().saturating_sub(HDR_SIZE) as u64;
    if let Ok(h) = parse_tx(data, 3, room) {
        // Accepted packets respect the bounds the device relies on.
        assert_eq!(h.src_cid, 3);
        if h.op == op::RW {
            assert!(h.len <= MAX_PAYLOAD && u64::from(h.len) <= room);
        } else {
            assert_eq!(h.len, 0);
        }
    }
    if let Some(h) = Header::parse(data) {
        assert_eq!(Header::parse(&h.to_bytes()), Some(h));
    }
    if let Some(p) = parse_connect_line(data) {
        assert!(data.starts_with(b"CONNECT "));
        assert!(std::str::from_utf8(data).unwrap().contains(&p.to_string()));
    }
});
