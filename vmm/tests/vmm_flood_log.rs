//! A guest flooding a device makes the jailed `vm-vmm` warn at most the limiter's budget of
//! lines (`vmm::logger::budget`) on its log, and the `metrics` control command answers on the
//! log stream with the device's counters (errors, rate-limited drops). Needs `/dev/kvm`.

mod proc_harness;
mod tiny_harness;

use std::time::{Duration, Instant};

use proc_harness::VmProc;
use tiny_harness::{mmio, skip_without_kvm};
use virtio_bindings::virtio_mmio::{
    VIRTIO_MMIO_DRIVER_FEATURES, VIRTIO_MMIO_DRIVER_FEATURES_SEL, VIRTIO_MMIO_STATUS,
};
use vmm::metrics::MetricsReport;
use vmm::virtio::DeviceConfig;
use vmm::{KernelFormat, VmConfig};

/// The warning the flood triggers.
const WARNING: &str = "virtio-rng: DRIVER_OK with an invalid queue";

/// A guest that, forever: resets the device at `base` (one virtio-rng), negotiates
/// `VIRTIO_F_VERSION_1` and sets DRIVER_OK without ever making its queue ready.
fn flooding_guest(base: u64) -> Vec<u8> {
    let base = u32::try_from(base).expect("an MMIO window below 4 GiB");
    let mov_ebx: Vec<u8> = [0xbb].iter().chain(&base.to_le_bytes()).copied().collect();
    let body: Vec<u8> = [
        (VIRTIO_MMIO_STATUS, 0),
        (VIRTIO_MMIO_STATUS, 1),
        (VIRTIO_MMIO_STATUS, 3),
        (VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1),
        (VIRTIO_MMIO_DRIVER_FEATURES, 1),
        (VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0),
        (VIRTIO_MMIO_DRIVER_FEATURES, 0),
        (VIRTIO_MMIO_STATUS, 0xb),
        (VIRTIO_MMIO_STATUS, 0xf),
    ]
    .iter()
    .flat_map(|&(reg, v)| mmio(reg, v))
    .collect();
    // jmp rel32 back to the start of the body.
    let back = -i32::try_from(body.len() + 5).unwrap();
    [mov_ebx, body, vec![0xe9], back.to_le_bytes().to_vec()].concat()
}

/// The last metrics reply in `output`.
fn last_report(output: &str) -> Option<MetricsReport> {
    output
        .lines()
        .rev()
        .find_map(|l| vmm::logger::parse_metrics_line(l.as_bytes()))
}

#[test]
fn a_flooding_guest_gets_a_bounded_log_and_counted_errors() {
    if skip_without_kvm("a_flooding_guest_gets_a_bounded_log_and_counted_errors") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("guest.bin");
    std::fs::write(&kernel, flooding_guest(vmm::layout::virtio_mmio_base(0))).unwrap();
    let started = Instant::now();
    let mut vm = VmProc::start(VmConfig {
        mem_mib: 64,
        kernel,
        kernel_format: KernelFormat::Raw,
        devices: vec![DeviceConfig::Rng],
        ..VmConfig::default()
    });
    assert!(
        vm.wait_console(Duration::from_secs(60), &[WARNING, "suppressed="]),
        "no rate-limited warning; output:\n{}",
        vm.console()
    );
    std::thread::sleep(Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(30);
    let report = loop {
        vm.send_line(vmm::process::METRICS);
        std::thread::sleep(Duration::from_millis(200));
        if let Some(r) = last_report(&vm.console()) {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "no metrics reply:\n{}",
            vm.console()
        );
    };
    vm.stop();
    vm.wait_timeout(Duration::from_secs(30));
    let elapsed = started.elapsed();
    let output = vm.console();

    let warnings = output.lines().filter(|l| l.contains(WARNING)).count() as u64;
    let budget = vmm::logger::budget(elapsed);
    assert!(
        warnings <= budget,
        "{warnings} warnings in {elapsed:?}, budget {budget}:\n{output}"
    );
    let rng = &report.devices[0];
    assert_eq!(rng.name, "virtio-rng");
    // Every activation with the invalid queue is an error; most of their warnings were
    // dropped.
    assert!(
        rng.rate_limited > 0 && rng.errors > rng.rate_limited,
        "{report:?}, {warnings} warnings"
    );
    assert!(report.log_suppressed >= rng.rate_limited, "{report:?}");
    eprintln!("{warnings} warnings in {elapsed:?} (budget {budget}); {report:?}");
    // Only log records and replies: no line of the log spans two records.
    assert!(
        output
            .lines()
            .all(|l| l.starts_with('\u{1e}') || l.starts_with("20")),
        "{output}"
    );
}
