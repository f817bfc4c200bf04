//! virtio-vsock end to end in-process: host clients on the hybrid Unix socket <-> device <->
//! a harness "guest" (vmm::virtio::test_utils::vsock_guest).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm::virtio::test_utils::vsock_guest::VsockGuest;
use vmm::virtio::vsock::muxer::MAX_CONNECTIONS;
use vmm::virtio::vsock::packet::{HOST_CID, Header, TYPE_STREAM, op};

const CID: u64 = 3;
const PORT: u32 = 1234;

fn setup() -> (tempfile::TempDir, PathBuf, VsockGuest) {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let g = VsockGuest::new(CID, &uds).unwrap();
    (dir, uds, g)
}

/// Connect as a host client; returns the stream after `OK <n>`, or the error text.
fn host_connect(uds: &Path, port: u32) -> Result<UnixStream, String> {
    let s = UnixStream::connect(uds).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    (&s).write_all(format!("CONNECT {port}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match (&s).read(&mut b) {
            Ok(0) => return Err("eof".into()),
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => line.push(b[0]),
            Err(e) => return Err(e.to_string()),
        }
    }
    let line = String::from_utf8(line).map_err(|e| e.to_string())?;
    if !line.starts_with("OK ") {
        return Err(line);
    }
    Ok(s)
}

fn pump_until(
    g: &mut VsockGuest,
    timeout: Duration,
    mut done: impl FnMut(&mut VsockGuest) -> bool,
) {
    let end = Instant::now() + timeout;
    while !done(g) {
        assert!(Instant::now() < end, "timed out");
        g.pump(Duration::from_millis(5));
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

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

#[test]
fn guest_to_host_connect_and_echo() {
    let (_d, uds, mut g) = setup();
    let l = UnixListener::bind(format!("{}_5000", uds.display())).unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut buf = [0u8; 4];
        (&s).read_exact(&mut buf).unwrap();
        (&s).write_all(&buf).unwrap();
        buf
    });
    let key = g.connect(5000);
    pump_until(&mut g, Duration::from_secs(10), |g| {
        g.conns.get(&key).is_some_and(|c| c.established)
    });
    g.write(key, b"ping");
    pump_until(&mut g, Duration::from_secs(10), |g| {
        g.conns[&key].inbox.len() == 4
    });
    assert_eq!(g.conns[&key].inbox, b"ping");
    assert_eq!(&server.join().unwrap(), b"ping");
}

#[test]
fn guest_connect_to_unlistened_port_gets_rst() {
    let (_d, _uds, mut g) = setup();
    let key = g.connect(5001);
    pump_until(&mut g, Duration::from_secs(10), |g| g.resets.contains(&key));
}

#[test]
fn guest_connect_to_saturated_host_service_gets_rst_without_blocking() {
    let (_d, uds, mut g) = setup();
    let _l = UnixListener::bind(format!("{}_5006", uds.display())).unwrap();
    // Fill the service's accept backlog (it never accepts).
    let mut held = Vec::new();
    while let Ok(s) = vmm::virtio::vsock::unix::connect_peer(&uds, 5006) {
        held.push(s);
        assert!(held.len() < 10_000, "backlog never filled");
    }
    let key = g.connect(5006);
    pump_until(&mut g, Duration::from_secs(10), |g| g.resets.contains(&key));
    // The device is not stuck: another connection is served.
    let key2 = g.connect(5007);
    pump_until(&mut g, Duration::from_secs(10), |g| {
        g.resets.contains(&key2)
    });
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
    assert!(g.resets.is_empty());
    // The same request from the right CID is served.
    h.src_cid = g.cid;
    assert!(g.send_raw(&h, &[]));
    pump_until(&mut g, Duration::from_secs(10), |_| l.accept().is_ok());
}

#[test]
fn guest_overrunning_credit_is_reset() {
    let (_d, uds, mut g) = setup();
    // A host service that never reads.
    let l = UnixListener::bind(format!("{}_5004", uds.display())).unwrap();
    let keep = std::thread::spawn(move || {
        let s = l.accept().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let key = g.connect(5004);
    pump_until(&mut g, Duration::from_secs(10), |g| {
        g.conns.get(&key).is_some_and(|c| c.established)
    });
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
    keep.join().unwrap();
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
