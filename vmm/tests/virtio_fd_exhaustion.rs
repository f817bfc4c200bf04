//! `MmioDevice::interrupt_event` when the process is out of file descriptors: an error for
//! the caller, never a panic. Alone in its own test binary because it lowers the process's
//! descriptor limit.

use vmm::virtio::test_utils::guest_memory;
use vmm::virtio::{DeviceConfig, MmioDevice, Starter};

#[test]
fn interrupt_event_without_free_fds_is_an_error_not_a_panic() {
    let dev =
        MmioDevice::new(&DeviceConfig::Rng, guest_memory(), &Starter::new().unwrap()).unwrap();
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `old`, which outlives the call.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) }, 0);
    let low = libc::rlimit {
        rlim_cur: old.rlim_cur.min(256),
        rlim_max: old.rlim_max,
    };
    // SAFETY: setrlimit reads one valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let mut held = Vec::new();
    let exhausted = loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) => break e.raw_os_error() == Some(libc::EMFILE),
        }
        if held.len() > 100_000 {
            break false;
        }
    };
    let starved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dev.interrupt_event()));
    drop(held);
    // SAFETY: as above; restores the original limit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) };
    assert!(exhausted, "could not exhaust file descriptors");
    let starved = starved.expect("interrupt_event panicked when out of fds");
    assert!(
        starved.is_err(),
        "an eventfd was duplicated with no fd free"
    );
    // Two handles are the same eventfd (the device's interrupt line).
    let a = dev.interrupt_event().expect("fds are free again");
    let b = dev.interrupt_event().expect("fds are free again");
    a.write(3).unwrap();
    assert_eq!(b.read().unwrap(), 3);
}
