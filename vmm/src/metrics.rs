//! Per-device event counters: requests served, bytes moved, errors (malformed guest input,
//! failed host I/O) and log lines the rate limiter dropped.
//!
//! Each virtio device owns one [`DeviceMetrics`] (shared by its transport and its worker
//! thread; plain relaxed atomics, nothing allocates on the hot path). The VM collects them
//! into a [`MetricsReport`] ([`report`]), which `vm-vmm` sends its launcher on request (the
//! `metrics` control command, [`crate::process`]) as one bounded line.

use std::sync::atomic::{AtomicU64, Ordering};

pub use vm_vmm_protocol::metrics::{DeviceSnapshot, MAX_NAME, MAX_REPORTED_DEVICES, MetricsReport};

/// One device's counters.
#[derive(Debug)]
pub struct DeviceMetrics {
    name: String,
    requests: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    rate_limited: AtomicU64,
}

impl DeviceMetrics {
    /// Zeroed counters for the device `name` (cut to [`MAX_NAME`] bytes).
    pub fn new(name: &str) -> Self {
        let mut end = name.len().min(MAX_NAME);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        DeviceMetrics {
            name: name[..end].to_string(),
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
        }
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One request served, moving `bytes` bytes (guest to host or host to guest).
    pub fn request(&self, bytes: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes moved outside a request (a vsock stream's payload).
    pub fn bytes(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// One error: invalid guest input or a failed host operation.
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one log line the rate limiter dropped, against `metrics` when there is one
    /// (the process-wide count is the limiter's own).
    pub fn count_log_drop(metrics: Option<&DeviceMetrics>) {
        if let Some(m) = metrics {
            m.rate_limited.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> DeviceSnapshot {
        DeviceSnapshot {
            name: self.name.clone(),
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            rate_limited: self.rate_limited.load(Ordering::Relaxed),
        }
    }
}

/// The report over `devices` (the first [`MAX_REPORTED_DEVICES`]) and this process's
/// dropped log lines.
pub fn report<'a>(devices: impl IntoIterator<Item = &'a DeviceMetrics>) -> MetricsReport {
    MetricsReport {
        devices: devices
            .into_iter()
            .take(MAX_REPORTED_DEVICES)
            .map(DeviceMetrics::snapshot)
            .collect(),
        log_suppressed: crate::logger::suppressed_total(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_up_and_names_are_bounded() {
        let m = DeviceMetrics::new("virtio-blk:disk0");
        m.request(512);
        m.request(4096);
        m.bytes(10);
        m.error();
        DeviceMetrics::count_log_drop(Some(&m));
        DeviceMetrics::count_log_drop(None);
        assert_eq!(
            m.snapshot(),
            DeviceSnapshot {
                name: "virtio-blk:disk0".into(),
                requests: 2,
                bytes: 4618,
                errors: 1,
                rate_limited: 1,
            }
        );
        let long = "é".repeat(100);
        assert!(DeviceMetrics::new(&long).name().len() <= MAX_NAME);
    }

    #[test]
    fn the_largest_report_fits_one_atomic_pipe_write() {
        let all: Vec<_> = (0..100)
            .map(|_| {
                let m = DeviceMetrics::new(&"n".repeat(1000));
                for c in [&m.requests, &m.bytes, &m.errors, &m.rate_limited] {
                    c.store(u64::MAX, Ordering::Relaxed);
                }
                m
            })
            .collect();
        let report = report(&all);
        assert_eq!(report.devices.len(), MAX_REPORTED_DEVICES);
        let line = crate::logger::metrics_line(&report);
        assert!(line.len() <= 4096, "{}", line.len());
        assert_eq!(crate::logger::parse_metrics_line(&line), Some(report));
    }
}
