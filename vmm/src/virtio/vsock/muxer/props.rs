//! Property tests of the muxer state machine: arbitrary sequences of guest TX packets (header
//! fields anywhere from valid to garbage, in guest memory, through the same `tx_chain` a
//! device worker uses) interleaved with host clients connecting, writing, closing, timers and
//! transport resets never panic and never grow any of the muxer's tables past its bound.

use std::io::Write;
use std::os::unix::net::UnixStream;

use proptest::prelude::*;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::epoll::Epoll;

use super::*;
use crate::virtio::GuestMemoryMmap;
use crate::virtio::vsock::connection::BUF_ALLOC;
use crate::virtio::vsock::packet::{HOST_CID, TYPE_STREAM};
use crate::virtio::worker::Interrupt;

const GUEST_CID: u64 = 3;
const PKT_ADDR: u64 = 0x1000;
/// The RX queue's rings and buffers (one descriptor per buffer, at `RX_BUFS + 0x1000 * index`).
const RX_SIZE: u16 = 16;
const RX_DESC: u64 = 0x4000;
const RX_AVAIL: u64 = 0x5000;
pub(super) const RX_USED: u64 = 0x6000;
pub(super) const RX_BUFS: u64 = 0x10000;

/// The guest's side of the RX queue: what it posted, and how much the device used.
#[derive(Default)]
struct RxRing {
    posted: u16,
    seen_used: u16,
    lens: [u32; RX_SIZE as usize],
}

impl RxRing {
    /// Posts up to `n` buffers of `len` bytes (as the ring has room) and checks every newly
    /// used one: a known head, written no further than its buffer.
    fn post(&mut self, mem: &GuestMemoryMmap, n: u16, len: u32) {
        let used: u16 = mem.read_obj(GuestAddress(RX_USED + 2)).unwrap();
        while self.seen_used != used {
            let at = RX_USED + 4 + 8 * u64::from(self.seen_used % RX_SIZE);
            let id: u32 = mem.read_obj(GuestAddress(at)).unwrap();
            let written: u32 = mem.read_obj(GuestAddress(at + 4)).unwrap();
            assert!(id < u32::from(RX_SIZE), "used id {id}");
            assert!(
                written <= self.lens[id as usize],
                "wrote {written} into {}",
                self.lens[id as usize]
            );
            self.seen_used = self.seen_used.wrapping_add(1);
        }
        let room = RX_SIZE - self.posted.wrapping_sub(used);
        for _ in 0..n.min(room) {
            let i = self.posted % RX_SIZE;
            let d = RX_DESC + 16 * u64::from(i);
            mem.write_obj(RX_BUFS + 0x1000 * u64::from(i), GuestAddress(d))
                .unwrap();
            mem.write_obj(len, GuestAddress(d + 8)).unwrap();
            mem.write_obj(2u16, GuestAddress(d + 12)).unwrap(); // VRING_DESC_F_WRITE
            mem.write_obj(0u16, GuestAddress(d + 14)).unwrap();
            self.lens[i as usize] = len;
            let slot = RX_AVAIL + 4 + 2 * u64::from(i);
            mem.write_obj(i, GuestAddress(slot)).unwrap();
            self.posted = self.posted.wrapping_add(1);
        }
        mem.write_obj(self.posted, GuestAddress(RX_AVAIL + 2))
            .unwrap();
    }
}

#[derive(Debug, Clone)]
pub(super) enum Op {
    /// A TX packet from the guest.
    Guest(Header, Vec<u8>),
    /// A host client connects and sends these bytes (a `CONNECT` line or garbage).
    HostConnect(Vec<u8>),
    /// A host client connects, the device accepts it, and only then do these bytes reach its
    /// socket, its readiness event not handled yet (a loaded host).
    HostConnectLate(Vec<u8>),
    /// Host client `i` (modulo the live ones) writes `n` bytes.
    HostWrite(usize, usize),
    /// Host client `i` hangs up.
    HostClose(usize),
    /// Timers fire (as if their deadlines passed).
    Expire,
    /// The driver resets the transport.
    Reset,
    /// The guest posts `n` RX buffers of `len` bytes each (as many as the ring has room for)
    /// and notifies the RX queue.
    GuestRx(u16, u32),
}

fn port() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => (0u32..4).prop_map(|i| FIRST_HOST_PORT + i),
        2 => prop_oneof![Just(1024u32), Just(1025), Just(5555)],
        1 => any::<u32>(),
    ]
}

