//! virtio-vsock end to end in-process: host clients on the hybrid Unix socket <-> device <->
//! a harness "guest" (vmm::virtio::test_utils::vsock_guest).

mod vsock_common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm::virtio::test_utils::vsock_guest::VsockGuest;
use vmm::virtio::vsock::muxer::{MAX_CONNECTIONS, guest_connects_refused};
use vmm::virtio::vsock::packet::{HOST_CID, Header, TYPE_STREAM, op};
use vsock_common::*;

/// A host client that sends `len` bytes and checks the echo; returns whether the checksum matched.
fn echo_client(uds: PathBuf, seed: u64, len: usize) -> JoinHandle<bool> {
    std::thread::spawn(move || {
        let s = host_connect(&uds, PORT).expect("connect");
        let data = pattern(seed, len);
        let want = fnv(&data);
        let mut w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || w.write_all(&data).is_ok());
        let mut got = vec![0u8; len];
        let ok = (&s).read_exact(&mut got).is_ok();
        writer.join().unwrap() && ok && fnv(&got) == want
    })
}

fn run_clients(g: &mut VsockGuest, clients: Vec<JoinHandle<bool>>, timeout: Duration) -> Vec<bool> {
    pump_until(g, timeout, |_| clients.iter().all(|c| c.is_finished()));
    clients.into_iter().map(|c| c.join().unwrap()).collect()
}

#[test]
fn host_to_guest_connect_and_echo() {
    let (_d, uds, mut g) = setup();
    g.listen(PORT);
    g.echo = true;
    let c = echo_client(uds, 1, 5000);
    assert_eq!(
        run_clients(&mut g, vec![c], Duration::from_secs(20)),
        vec![true]
    );
}

/// No guest-initiated connection reaches the host: a listener on the path a hybrid-vsock VMM
/// would connect to (`<uds>_<port>`) sees nothing, the guest gets RST each time, every refusal
/// is counted, and host connections are served meanwhile.
#[test]
fn guest_connects_get_rst_and_reach_no_host_listener() {
    let (_d, uds, mut g) = setup();
    let before = guest_connects_refused();
    let would_be = vmm::virtio::vsock::unix::peer_path(&uds, 5000);
    let l = UnixListener::bind(&would_be).unwrap();
    l.set_nonblocking(true).unwrap();
    let keys: Vec<_> = (0..50).map(|_| g.connect(5000)).collect();
    let other = g.connect(5001);
    pump_until(&mut g, Duration::from_secs(10), |g| {
        keys.iter().chain([&other]).all(|k| g.resets.contains(k))
    });
    assert!(
        keys.iter().all(|k| !g.conns.contains_key(k)),
        "a refused connection lingers"
    );
    assert_eq!(guest_connects_refused() - before, 51);
    match l.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        r => panic!("the would-be host listener got {r:?}"),
    }
    g.listen(PORT);
    g.echo = true;
    let c = echo_client(uds, 7, 10_000);
    assert_eq!(
        run_clients(&mut g, vec![c], Duration::from_secs(20)),
        vec![true]
    );
}

#[test]
fn host_connect_to_unlistened_guest_port_is_closed() {
    let (_d, uds, mut g) = setup();
    let c = std::thread::spawn(move || host_connect(&uds, 7777).is_err());
    pump_until(&mut g, Duration::from_secs(10), |_| c.is_finished());
    assert!(c.join().unwrap());
}

#[test]
fn fifty_concurrent_connections_move_one_mib_each() {
    let (_d, uds, mut g) = setup();
    g.listen(PORT);
    g.echo = true;
    let clients = (0..50)
        .map(|i| echo_client(uds.clone(), i, 1 << 20))
        .collect();
    let res = run_clients(&mut g, clients, Duration::from_secs(240));
    assert!(res.iter().all(|&ok| ok), "checksum mismatch: {res:?}");
}

#[test]
fn hundred_connections_closed_mid_transfer_then_still_serving() {
    let (_d, uds, mut g) = setup();
    g.listen(PORT);
    g.echo = true;
    let clients: Vec<JoinHandle<bool>> = (0..100)
        .map(|i| {
            let uds = uds.clone();
            std::thread::spawn(move || {
                let s = host_connect(&uds, PORT).expect("connect");
                let data = pattern(i, 100_000);
                let _ = (&s).write_all(&data[..50_000]);
                let mut b = [0u8; 1000];
                let _ = (&s).read(&mut b);
                true // dropped mid-transfer
            })
        })
        .collect();
    run_clients(&mut g, clients, Duration::from_secs(60));
    // The guest sees every one of them go away.
    pump_until(&mut g, Duration::from_secs(30), |g| g.conns.is_empty());
    let c = echo_client(uds, 999, 200_000);
    assert_eq!(
        run_clients(&mut g, vec![c], Duration::from_secs(30)),
        vec![true]
    );
}

