//! virtio-rng: buffers are filled with random bytes, bounded per request.

use std::time::Duration;

use vmm::virtio::DeviceConfig;
use vmm::virtio::rng::MAX_BYTES_PER_REQUEST;
use vmm::virtio::test_utils::{Driver, Seg};

const T: Duration = Duration::from_secs(5);

#[test]
fn fills_buffer_with_random_bytes() {
    let mut d = Driver::new(&DeviceConfig::Rng).unwrap();
    d.activate(0);
    let a = d.alloc(4096);
    let b = d.alloc(4096);
    d.add_chain(0, &[Seg::writable(a, 4096)]);
    d.add_chain(0, &[Seg::writable(b, 4096)]);
    d.notify(0);
    assert_eq!(d.wait_used(0, T).unwrap().1, 4096);
    assert_eq!(d.wait_used(0, T).unwrap().1, 4096);
    let x = d.read_mem(a, 4096);
    let y = d.read_mem(b, 4096);
    assert_ne!(x, y);
    assert!(
        x.iter().filter(|&&v| v == 0).count() < 100,
        "buffer not filled"
    );
}

#[test]
fn large_request_is_bounded() {
    let mut d = Driver::new(&DeviceConfig::Rng).unwrap();
    d.activate(0);
    let len = 4 * MAX_BYTES_PER_REQUEST;
    let a = d.alloc(u64::from(len));
    d.add_chain(0, &[Seg::writable(a, len)]);
    d.notify(0);
    assert_eq!(d.wait_used(0, T).unwrap().1, MAX_BYTES_PER_REQUEST);
    let tail = d.read_mem(a + u64::from(MAX_BYTES_PER_REQUEST), 4096);
    assert!(tail.iter().all(|&v| v == 0), "wrote past the bound");
}

#[test]
fn readable_only_chain_gets_nothing() {
    let mut d = Driver::new(&DeviceConfig::Rng).unwrap();
    d.activate(0);
    let a = d.alloc(64);
    d.add_chain(0, &[Seg::readable(a, 64)]);
    d.notify(0);
    assert_eq!(d.wait_used(0, T).unwrap().1, 0);
    assert!(d.read_mem(a, 64).iter().all(|&v| v == 0));
}