fn header() -> impl Strategy<Value = (Header, Vec<u8>)> {
    let cids = (
        prop_oneof![4 => Just(GUEST_CID), 1 => any::<u64>()],
        prop_oneof![4 => Just(HOST_CID), 1 => any::<u64>()],
    );
    let fields = (
        port(),
        port(),
        prop_oneof![8 => 1u16..=7, 1 => any::<u16>()],
        prop_oneof![4 => Just(TYPE_STREAM), 1 => any::<u16>()],
        any::<u32>(),
        prop_oneof![Just(BUF_ALLOC), any::<u32>()],
        any::<u32>(),
    );
    (cids, fields, proptest::collection::vec(any::<u8>(), 0..256)).prop_map(
        |((src_cid, dst_cid), (dst_port, src_port, op, kind, flags, buf_alloc, fwd_cnt), p)| {
            let hdr = Header {
                src_cid,
                dst_cid,
                src_port,
                dst_port,
                len: p.len() as u32,
                kind,
                op,
                flags,
                buf_alloc,
                fwd_cnt,
            };
            (hdr, p)
        },
    )
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let connect_line = prop_oneof![
        3 => prop_oneof![Just(1024u32), Just(5555), any::<u32>()]
            .prop_map(|p| format!("CONNECT {p}\n").into_bytes()),
        // A client that sends its first bytes with its line (eager).
        1 => Just(b"CONNECT 1024\nhello".to_vec()),
        1 => proptest::collection::vec(any::<u8>(), 0..80),
    ];
    prop_oneof![
        8 => header().prop_map(|(h, p)| Op::Guest(h, p)),
        3 => connect_line.clone().prop_map(Op::HostConnect),
        1 => connect_line.prop_map(Op::HostConnectLate),
        2 => (any::<usize>(), 0usize..100_000).prop_map(|(i, n)| Op::HostWrite(i, n)),
        1 => any::<usize>().prop_map(Op::HostClose),
        1 => Just(Op::Expire),
        1 => Just(Op::Reset),
        3 => (1u16..8, prop_oneof![0u32..64, 44u32..300, Just(4096u32)])
            .prop_map(|(n, len)| Op::GuestRx(n, len)),
    ]
}

/// Every table stays within its bound and the bookkeeping agrees with itself.
fn assert_bounded(m: &Muxer) {
    let held = usize::from(m.deferred_live().is_some());
    assert!(m.count() <= m.max_conns + held, "{} connections", m.count());
    assert!(m.max_conns <= MAX_CONNECTIONS);
    assert_eq!(m.slots.len(), m.conns.len() + m.pending, "slots vs conns");
    assert!(
        m.rsts.len() <= MAX_QUEUED_RST,
        "{} queued RSTs",
        m.rsts.len()
    );
    assert!(m.timers.len() <= Timers::CAP + MAX_CONNECTIONS, "timers");
    assert_eq!(
        m.scratch.len(),
        MAX_PAYLOAD as usize,
        "scratch buffer resized"
    );
    let queued = m.conns.values().filter(|c| c.queued).count();
    assert_eq!(
        m.rx_ready.len() + m.rx_quiet.len() + m.rx_eager.len() + m.rx_new.len(),
        queued,
        "rx queues vs queued flags"
    );
    let traffic = m.rx_ready.iter().chain(&m.rx_quiet);
    for key in traffic.chain(&m.rx_eager).chain(&m.rx_new) {
        assert!(
            m.conns.get(key).is_some_and(|c| c.queued),
            "dead key {key:?} queued"
        );
    }
    let new = m.rx_new.iter().map(|k| (k, false));
    for (key, eager) in new.chain(m.rx_eager.iter().map(|k| (k, true))) {
        let c = &m.conns[key];
        assert!(
            c.send_request && c.eager == eager,
            "{key:?} in the wrong queue of new connections"
        );
    }
    assert!(m.silent.len() <= m.conns.len(), "silent entries");
    for (token, key) in &m.silent {
        assert!(
            m.conns
                .get(key)
                .is_some_and(|c| c.token == *token && c.state == State::Established),
            "silent entry {key:?} is not an established connection"
        );
    }
    for (token, key) in &m.waiting {
        assert!(
            m.conns.get(key).is_some_and(|c| c.token == *token
                && c.state == State::Connecting
                && !c.send_request
                && !c.eager),
            "waiting entry {key:?} is not a silent client's unanswered connection"
        );
    }
    for c in m.conns.values() {
        assert!(
            c.buffered() <= BUF_ALLOC as usize,
            "{} bytes buffered",
            c.buffered()
        );
    }
}