#[test]
fn slowloris_and_overlong_line_dropped_while_other_connection_works() {
    let (_d, uds, mut g) = setup();
    g.listen(PORT);
    g.echo = true;
    let slow = UnixStream::connect(&uds).unwrap();
    (&slow).write_all(b"CONNE").unwrap();
    let long = UnixStream::connect(&uds).unwrap();
    (&long).write_all(&[b'A'; 40]).unwrap();
    let t0 = Instant::now();
    let good = echo_client(uds.clone(), 5, 100_000);
    assert_eq!(
        run_clients(&mut g, vec![good], Duration::from_secs(20)),
        vec![true]
    );
    let eof = |s: &UnixStream| {
        s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let mut b = [0u8; 8];
        matches!((&*s).read(&mut b), Ok(0))
    };
    pump_until(&mut g, Duration::from_secs(2), |_| eof(&long));
    pump_until(&mut g, Duration::from_secs(10), |_| eof(&slow));
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "slow client dropped too early"
    );
}

#[test]
fn unanswered_host_connection_times_out() {
    let (_d, uds, mut g) = setup();
    g.listen(PORT);
    g.ignore_requests = true;
    let t0 = Instant::now();
    let c = std::thread::spawn(move || host_connect(&uds, PORT));
    pump_until(&mut g, Duration::from_secs(10), |_| c.is_finished());
    assert_eq!(c.join().unwrap().err().as_deref(), Some("eof"));
    assert!(t0.elapsed() >= Duration::from_secs(2));
    // The guest is told to forget the half-open connection.
    pump_until(&mut g, Duration::from_secs(5), |g| {
        g.resets.iter().any(|k| k.0 == PORT)
    });
}

#[test]
fn connection_beyond_limit_is_refused() {
    let (_d, uds, mut g) = setup();
    g.listen(PORT);
    let opened = Arc::new(AtomicUsize::new(0));
    let (o2, u2) = (opened.clone(), uds.clone());
    let opener = std::thread::spawn(move || {
        let mut v = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            v.push(host_connect(&u2, PORT).expect("connect within limit"));
            o2.fetch_add(1, Ordering::SeqCst);
        }
        let extra = host_connect(&u2, PORT);
        (v, extra.is_err())
    });
    pump_until(&mut g, Duration::from_secs(120), |_| opener.is_finished());
    let (held, refused) = opener.join().unwrap();
    assert_eq!(held.len(), MAX_CONNECTIONS);
    assert!(refused, "connection {} was accepted", MAX_CONNECTIONS + 1);
    assert_eq!(g.conns.len(), MAX_CONNECTIONS);
}

#[test]
fn transport_reset_drops_connections_and_notifies_guest() {
    let (_d, uds, mut g) = setup();
    g.listen(PORT);
    let c = std::thread::spawn(move || {
        let s = host_connect(&uds, PORT).unwrap();
        let mut b = [0u8; 1];
        matches!((&s).read(&mut b), Ok(0))
    });
    pump_until(&mut g, Duration::from_secs(10), |g| g.conns.len() == 1);
    g.d.dev.request_transport_reset();
    pump_until(&mut g, Duration::from_secs(10), |g| g.transport_resets == 1);
    pump_until(&mut g, Duration::from_secs(10), |_| c.is_finished());
    assert!(c.join().unwrap(), "host client not closed");
}

fn raw(g: &VsockGuest, o: u16, len: u32) -> Header {
    Header {
        src_cid: g.cid,
        dst_cid: HOST_CID,
        src_port: 40_000,
        dst_port: 5002,
        len,
        kind: TYPE_STREAM,
        op: o,
        buf_alloc: 65536,
        ..Header::default()
    }
}

#[test]
fn payload_longer_than_chain_gets_rst() {
    let (_d, _uds, mut g) = setup();
    let h = raw(&g, op::RW, 4096);
    assert!(g.send_raw(&h, &[1, 2, 3]));
    pump_until(&mut g, Duration::from_secs(10), |g| {
        g.resets.contains(&(40_000, 5002))
    });
    // The device still serves.
    let key = g.connect(5003);
    pump_until(&mut g, Duration::from_secs(10), |g| g.resets.contains(&key));
}

