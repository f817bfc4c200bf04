//! Shared by the in-process vsock suites: the harness guest, host clients on its hybrid
//! socket, and a connection established between them.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vmm::virtio::test_utils::vsock_guest::VsockGuest;

pub const CID: u64 = 3;
pub const PORT: u32 = 1234;

pub fn setup() -> (tempfile::TempDir, PathBuf, VsockGuest) {
    let dir = tempfile::tempdir().unwrap();
    let uds = dir.path().join("v.sock");
    let g = VsockGuest::new(CID, &uds).unwrap();
    (dir, uds, g)
}

/// Connect as a host client; returns the stream after `OK <n>`, or the error text.
pub fn host_connect(uds: &Path, port: u32) -> Result<UnixStream, String> {
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

pub fn pump_until(
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

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
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

pub fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// A connection opened the only way there is, by a host client to a guest listener on
/// `port`: the guest's key and the host's stream.
pub fn established(g: &mut VsockGuest, uds: &Path, port: u32) -> ((u32, u32), UnixStream) {
    g.listen(port);
    let uds = uds.to_path_buf();
    let c = std::thread::spawn(move || host_connect(&uds, port));
    pump_until(g, Duration::from_secs(10), |_| c.is_finished());
    let s = c.join().unwrap().expect("host connect");
    let key = g
        .conns
        .iter()
        .find(|(k, c)| k.0 == port && c.established)
        .map(|(k, _)| *k)
        .expect("guest side of the connection");
    (key, s)
}