/// What a run leaves: the muxer, the live host clients, the directory of its socket.
pub(super) struct Ran {
    pub(super) m: Muxer,
    pub(super) mem: GuestMemoryMmap,
    pub(super) clients: Vec<UnixStream>,
    _dir: tempfile::TempDir,
}

/// Runs `ops` against a fresh muxer, checking the bounds after every step.
fn run(ops: Vec<Op>) -> Ran {
    run_capped(MAX_CONNECTIONS, ops)
}

/// [`run`] with the connection cap at `cap`.
pub(super) fn run_capped(cap: usize, ops: Vec<Op>) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut m = Muxer::new(GUEST_CID, listener).with_max_connections(cap);
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x40000)]).unwrap();
    let mut queues = [
        Queue::new(256).unwrap(),
        Queue::new(256).unwrap(),
        Queue::new(256).unwrap(),
    ];
    let rx = &mut queues[RXQ];
    rx.set_size(RX_SIZE);
    rx.set_desc_table_address(Some(RX_DESC as u32), Some(0));
    rx.set_avail_ring_address(Some(RX_AVAIL as u32), Some(0));
    rx.set_used_ring_address(Some(RX_USED as u32), Some(0));
    rx.set_ready(true);
    // An event queue with nothing posted: a transport reset's event waits for a buffer.
    let evq = &mut queues[EVQ];
    evq.set_size(4);
    evq.set_desc_table_address(Some(0x7000), Some(0));
    evq.set_avail_ring_address(Some(0x7800), Some(0));
    evq.set_used_ring_address(Some(0x8000), Some(0));
    evq.set_ready(true);
    let mut ring = RxRing::default();
    let irq = Interrupt::new().unwrap();
    let epoll = Epoll::new().unwrap();
    let metrics = crate::metrics::DeviceMetrics::new("virtio-vsock");
    let mut ctx = Ctx {
        mem: &mem,
        queues: &mut queues,
        irq: &irq,
        epoll: &epoll,
        metrics: &metrics,
    };
    m.start(&mut ctx);
    let mut clients: Vec<UnixStream> = Vec::new();
    let all_events = EventSet::IN | EventSet::OUT | EventSet::HANG_UP;
    for op in ops {
        match op {
            Op::Guest(hdr, payload) => {
                let mut bytes = hdr.to_bytes().to_vec();
                bytes.extend_from_slice(&payload);
                mem.write_slice(&bytes, GuestAddress(PKT_ADDR)).unwrap();
                let buf = Buf {
                    addr: GuestAddress(PKT_ADDR),
                    len: bytes.len() as u32,
                    write: false,
                };
                m.tx_chain(&[buf], &ctx);
            }
            Op::HostConnect(line) => {
                if let Ok(mut s) = UnixStream::connect(&path) {
                    let _ = s.set_nonblocking(true);
                    let _ = s.write_all(&line);
                    clients.push(s);
                }
                m.accept_all(&ctx);
                let pending: Vec<u64> = m
                    .slots
                    .iter()
                    .filter(|(_, s)| matches!(s, Slot::Pending(_)))
                    .map(|(t, _)| *t)
                    .collect();
                for t in pending {
                    m.pending_event(t, &ctx);
                }
            }
            Op::HostConnectLate(line) => {
                if let Ok(mut s) = UnixStream::connect(&path) {
                    let _ = s.set_nonblocking(true);
                    m.accept_all(&ctx);
                    let _ = s.write_all(&line);
                    clients.push(s);
                }
            }
            Op::HostWrite(i, n) if !clients.is_empty() => {
                let i = i % clients.len();
                let _ = clients[i].write(&vec![0x5a; n]);
                let keys: Vec<ConnKey> = m.conns.keys().copied().collect();
                for k in keys {
                    m.conn_event(k, all_events, &ctx);
                }
            }
            Op::HostClose(i) if !clients.is_empty() => {
                drop(clients.swap_remove(i % clients.len()));
                let keys: Vec<ConnKey> = m.conns.keys().copied().collect();
                for k in keys {
                    m.conn_event(k, all_events, &ctx);
                }
            }
            Op::HostWrite(..) | Op::HostClose(_) => {}
            Op::Expire => m.expire_timers(),
            Op::Reset => m.request(&mut ctx),
            Op::GuestRx(n, len) => {
                ring.post(&mem, n, len);
                m.queue_notify(RXQ, &mut ctx);
                assert!(!irq.needs_reset(), "the RX queue was declared broken");
            }
        }
        assert_bounded(&m);
    }
    Ran {
        m,
        mem,
        clients,
        _dir: dir,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_guest_and_host_input_keeps_the_muxer_bounded(
        ops in proptest::collection::vec(op_strategy(), 1..120)
    ) {
        run(ops);
    }
}

