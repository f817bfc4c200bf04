//! The vhost-user glue without a VMM: the backend's `handle_event` driven as the library's
//! event loop drives it, over real guest memory in `VringMutex` queues configured as QEMU
//! would, and a real hybrid-vsock socket with real host clients.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::virtio::test_utils::vring::Ring;
use crate::virtio::vsock::packet::{HDR_SIZE, HOST_CID, Header, TYPE_STREAM, op};

const CID: u64 = 3;
const RX_BUFS: u64 = 0x10000;
const TX_PKT: u64 = 0x30000;

struct Rig {
    backend: VsockBackend,
    mem: Gm,
    vrings: Vec<Vring>,
    rx: Ring,
    tx: Ring,
    uds: PathBuf,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let uds = dir.path().join("v.sock");
        let listener = crate::virtio::vsock::unix::bind(&uds).unwrap();
        let mut backend = VsockBackend::new(CID, listener, 8).unwrap();
        let mem = GuestMemoryAtomic::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x40000)]).unwrap(),
        );
        backend.update_memory(mem.clone()).unwrap();
        let vrings: Vec<Vring> = (0..NUM_QUEUES)
            .map(|_| Vring::new(mem.clone(), MAX_QUEUE_SIZE as u16).unwrap())
            .collect();
        let mut rx = Ring::new(0x1000, 16);
        let tx = Ring::new(0x4000, 16);
        let evq = Ring::new(0x7000, 4);
        rx.configure(&vrings[0]);
        tx.configure(&vrings[1]);
        evq.configure(&vrings[2]);
        let m = mem.memory();
        for i in 0..8 {
            rx.post(&m, RX_BUFS + 0x1000 * i, 4096, true);
        }
        drop(m);
        Rig {
            backend,
            mem,
            vrings,
            rx,
            tx,
            uds,
            _dir: dir,
        }
    }

    fn event(&mut self, ev: u16) {
        self.backend
            .handle_event(ev, EventSet::IN, &self.vrings, 0)
            .unwrap();
    }

    /// Runs the backend's epoll set until `done` or `limit` passes.
    fn pump_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Rig) -> bool) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            self.event(BACKEND_EVENT);
            if done(self) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Pumps until the device used `n` RX buffers (within 2 s).
    fn wait_rx(&mut self, n: u16) -> bool {
        self.pump_until(Duration::from_secs(2), |r| {
            let m = r.mem.memory();
            r.rx.used_idx(&m) >= n
        })
    }

    /// The header the device wrote into RX buffer `i`.
    fn rx_header(&self, i: u64) -> Header {
        let mut hb = [0u8; HDR_SIZE];
        self.mem
            .memory()
            .read_slice(&mut hb, GuestAddress(RX_BUFS + 0x1000 * i))
            .unwrap();
        Header::parse(&hb).unwrap()
    }

    /// The guest sends one packet on the TX queue and kicks it.
    fn guest_send(&mut self, hdr: Header) {
        let m = self.mem.memory();
        m.write_slice(&hdr.to_bytes(), GuestAddress(TX_PKT))
            .unwrap();
        self.tx.post(&m, TX_PKT, HDR_SIZE as u32, false);
        drop(m);
        self.event(1);
    }
}

fn reply(to: &Header, o: u16) -> Header {
    Header {
        src_cid: CID,
        dst_cid: HOST_CID,
        src_port: to.dst_port,
        dst_port: to.src_port,
        len: 0,
        kind: TYPE_STREAM,
        op: o,
        flags: 0,
        buf_alloc: 64 * 1024,
        fwd_cnt: 0,
    }
}

#[test]
fn fd_budget_keeps_connections_below_the_limit() {
    // The usual soft limit is raised to fit the full cap when the hard limit allows.
    assert_eq!(fd_budget(1024, 4096), Some((1087, 1023)));
    assert_eq!(fd_budget(4096, 4096), Some((4096, 1023)));
    // A tight hard limit shrinks the cap instead.
    assert_eq!(fd_budget(256, 512), Some((512, 448)));
    assert_eq!(fd_budget(64, 64), None);
    for (soft, hard) in [(1, 2), (100, 100), (1024, 1024), (2000, 1 << 20)] {
        if let Some((s, cap)) = fd_budget(soft, hard) {
            assert!(
                cap as u64 + OWN_FDS <= s && s <= hard.max(soft),
                "{soft}/{hard}"
            );
        }
    }
}

#[test]
fn config_features_and_cid() {
    let dir = tempfile::tempdir().unwrap();
    let l = crate::virtio::vsock::unix::bind(&dir.path().join("a.sock")).unwrap();
    let b = VsockBackend::new(7, l, 16).unwrap();
    assert_eq!(b.get_config(0, 8), 7u64.to_le_bytes().to_vec());
    assert_eq!(b.get_config(4, 8), vec![0; 8]);
    assert_eq!(b.get_config(0, u32::MAX).len(), MAX_CONFIG_READ);
    assert_ne!(b.features() & (1 << VIRTIO_F_VERSION_1), 0);
    assert!(
        b.protocol_features()
            .contains(VhostUserProtocolFeatures::CONFIG)
    );
    assert_eq!(b.muxer().max_connections(), 16);
    let l = crate::virtio::vsock::unix::bind(&dir.path().join("b.sock")).unwrap();
    assert!(matches!(
        VsockBackend::new(2, l, 16),
        Err(VhostUserError::Device(VirtioError::InvalidCid(2)))
    ));
}

