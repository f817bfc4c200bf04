//! A guest flooding a device with malformed requests gets at most the limiter's budget of
//! log lines per call site (`vmm::logger::budget`), the drops reported on the lines that do
//! get through (`suppressed=N`) and in the device's counters.
//!
//! Its own test binary: the log subscriber it installs is process-wide.

use std::time::{Duration, Instant};

use vm_test_support::capture::Captured;
use vmm::logger::writer::RecordWriter;
use vmm::virtio::DeviceConfig;
use vmm::virtio::test_utils::{Driver, MEM_SIZE, Seg};

#[test]
fn a_flood_of_malformed_requests_logs_within_the_budget() {
    let log = Captured::default();
    let sink = log.clone();
    assert!(vmm::logger::install(move || RecordWriter::new(
        sink.clone()
    )));

    let mut d = Driver::new(&DeviceConfig::Rng).unwrap();
    d.activate(0);
    // A buffer outside guest RAM: the chain is malformed, answered with length 0.
    let outside = Seg::writable(MEM_SIZE as u64 + 4096, 64);
    let t0 = Instant::now();
    let mut sent = 0u64;
    while sent < 5000 || t0.elapsed() < Duration::from_millis(1500) {
        d.add_chain(0, &[outside]);
        d.notify(0);
        let (_, len) = d.wait_used(0, Duration::from_secs(5)).expect("answered");
        assert_eq!(len, 0);
        sent += 1;
    }
    let elapsed = t0.elapsed();

    let text = log.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("virtio-rng: malformed request"))
        .collect();
    let budget = vmm::logger::budget(elapsed);
    assert!(
        lines.len() as u64 <= budget,
        "{} lines for {sent} requests in {elapsed:?}, budget {budget}",
        lines.len()
    );
    assert!(lines.len() as u64 > u64::from(vmm::logger::rate_limited::BURST));
    assert!(lines.iter().all(|l| l.contains("WARN")));
    let reported: u64 = lines
        .iter()
        .filter_map(|l| l.split("suppressed=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert!(
        reported > 0,
        "no line says how many were suppressed:\n{text}"
    );

    let m = d.metrics();
    assert_eq!(m.name, "virtio-rng");
    assert_eq!((m.requests, m.errors, m.bytes), (sent, sent, 0));
    assert_eq!(m.rate_limited, sent - lines.len() as u64);
    assert!(reported <= m.rate_limited);
}