/// More guest REQUESTs than RSTs can be queued (the guest posts no RX buffers): the queue of
/// replies stops at its bound and every refusal is still counted.
#[test]
fn a_request_flood_stays_within_the_rst_bound() {
    let before = guest_connects_refused();
    let flood: Vec<Op> = (0..MAX_QUEUED_RST as u32 + 500)
        .map(|i| {
            let hdr = Header {
                src_cid: GUEST_CID,
                dst_cid: HOST_CID,
                src_port: 2000 + i,
                dst_port: 9999,
                len: 0,
                kind: TYPE_STREAM,
                op: op::REQUEST,
                flags: 0,
                buf_alloc: BUF_ALLOC,
                fwd_cnt: 0,
            };
            Op::Guest(hdr, Vec::new())
        })
        .collect();
    let ran = run(flood);
    assert_eq!(ran.m.rsts.len(), MAX_QUEUED_RST);
    assert!(guest_connects_refused() - before >= MAX_QUEUED_RST as u64 + 500);
}

pub(super) fn guest(src_port: u32, dst_port: u32, o: u16, payload: &[u8]) -> Op {
    let hdr = Header {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        len: payload.len() as u32,
        kind: TYPE_STREAM,
        op: o,
        flags: 0,
        buf_alloc: BUF_ALLOC,
        fwd_cnt: 0,
    };
    Op::Guest(hdr, payload.to_vec())
}

/// The states the random runs wander through, scripted once with exact outcomes: a host
/// client's `CONNECT`, the guest's `RESPONSE` (the client reads `OK <host port>`), guest data reaching the
/// client, a guest `RST` removing the connection without a reply, and data for a connection
/// that does not exist answered with one `RST`.
#[test]
fn a_scripted_connection_reaches_every_state() {
    use std::io::Read;
    let key = (FIRST_HOST_PORT, 1024);
    let ran = run(vec![Op::HostConnect(b"CONNECT 1024\n".to_vec())]);
    assert_eq!(
        ran.m.conns.get(&key).map(|c| c.state),
        Some(State::Connecting)
    );
    assert!(ran.m.conns[&key].send_request && ran.m.rx_new.contains(&key));
    // One RX buffer: the guest receives the REQUEST for port 1024 from the host port.
    let ran = run(vec![
        Op::HostConnect(b"CONNECT 1024\n".to_vec()),
        Op::GuestRx(1, 4096),
    ]);
    assert!(ran.m.rx_new.is_empty() && !ran.m.conns[&key].send_request);
    let mut hb = [0u8; HDR_SIZE];
    ran.mem.read_slice(&mut hb, GuestAddress(RX_BUFS)).unwrap();
    let h = Header::parse(&hb).unwrap();
    assert_eq!((h.op, h.src_port, h.dst_port), (op::REQUEST, key.0, key.1));

    let ops = vec![
        Op::HostConnect(b"CONNECT 1024\n".to_vec()),
        guest(1024, FIRST_HOST_PORT, op::RESPONSE, b""),
        guest(1024, FIRST_HOST_PORT, op::RW, b"hello host"),
    ];
    let mut ran = run(ops);
    assert_eq!(
        ran.m.conns.get(&key).map(|c| c.state),
        Some(State::Established)
    );
    let mut got = vec![0u8; 64];
    let n = ran.clients[0].read(&mut got).unwrap();
    // The `OK` line names the host-side port, as in Firecracker's hybrid vsock.
    let want = format!("OK {FIRST_HOST_PORT}\nhello host");
    assert_eq!(&got[..n], want.as_bytes());

    let ops = vec![
        Op::HostConnect(b"CONNECT 1024\n".to_vec()),
        guest(1024, FIRST_HOST_PORT, op::RESPONSE, b""),
        guest(1024, FIRST_HOST_PORT, op::RST, b""),
        guest(7, 8, op::RW, b"nobody"),
    ];
    let ran = run(ops);
    assert!(ran.m.conns.is_empty() && ran.m.rx_ready.is_empty() && ran.m.rx_new.is_empty());
    let rsts: Vec<(u32, u32)> = ran
        .m
        .rsts
        .iter()
        .map(|h| (h.src_port, h.dst_port))
        .collect();
    assert_eq!(rsts, [(8, 7)]);
}