#[test]
fn packet_with_wrong_source_cid_is_dropped() {
    let (_d, uds, mut g) = setup();
    let l = UnixListener::bind(format!("{}_5002", uds.display())).unwrap();
    l.set_nonblocking(true).unwrap();
    let mut h = raw(&g, op::REQUEST, 0);
    h.src_cid = 99;
    assert!(g.send_raw(&h, &[]));
    pump_until(&mut g, Duration::from_secs(10), |g| {
        g.d.free_descs(1) == 256
    });
    for _ in 0..20 {
        g.pump(Duration::from_millis(5));
    }
    assert!(
        l.accept().is_err(),
        "device connected on behalf of a spoofed packet"
    );
    assert!(g.resets.is_empty(), "a spoofed packet got an answer");
    // The same request from the right CID is refused with RST (and still connects nothing).
    h.src_cid = g.cid;
    assert!(g.send_raw(&h, &[]));
    pump_until(&mut g, Duration::from_secs(10), |g| !g.resets.is_empty());
    assert!(
        l.accept().is_err(),
        "a guest request reached a host listener"
    );
}

#[test]
fn guest_overrunning_credit_is_reset() {
    let (_d, uds, mut g) = setup();
    // A host client that never reads.
    let (key, keep) = established(&mut g, &uds, 5004);
    // Ignore credit: push 600 KiB of RW packets straight away.
    let chunk = vec![7u8; 16 * 1024];
    let mut h = raw(&g, op::RW, chunk.len() as u32);
    h.src_port = key.0;
    h.dst_port = key.1;
    let mut sent = 0;
    let end = Instant::now() + Duration::from_secs(10);
    while sent < 40 && Instant::now() < end {
        if g.send_raw(&h, &chunk) {
            sent += 1;
        } else {
            g.pump(Duration::from_millis(5));
        }
    }
    pump_until(&mut g, Duration::from_secs(10), |g| g.resets.contains(&key));
    drop(keep);
}

#[test]
fn socket_file_removed_on_drop() {
    let (_d, uds, g) = setup();
    assert!(uds.exists());
    drop(g);
    assert!(!uds.exists());
}

#[test]
fn idle_guest_without_rx_buffers_costs_no_cpu() {
    let (_d, uds, mut g) = setup();
    g.listen(PORT);
    // Announce more credit than the RX buffers hold, so RX buffers run out first.
    g.buf_alloc = 16 << 20;
    let c = std::thread::spawn(move || {
        let s = host_connect(&uds, PORT).unwrap();
        // Flood: the guest never reads, so the device must stop polling this socket.
        s.set_nonblocking(true).unwrap();
        let buf = vec![1u8; 65536];
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            let _ = (&s).write(&buf);
            std::thread::sleep(Duration::from_millis(1));
        }
        s
    });
    pump_until(&mut g, Duration::from_secs(10), |g| g.conns.len() == 1);
    // Stop pumping (no RX buffers get reposted): measure the device worker's CPU time.
    let before = worker_cpu_ticks();
    let s = c.join().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let after = worker_cpu_ticks();
    drop(s);
    if let (Some(b), Some(a)) = (before, after) {
        // 2.5 s of wall time; a polling loop would burn ~250 ticks.
        assert!(
            a - b < 25,
            "vsock worker used {} ticks while the guest was idle",
            a - b
        );
    } else {
        panic!("cannot find the vsock worker thread");
    }
}

/// utime+stime (clock ticks) of the thread named "virtio-19".
fn worker_cpu_ticks() -> Option<u64> {
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "virtio-19" {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let rest = stat.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            return Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?);
        }
    }
    None
}

/// On the host stream `s`: read everything to EOF (bounded by a timeout), then write `reply`
/// and close. Returns what it read, or the read error.
fn read_to_eof_then_reply(
    s: UnixStream,
    reply: &'static [u8],
) -> JoinHandle<Result<Vec<u8>, String>> {
    std::thread::spawn(move || {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        (&s).read_to_end(&mut got).map_err(|e| e.to_string())?;
        (&s).write_all(reply).map_err(|e| e.to_string())?;
        Ok(got)
    })
}

