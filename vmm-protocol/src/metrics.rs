//! The device counters `vm-vmm` reports on request (the `metrics` control line): one
//! bounded reply line on its stderr, which the launcher takes out of the log.

use serde::{Deserialize, Serialize};

use crate::layout::{MAX_GSI, VIRTIO_GSI_BASE};

/// The most devices one report lists: every device a VM can have (one per virtio GSI).
pub const MAX_REPORTED_DEVICES: usize = (MAX_GSI - VIRTIO_GSI_BASE + 1) as usize;

/// The longest device name reported (bytes; with [`MAX_REPORTED_DEVICES`], a report stays
/// within one atomic pipe write).
pub const MAX_NAME: usize = 40;

/// The start of a metrics reply line on the log stream (a control byte the VMM's log
/// escapes in every record, so no log line can look like a reply).
pub const METRICS_PREFIX: &[u8] = b"\x1emetrics ";

/// One device's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// `virtio-blk:<serial>`, `virtio-vsock`, `virtio-rng`, `virtio-fs:<tag>`.
    pub name: String,
    /// Requests (descriptor chains, vsock packets) served.
    pub requests: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Errors: malformed guest input, failed host I/O.
    pub errors: u64,
    /// Log lines about this device the rate limiter dropped.
    pub rate_limited: u64,
}

/// What `vm-vmm` reports about its devices.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsReport {
    /// One entry per device, at most [`MAX_REPORTED_DEVICES`].
    pub devices: Vec<DeviceSnapshot>,
    /// Log lines dropped by every limiter of the process (devices and the rest).
    pub log_suppressed: u64,
}

/// The reply line for `report`: [`METRICS_PREFIX`], one JSON object, a newline.
pub fn metrics_line(report: &MetricsReport) -> Vec<u8> {
    let mut line = METRICS_PREFIX.to_vec();
    // Serializing plain numbers and strings cannot fail; an empty object stands in if it did.
    if serde_json::to_writer(&mut line, report).is_err() {
        line.truncate(METRICS_PREFIX.len());
        line.extend_from_slice(b"{}");
    }
    line.push(b'\n');
    line
}

/// The report in a reply line (with or without its newline); `None` for any other line.
pub fn parse_metrics_line(line: &[u8]) -> Option<MetricsReport> {
    let json = line.strip_prefix(METRICS_PREFIX)?;
    serde_json::from_slice(json.strip_suffix(b"\n").unwrap_or(json)).ok()
}
