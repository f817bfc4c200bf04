//! Device snapshot and restore through the harness that plays the guest driver (no KVM): a
//! device brought to DRIVER_OK serves some buffers, is saved (its worker stopped), and a
//! fresh device over a copy of guest RAM restored from that state serves the next buffers
//! from exactly the saved queue positions. Refusals each name what is wrong.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use virtio_bindings::virtio_blk::VIRTIO_BLK_T_IN;
use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_QUEUE_READY, VIRTIO_MMIO_QUEUE_SEL};
use vmm::virtio::persist::InvalidDevice;
use vmm::virtio::test_utils::vsock_guest::VsockGuest;
use vmm::virtio::test_utils::{Driver, Seg};
use vmm::virtio::{DeviceConfig, PersistError};

const T: Duration = Duration::from_secs(5);

/// The used ring's index of queue `q`, as the guest reads it.
fn used_idx(d: &Driver, q: usize) -> u16 {
    let b = d.read_mem(d.queues[q].used + 2, 2);
    u16::from_le_bytes([b[0], b[1]])
}

fn rng_buffer(d: &mut Driver) -> Vec<u8> {
    let a = d.alloc(256);
    d.add_chain(0, &[Seg::writable(a, 256)]);
    d.notify(0);
    assert_eq!(d.wait_used(0, T).expect("rng served").1, 256);
    d.read_mem(a, 256)
}

#[test]
fn rng_serves_the_next_buffer_after_a_restore() {
    let mut d = Driver::new(&DeviceConfig::Rng).unwrap();
    d.activate(0);
    let before = [rng_buffer(&mut d), rng_buffer(&mut d)];
    let state = d.save().unwrap();
    assert!(!d.dev.is_active(), "the worker is stopped by a save");
    assert_eq!(state.queues[0].next_avail, 2);
    assert_eq!(state.queues[0].next_used, 2);
    let status = d.status();
    let mut r = d.restore_copy(&DeviceConfig::Rng, &state).unwrap();
    drop(d);
    assert!(r.wait_worker(), "the restored worker starts");
    assert_eq!(r.status(), status);
    // Read back: the restored device saves to the very same state.
    assert_eq!(r.save().unwrap(), state);
    r.write_reg(VIRTIO_MMIO_QUEUE_SEL, 0);
    assert_eq!(r.read_reg(VIRTIO_MMIO_QUEUE_READY), 1);
    r.dev.resume_after_save().unwrap();
    assert!(r.wait_worker());
    let after = rng_buffer(&mut r);
    assert_eq!(
        used_idx(&r, 0),
        3,
        "the used index continues from the saved one"
    );
    assert!(before.iter().all(|b| *b != after));
    assert!(after.iter().filter(|&&v| v == 0).count() < 16, "not filled");
}

fn image(dir: &Path) -> PathBuf {
    let p = dir.join("disk.img");
    let data: Vec<u8> = (0..64 * 512).map(|i| (i / 512) as u8).collect();
    std::fs::write(&p, data).unwrap();
    p
}

fn block_cfg(path: &Path, read_only: bool) -> DeviceConfig {
    DeviceConfig::Block {
        path: path.into(),
        read_only,
        id: "snap".into(),
    }
}

/// Read `sector`; returns its 512 bytes after checking the status byte.
fn read_sector(d: &mut Driver, sector: u64) -> Vec<u8> {
    let h = d.alloc(16);
    let mut hdr = [0u8; 16];
    hdr[..4].copy_from_slice(&VIRTIO_BLK_T_IN.to_le_bytes());
    hdr[8..].copy_from_slice(&sector.to_le_bytes());
    d.write_mem(h, &hdr);
    let (data, st) = (d.alloc(512), d.alloc(1));
    d.write_mem(st, &[0xff]);
    d.add_chain(
        0,
        &[
            Seg::readable(h, 16),
            Seg::writable(data, 512),
            Seg::writable(st, 1),
        ],
    );
    d.notify(0);
    d.wait_used(0, T).expect("block served");
    assert_eq!(d.read_mem(st, 1)[0], 0, "status OK");
    d.read_mem(data, 512)
}

#[test]
fn block_reads_the_right_sector_after_a_restore() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = block_cfg(&image(dir.path()), true);
    let mut d = Driver::new(&cfg).unwrap();
    d.activate(0);
    assert_eq!(read_sector(&mut d, 3), vec![3; 512]);
    assert_eq!(read_sector(&mut d, 9), vec![9; 512]);
    let state = d.save().unwrap();
    let mut r = d.restore_copy(&cfg, &state).unwrap();
    drop(d);
    assert!(r.wait_worker());
    assert_eq!(read_sector(&mut r, 42), vec![42; 512]);
    assert_eq!(used_idx(&r, 0), 3);
    assert_eq!(
        r.metrics().requests,
        1,
        "the restored device served one request"
    );
}