/// Linux 6.12 queues a guest write above ~32 KiB as a nonlinear skb: one descriptor for the
/// header, then one per page fragment (and a linear part may share the header's buffer).
/// Every such packet must be accepted and delivered in order, byte for byte.
#[test]
fn guest_tx_payload_spread_over_several_descriptors_is_delivered_intact() {
    let (_d, uds, mut g) = setup();
    let (key, s) = established(&mut g, &uds, 5010);
    let received = Arc::new(AtomicUsize::new(0));
    let counter = received.clone();
    let server = std::thread::spawn(move || -> Result<Vec<u8>, String> {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            match (&s).read(&mut buf).map_err(|e| e.to_string())? {
                0 => return Ok(got),
                n => got.extend_from_slice(&buf[..n]),
            }
            counter.store(got.len(), Ordering::SeqCst);
        }
    });
    let max = vmm::virtio::vsock::packet::MAX_PAYLOAD as usize;
    let packets: Vec<(Vec<u8>, Vec<usize>)> = vec![
        // Header alone, then 16 page-sized fragments: a 64 KiB nonlinear skb.
        (
            pattern(1, max),
            vec![0; 1].into_iter().chain([4096; 16]).collect(),
        ),
        // Part of the payload shares the header's descriptor; uneven fragments.
        (pattern(2, 40_000), vec![1000, 13_000, 13_000, 13_000]),
        // Two halves.
        (pattern(3, max), vec![0, max / 2, max / 2]),
        // Many one-byte fragments.
        (
            pattern(4, 100),
            vec![0; 1].into_iter().chain([1; 100]).collect(),
        ),
    ];
    let mut want = Vec::new();
    for (payload, layout) in &packets {
        let hdr = g.header_for(key, op::RW, payload.len() as u32);
        assert!(g.send_raw_split(&hdr, payload, layout), "no TX descriptors");
        want.extend_from_slice(payload);
        // The host has it all before the next packet (so the device buffers nothing and the
        // guest stays within its credit).
        let n = want.len();
        pump_until(&mut g, Duration::from_secs(10), |g| {
            received.load(Ordering::SeqCst) == n || g.resets.contains(&key)
        });
        assert!(!g.resets.contains(&key), "device reset the connection");
    }
    g.shutdown_send(key);
    pump_until(&mut g, Duration::from_secs(20), |_| server.is_finished());
    let got = server.join().unwrap().expect("host side read");
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "payload corrupted (fnv {:x} != {:x})",
        fnv(&got),
        fnv(&want)
    );
    assert!(!g.resets.contains(&key), "device reset the connection");
}

/// A guest half-close (SHUTDOWN with only SEND) gives the host peer EOF while the host can
/// still send to the guest; the host closing then reaches the guest as SHUTDOWN(SEND).
#[test]
fn guest_half_close_gives_host_eof_and_host_can_still_reply() {
    let (_d, uds, mut g) = setup();
    let (key, s) = established(&mut g, &uds, 5011);
    let server = read_to_eof_then_reply(s, b"reply after eof");
    g.write(key, b"request");
    g.shutdown_send(key);
    pump_until(&mut g, Duration::from_secs(20), |g| {
        g.conns
            .get(&key)
            .is_some_and(|c| c.inbox.len() >= 15 && c.peer_shutdown)
    });
    assert_eq!(
        server.join().unwrap().as_deref(),
        Ok(&b"request"[..]),
        "the host did not see the request followed by EOF"
    );
    let c = &g.conns[&key];
    assert!(c.shut_send_sent);
    assert_eq!(c.inbox, b"reply after eof");
    assert!(
        !g.resets.contains(&key),
        "half-close was turned into a reset"
    );
}

/// A host half-close (`shutdown(Write)` on the Unix stream) reaches the guest as
/// SHUTDOWN(SEND) after the data; the guest can still answer and then half-close itself.
#[test]
fn host_half_close_reaches_guest_as_shutdown_send() {
    let (_d, uds, mut g) = setup();
    g.listen(PORT);
    let client = std::thread::spawn(move || -> Result<Vec<u8>, String> {
        let s = host_connect(&uds, PORT)?;
        (&s).write_all(b"question").map_err(|e| e.to_string())?;
        s.shutdown(std::net::Shutdown::Write)
            .map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        (&s).read_to_end(&mut got).map_err(|e| e.to_string())?;
        Ok(got)
    });
    pump_until(&mut g, Duration::from_secs(20), |g| {
        g.conns
            .values()
            .any(|c| c.inbox == b"question" && c.peer_shutdown)
    });
    let key = *g
        .conns
        .iter()
        .find(|(_, c)| c.peer_shutdown)
        .map(|(k, _)| k)
        .unwrap();
    assert!(g.resets.is_empty(), "host half-close became a reset");
    g.write(key, b"answer");
    g.shutdown_send(key);
    pump_until(&mut g, Duration::from_secs(20), |_| client.is_finished());
    assert_eq!(client.join().unwrap().as_deref(), Ok(&b"answer"[..]));
}
