//! Floods on the vsock device through the harness guest: 10^6 malformed TX chains and 10^6
//! bogus packets. The device keeps serving a host connection afterwards, and the process's
//! resident memory grows by at most 1 MiB across the floods (after a warm-up of each kind,
//! so allocator steady state is not counted).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vmm::virtio::test_utils::vsock_guest::VsockGuest;
use vmm::virtio::test_utils::{MEM_SIZE, Seg};
use vmm::virtio::vsock::packet::{HDR_SIZE, HOST_CID, Header, TYPE_STREAM};

const CID: u64 = 3;
const PORT: u32 = 1234;
const TXQ: usize = 1;
const FLOOD: u64 = 1_000_000;

/// VmRSS of this process in KiB.
fn rss_kib() -> u64 {
    vm_test_support::procfs::rss_kib(std::path::Path::new("/proc/self/status"))
}

/// xorshift64: deterministic "random" fields.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One malformed TX chain (each fails only its own request): a descriptor outside guest RAM,
/// one shorter than a header, a device-writable one on the TX queue, a header promising more
/// payload than the chain holds, or a header split over two descriptors outside RAM.
fn malformed(g: &mut VsockGuest, scratch: u64, rng: &mut Rng) {
    let kind = rng.next() % 5;
    let outside = MEM_SIZE as u64 + (rng.next() % (1 << 30));
    let segs: Vec<Seg> = match kind {
        0 => vec![Seg {
            addr: outside,
            len: HDR_SIZE as u32,
            write: false,
        }],
        1 => vec![Seg {
            addr: scratch,
            len: (rng.next() % HDR_SIZE as u64) as u32,
            write: false,
        }],
        2 => vec![Seg {
            addr: scratch,
            len: 256,
            write: true,
        }],
        3 => {
            let h = Header {
                src_cid: CID,
                dst_cid: HOST_CID,
                src_port: 40_000,
                dst_port: 5002,
                len: 60_000,
                kind: TYPE_STREAM,
                op: 5,
                ..Header::default()
            };
            g.d.write_mem(scratch, &h.to_bytes());
            vec![Seg {
                addr: scratch,
                len: HDR_SIZE as u32 + 8,
                write: false,
            }]
        }
        _ => vec![
            Seg {
                addr: scratch,
                len: 8,
                write: false,
            },
            Seg {
                addr: u64::MAX - 16,
                len: 64,
                write: false,
            },
        ],
    };
    wait_for_descs(g, segs.len());
    g.d.add_chain(TXQ, &segs);
    g.d.notify(TXQ as u32);
}

/// Pump until the TX queue has `n` free descriptors; the device must keep consuming.
fn wait_for_descs(g: &mut VsockGuest, n: usize) {
    let end = Instant::now() + Duration::from_secs(10);
    while g.d.free_descs(TXQ) < n {
        assert!(
            Instant::now() < end,
            "the device stopped consuming TX chains"
        );
        g.pump(Duration::from_millis(1));
    }
}

/// One bogus packet: every header field arbitrary (ops, types, CIDs, ports, lengths).
fn bogus(g: &mut VsockGuest, rng: &mut Rng) {
    let r = rng.next();
    let h = Header {
        src_cid: if r & 1 == 0 { CID } else { rng.next() },
        dst_cid: if r & 2 == 0 { HOST_CID } else { rng.next() },
        src_port: rng.next() as u32,
        dst_port: if r & 4 == 0 { PORT } else { rng.next() as u32 },
        len: (rng.next() % 64) as u32,
        kind: if r & 8 == 0 {
            TYPE_STREAM
        } else {
            rng.next() as u16
        },
        op: (rng.next() % 12) as u16,
        flags: rng.next() as u32,
        buf_alloc: rng.next() as u32,
        fwd_cnt: rng.next() as u32,
    };
    let payload = [0x5au8; 64];
    let n = (h.len as usize).min(payload.len());
    wait_for_descs(g, 1);
    while !g.send_raw(&h, &payload[..n]) {
        g.pump(Duration::from_millis(1));
    }
}

fn flood(g: &mut VsockGuest, scratch: u64, rng: &mut Rng, n: u64) {
    for i in 0..n {
        malformed(g, scratch, rng);
        bogus(g, rng);
        if i % 64 == 0 {
            g.pump(Duration::ZERO);
            // The harness's own record of RSTs is not the device's memory.
            g.resets.clear();
            g.conns.clear();
        }
    }
    g.pump(Duration::from_millis(10));
    g.resets.clear();
}

fn echo_through(uds: &std::path::Path, g: &mut VsockGuest) {
    let uds = uds.to_path_buf();
    let c = std::thread::spawn(move || {
        let s = UnixStream::connect(&uds).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        (&s).write_all(format!("CONNECT {PORT}\n").as_bytes())
            .unwrap();
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while (&s).read(&mut b).unwrap() == 1 && b[0] != b'\n' {
            line.push(b[0]);
        }
        assert!(
            line.starts_with(b"OK "),
            "{:?}",
            String::from_utf8_lossy(&line)
        );
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        (&s).write_all(&data).unwrap();
        let mut got = vec![0u8; data.len()];
        (&s).read_exact(&mut got).unwrap();
        got == data
    });
    let end = Instant::now() + Duration::from_secs(30);
    while !c.is_finished() {
        assert!(Instant::now() < end, "echo through the device timed out");
        g.pump(Duration::from_millis(5));
    }
    assert!(c.join().unwrap(), "echo corrupted after the flood");
}

#[test]
fn million_malformed_chains_and_bogus_packets_leave_it_serving_and_flat() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let mut g = VsockGuest::new(CID, &uds).unwrap();
    g.listen(PORT);
    g.echo = true;
    let scratch = g.d.alloc(4096);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Warm-up: every path once at volume, and one served connection.
    flood(&mut g, scratch, &mut rng, 20_000);
    echo_through(&uds, &mut g);
    let before = rss_kib();
    let t0 = Instant::now();
    flood(&mut g, scratch, &mut rng, FLOOD);
    let took = t0.elapsed();
    echo_through(&uds, &mut g);
    let after = rss_kib();
    eprintln!(
        "flood: {FLOOD} malformed chains + {FLOOD} bogus packets in {:.1} s; RSS {before} -> {after} KiB",
        took.as_secs_f64()
    );
    assert!(
        after <= before + 1024,
        "RSS grew by {} KiB during the flood",
        after.saturating_sub(before)
    );
}