#[test]
fn refusals_name_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(dir.path());
    let cfg = block_cfg(&path, true);
    let mut d = Driver::new(&cfg).unwrap();
    d.activate(0);
    read_sector(&mut d, 1);
    let state = d.save().unwrap();
    let field = |r: Result<Driver, PersistError>| match r {
        Err(PersistError::Mismatch { field, .. }) => field,
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("restored"),
    };
    // Another device type.
    assert_eq!(field(d.restore_copy(&DeviceConfig::Rng, &state)), "type");
    // Another disk.
    let other = dir.path().join("other.img");
    std::fs::copy(&path, &other).unwrap();
    assert_eq!(
        field(d.restore_copy(&block_cfg(&other, true), &state)),
        "path"
    );
    // The disk grew.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&[0; 512])
        .unwrap();
    assert_eq!(field(d.restore_copy(&cfg, &state)), "size");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(64 * 512)
        .unwrap();
    let invalid = |r: Result<Driver, PersistError>| match r {
        Err(PersistError::Invalid(e)) => e,
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("restored"),
    };
    let mut s = state.clone();
    s.queues[0].avail = (64 << 20) - 2;
    assert!(matches!(
        invalid(d.restore_copy(&cfg, &s)),
        InvalidDevice::QueueAddress { ring: "avail", .. }
    ));
    let mut s = state.clone();
    s.queues[0].size = 1024;
    assert!(matches!(
        invalid(d.restore_copy(&cfg, &s)),
        InvalidDevice::QueueSize { size: 1024, .. }
    ));
    let mut s = state.clone();
    s.transport.acked_features |= 1 << 40;
    assert!(matches!(
        invalid(d.restore_copy(&cfg, &s)),
        InvalidDevice::Features { .. }
    ));
    // The untouched state still restores.
    assert!(d.restore_copy(&cfg, &state).unwrap().wait_worker());
}

#[test]
fn a_writable_disk_is_refused_for_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Driver::new(&block_cfg(&image(dir.path()), false)).unwrap();
    d.activate(0);
    assert!(matches!(
        d.save(),
        Err(PersistError::Unsupported {
            what: "a writable disk",
            ..
        })
    ));
    assert!(
        d.dev.is_active(),
        "a refused save leaves the worker running"
    );
}

/// Connect as a host client; the stream after `OK <n>`.
fn host_connect(uds: &Path, port: u32, g: &mut VsockGuest) -> UnixStream {
    let s = UnixStream::connect(uds).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    (&s).write_all(format!("CONNECT {port}\n").as_bytes())
        .unwrap();
    read_ok_line(&s, g);
    s
}

/// Pumps the guest until the handshake's `OK <port>` line has been read from `s`.
fn read_ok_line(mut s: &UnixStream, g: &mut VsockGuest) {
    let mut line = Vec::new();
    let end = Instant::now() + T;
    while !line.ends_with(b"\n") {
        assert!(Instant::now() < end, "no OK line");
        g.pump(Duration::from_millis(5));
        let mut b = [0u8; 1];
        if let Ok(1) = s.read(&mut b) {
            line.push(b[0]);
        }
    }
    assert!(line.starts_with(b"OK "), "{line:?}");
}

/// Pump the guest until `done`.
fn pump_until(g: &mut VsockGuest, mut done: impl FnMut(&mut VsockGuest) -> bool) {
    let end = Instant::now() + T;
    while !done(g) {
        assert!(Instant::now() < end, "timed out");
        g.pump(Duration::from_millis(5));
    }
}

#[test]
fn vsock_resets_its_transport_once_and_serves_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let mut g = VsockGuest::new(3, &uds).unwrap();
    g.listen(1024);
    let s = host_connect(&uds, 1024, &mut g);
    (&s).write_all(b"before").unwrap();
    pump_until(&mut g, |g| g.conns.values().any(|c| c.inbox == b"before"));
    assert_eq!(g.transport_resets, 0);

    let uds2 = dir.path().join("v2.sock");
    g.snapshot_restore(&uds2).unwrap();
    pump_until(&mut g, |g| g.transport_resets > 0);
    // Exactly one reset, and the guest dropped its connections on it.
    for _ in 0..20 {
        g.pump(Duration::from_millis(5));
    }
    assert_eq!(g.transport_resets, 1);
    assert!(g.conns.is_empty());
    // The old host client's connection is gone with the old device.
    s.set_read_timeout(Some(T)).unwrap();
    assert_eq!((&s).read(&mut [0u8; 8]).unwrap_or(0), 0);

    let s2 = host_connect(&uds2, 1024, &mut g);
    (&s2).write_all(b"after").unwrap();
    pump_until(&mut g, |g| g.conns.values().any(|c| c.inbox == b"after"));
}

/// A host client that connects to a restored VM before its driver has handled the transport
/// reset event: its `REQUEST` is held (Linux would accept it, then reset the new socket
/// with the others while handling the event, telling the host nothing, and the client would
/// wait forever) and goes out once the driver posts its event buffer again; the connection
/// then works.
#[test]
fn vsock_holds_new_connections_until_the_guest_handled_the_reset() {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let mut g = VsockGuest::new(3, &uds).unwrap();
    g.listen(1024);
    g.hold_events = true;
    let uds2 = dir.path().join("v2.sock");
    g.snapshot_restore(&uds2).unwrap();

    let s = UnixStream::connect(&uds2).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    (&s).write_all(b"CONNECT 1024\n").unwrap();
    let held_until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < held_until {
        g.pump(Duration::from_millis(5));
    }
    assert!(
        g.conns.is_empty(),
        "a connection reached the guest before it handled the reset"
    );
    assert_eq!(g.transport_resets, 0, "the event is still unhandled");

    g.hold_events = false;
    read_ok_line(&s, &mut g);
    assert_eq!(g.transport_resets, 1);
    (&s).write_all(b"after").unwrap();
    pump_until(&mut g, |g| g.conns.values().any(|c| c.inbox == b"after"));
}