/// Host `CONNECT 1024` → the guest gets a REQUEST in an RX buffer → its RESPONSE on TX → the
/// client reads `OK <host port>`; data both ways; a guest-initiated REQUEST gets RST.
#[test]
fn a_host_connect_reaches_the_guest_through_the_vrings() {
    let mut rig = Rig::new();
    let mut client = UnixStream::connect(&rig.uds).unwrap();
    client.write_all(b"CONNECT 1024\n").unwrap();
    let got = rig.wait_rx(1);
    assert!(got, "no REQUEST reached the RX queue");
    let req = rig.rx_header(0);
    assert_eq!(
        (req.op, req.dst_port, req.dst_cid),
        (op::REQUEST, 1024, CID)
    );
    rig.guest_send(reply(&req, op::RESPONSE));
    client
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut line = [0u8; 64];
    let n = client.read(&mut line).unwrap();
    assert_eq!(&line[..n], format!("OK {}\n", req.src_port).as_bytes());
    // Host data becomes an RW packet in the next RX buffer.
    client.write_all(b"ping").unwrap();
    let got = rig.wait_rx(2);
    assert!(got, "host data did not reach the guest");
    let rw = rig.rx_header(1);
    assert_eq!((rw.op, rw.len), (op::RW, 4));
    // A guest-initiated connection is refused.
    let mut guest_req = reply(&req, op::REQUEST);
    guest_req.dst_port = 5555;
    guest_req.src_port = 40000;
    rig.guest_send(guest_req);
    let m = rig.mem.memory();
    assert!(rig.rx.used_idx(&m) >= 3);
    drop(m);
    let rst = rig.rx_header(2);
    assert_eq!((rst.op, rst.dst_port, rst.src_port), (op::RST, 40000, 5555));
}

/// Whether the backend's epoll set (what the library's event loop waits on) is ready within
/// `ms` milliseconds.
fn epoll_ready(rig: &Rig, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd: rig.backend.epoll_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, ms) == 1 }
}

/// Once the last deadline has fired and been handled, the backend's epoll set is quiet: a
/// fired timerfd left readable made the event loop spin (40 % of a core on an idle VM, for
/// good, after its last host connection).
#[test]
fn the_timer_is_quiet_after_the_last_deadline() {
    let mut rig = Rig::new();
    let silent = UnixStream::connect(&rig.uds).unwrap();
    assert!(
        rig.pump_until(Duration::from_secs(1), |r| r.backend.muxer().connections()
            == 1)
    );
    assert!(
        epoll_ready(&rig, 5000),
        "the deadline never woke the epoll set"
    );
    assert!(
        rig.pump_until(Duration::from_secs(4), |r| r.backend.muxer().connections()
            == 0),
        "the silent client outlived its deadline"
    );
    assert!(
        !epoll_ready(&rig, 300),
        "the epoll set is still ready with no deadline left: the event loop would spin"
    );
    drop(silent);
}

/// Host clients that never finish `CONNECT` are closed after the 2 s deadline (not before),
/// and meanwhile a real client still connects: the timerfd wakes the backend on its own.
#[test]
fn silent_clients_are_dropped_at_the_deadline() {
    let mut rig = Rig::new();
    let start = Instant::now();
    let mut silent: Vec<UnixStream> = (0..5)
        .map(|_| UnixStream::connect(&rig.uds).unwrap())
        .collect();
    assert!(
        rig.pump_until(Duration::from_secs(1), |r| r.backend.muxer().connections()
            == 5)
    );
    // The deadline is armed in the timerfd: waiting on the backend's epoll set alone wakes
    // when it passes.
    assert!(epoll_ready(&rig, 5000), "the epoll set never became ready");
    assert!(
        rig.pump_until(Duration::from_secs(4), |r| r.backend.muxer().connections()
            == 0),
        "silent clients still held after {:?}",
        start.elapsed()
    );
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(1900),
        "dropped early: {waited:?}"
    );
    for s in &mut silent {
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        assert_eq!(s.read(&mut [0u8; 8]).unwrap(), 0, "not closed");
    }
    // The cap (8 here) holds: a flood of silent clients never holds more (and the newest,
    // which has not spoken yet, held one past it), each new one taking the oldest one's slot,
    // so a real client that comes after them still gets through.
    let flood: Vec<UnixStream> = (0..20)
        .map(|_| UnixStream::connect(&rig.uds).unwrap())
        .collect();
    rig.pump_until(Duration::from_millis(300), |_| false);
    assert_eq!(rig.backend.muxer().connections(), 8 + 1);
    let mut real = UnixStream::connect(&rig.uds).unwrap();
    real.write_all(b"CONNECT 1024\n").unwrap();
    let got = rig.wait_rx(1);
    assert!(got, "a real client was locked out by silent ones");
    assert_eq!(rig.rx_header(0).op, op::REQUEST);
    assert!(rig.backend.muxer().connections() <= 8 + 1);
    drop(flood);
}
