//! virtio-vsock in-process: a guest that closes its socket while what it sent last still waits
//! for a slow host (the connection lingers to deliver it, bounded by `CLOSE_LINGER`).

mod vsock_common;

use std::io::Read;
use std::time::{Duration, Instant};

use vmm::virtio::test_utils::vsock_guest::VsockGuest;
use vsock_common::*;

/// Writes `data` from the guest while the host reads nothing, until the guest is out of
/// credit (the host socket full, the device's own buffer full); then closes the guest's side
/// (SHUTDOWN with RCV and SEND, what `close()` sends). Returns how many bytes the device took.
fn guest_writes_until_stalled_then_closes(
    g: &mut VsockGuest,
    key: (u32, u32),
    data: &[u8],
) -> usize {
    g.write(key, data);
    let (mut left, mut still) = (usize::MAX, 0);
    // The outbox has stopped shrinking for a whole second: the guest has no credit left.
    while still < 50 {
        g.pump(Duration::from_millis(20));
        let now = g.conns[&key].outbox.len();
        if now == left {
            still += 1;
        } else {
            (left, still) = (now, 0);
        }
    }
    assert!(left > 0, "the host socket took all {} bytes", data.len());
    g.conns.get_mut(&key).unwrap().outbox.clear();
    g.close(key);
    g.pump(Duration::from_millis(20));
    data.len() - left
}

/// A guest that closes its socket while what it sent last still waits for a slow host: every
/// byte the device took reaches the host, then EOF (cli/tests/cp_guest.rs lost the agent's last
/// frame this way under load: the device reset the connection with it still buffered).
#[test]
fn guest_close_with_data_buffered_for_a_slow_host_delivers_every_byte() {
    let (_d, uds, mut g) = setup();
    let (key, s) = established(&mut g, &uds, 5012);
    let data = pattern(12, 4 << 20);
    let sent = guest_writes_until_stalled_then_closes(&mut g, key, &data);
    assert!(
        !g.resets.contains(&key),
        "reset before the host read anything"
    );
    let reader = std::thread::spawn(move || {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        (&s).read_to_end(&mut got)
            .map(|_| got)
            .map_err(|e| e.to_string())
    });
    pump_until(&mut g, Duration::from_secs(20), |_| reader.is_finished());
    let got = reader.join().unwrap().expect("the host read to EOF");
    assert_eq!(
        got.len(),
        sent,
        "bytes the host received vs bytes the device took"
    );
    assert!(got == data[..sent], "the delivered bytes differ");
    // Drained: the device then tells the guest the connection is gone.
    pump_until(&mut g, Duration::from_secs(5), |g| g.resets.contains(&key));
}

/// A closed guest connection whose host never reads is dropped after `CLOSE_LINGER`: the
/// host gets what fitted in its socket, then EOF; the device holds nothing longer.
#[test]
fn guest_close_to_a_host_that_never_reads_is_dropped_after_the_linger() {
    use vmm::virtio::vsock::connection::CLOSE_LINGER;
    let (_d, uds, mut g) = setup();
    let (key, s) = established(&mut g, &uds, 5013);
    let data = pattern(13, 4 << 20);
    let sent = guest_writes_until_stalled_then_closes(&mut g, key, &data);
    let closed = Instant::now();
    pump_until(&mut g, CLOSE_LINGER + Duration::from_secs(10), |g| {
        g.resets.contains(&key)
    });
    assert!(
        closed.elapsed() + Duration::from_secs(2) >= CLOSE_LINGER,
        "dropped after {:?}, before the linger",
        closed.elapsed()
    );
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    (&s).read_to_end(&mut got)
        .expect("EOF after the device dropped it");
    assert!(
        got.len() < sent,
        "the host got {} of {sent} bytes",
        got.len()
    );
    assert!(got == data[..got.len()], "the delivered bytes differ");
}
