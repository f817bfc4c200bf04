//! Device workers are started by the device control thread, never by the DRIVER_OK write
//! itself (made by a vCPU thread in a VM; the test thread here). No KVM needed: the harness
//! plays the guest driver, and its devices run under the production seccomp filters.

use std::time::{Duration, Instant};

use virtio_bindings::virtio_mmio::VIRTIO_MMIO_STATUS;
use vmm::virtio::DeviceConfig;
use vmm::virtio::test_utils::{Driver, Seg};

const T: Duration = Duration::from_secs(5);

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

/// Waits up to 5 s for exactly `n` threads named `name`; the count seen last.
fn settle(name: &str, n: usize) -> usize {
    let deadline = Instant::now() + T;
    loop {
        let seen = threads_named(name);
        if seen == n || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// With nobody serving the starter, DRIVER_OK still returns at once: the device is active, no
/// worker thread exists, a request waits; once the control side runs, the worker starts on
/// that thread and serves the request posted before it.
#[test]
fn driver_ok_never_waits_for_the_control_thread_and_its_worker_serves_what_was_posted() {
    let mut d = Driver::unserved(&DeviceConfig::Rng).unwrap();
    let started = Instant::now();
    d.activate_unserved();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "DRIVER_OK blocked"
    );
    assert!(d.dev.is_active());
    assert!(!d.dev.worker_running());
    assert_eq!(
        threads_named("virtio-4"),
        0,
        "a worker started without the control side"
    );
    let a = d.alloc(64);
    d.add_chain(0, &[Seg::writable(a, 64)]);
    d.notify(0);
    assert_eq!(d.wait_used(0, Duration::from_millis(200)), None);
    d.starter.start_pending();
    assert!(d.dev.worker_running());
    assert_eq!(d.wait_used(0, T).map(|(_, len)| len), Some(64));
    // A second call finds nothing pending: still one worker.
    d.starter.start_pending();
    assert_eq!(settle("virtio-4", 1), 1);
    d.dev.shutdown();
    assert_eq!(settle("virtio-4", 0), 0);
}

/// A guest toggling DRIVER_OK and reset as fast as it can never has more than one worker per
/// device: a reset drops the pending start and stops the running worker, and nothing queues up
/// behind the control thread.
#[test]
fn toggling_driver_ok_and_reset_runs_at_most_one_worker() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 4096]).unwrap();
    let cfg = DeviceConfig::Block {
        path: disk,
        read_only: true,
        id: "d".into(),
    };
    // Served by a control thread: each activation is started, each reset stops it.
    let mut d = Driver::new(&cfg).unwrap();
    // (A new thread names itself once it runs, and a joined one leaves /proc a moment after
    // the join returns: hence `settle`.)
    for _ in 0..50 {
        d.activate(0);
        assert_eq!(settle("virtio-2", 1), 1);
        d.write_reg(VIRTIO_MMIO_STATUS, 0);
        assert!(!d.dev.is_active());
        assert_eq!(settle("virtio-2", 0), 0);
    }
    drop(d);
    // Unserved: a thousand activations and resets leave one pending start, not a thousand.
    let mut d = Driver::unserved(&cfg).unwrap();
    for _ in 0..1000 {
        d.activate_unserved();
        d.write_reg(VIRTIO_MMIO_STATUS, 0);
    }
    d.activate_unserved();
    d.starter.start_pending();
    d.starter.start_pending();
    assert!(d.dev.worker_running());
    assert_eq!(settle("virtio-2", 1), 1);
    d.write_reg(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(settle("virtio-2", 0), 0);
}
