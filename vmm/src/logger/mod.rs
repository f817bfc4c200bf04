//! The VMM's log: `tracing` events as one line each on stderr, never a crash over it.
//!
//! [`init`] installs the process's subscriber (level `INFO` and up, no colours, UTC
//! timestamps, thread names) writing through [`writer::RecordWriter`]: one sanitized, bounded
//! record per event, write errors ignored. It also routes panics into the log and ignores
//! `SIGXFSZ`, so a log on a regular file under the jail's `RLIMIT_FSIZE` of 0 fails its writes
//! (`EFBIG`) instead of killing the process. Nothing in `vm-vmm` uses the std print macros,
//! which panic when stderr is unwritable.
//!
//! Every line a guest can trigger goes through one limiter ([`rate_limited`]).
//!
//! The same stream carries the VMM's replies to the `metrics` control command: one line
//! starting with [`METRICS_PREFIX`] (a control byte that [`writer::sanitize`] escapes in
//! every log record, so no log line can look like a reply). The launcher takes those lines
//! out of the log ([`parse_metrics_line`]).

pub mod rate_limited;
pub mod writer;

use std::io;

pub use rate_limited::{RateLimit, budget, suppressed_total};

use crate::metrics::MetricsReport;
pub use vm_vmm_protocol::metrics::{METRICS_PREFIX, metrics_line, parse_metrics_line};

/// Installs the log on stderr for this process (once; later calls change nothing).
pub fn init() {
    // Without this, a write past RLIMIT_FSIZE kills the process with SIGXFSZ; ignored, it
    // fails with EFBIG, which the writer drops. Failing to ignore it only keeps the default.
    let _ = crate::sys::ignore_file_size_signal();
    install(|| writer::RecordWriter::new(io::stderr()));
}

/// Installs the VMM's log format for this process, each event written by one writer from
/// `make` (production: a [`writer::RecordWriter`] on stderr; tests: on a buffer). Returns
/// false when the process already had a subscriber (which stays).
pub fn install<W, F>(make: F) -> bool
where
    W: io::Write,
    F: Fn() -> W + Send + Sync + 'static,
{
    let subscriber = tracing_subscriber::fmt()
        .with_writer(make)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_thread_names(true)
        .finish();
    let installed = tracing::subscriber::set_global_default(subscriber).is_ok();
    if installed {
        std::panic::set_hook(Box::new(|info| {
            tracing::error!(target: "panic", "{info}");
        }));
    }
    installed
}

/// Sends `report` on stderr as one reply line (errors ignored, as for every log write).
pub fn write_metrics(report: &MetricsReport) {
    writer::write_raw_stderr(&metrics_line(report));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reply_lines_parse_as_metrics() {
        let report = MetricsReport {
            devices: vec![],
            log_suppressed: 7,
        };
        let line = metrics_line(&report);
        assert_eq!(parse_metrics_line(&line), Some(report.clone()));
        assert_eq!(parse_metrics_line(line.trim_ascii_end()), Some(report));
        assert_eq!(
            parse_metrics_line(b"2026-12-01T00:00:00Z WARN x: y\n"),
            None
        );
        assert_eq!(parse_metrics_line(b"\x1emetrics {not json}\n"), None);
        // A log record carrying the prefix comes out escaped, never as a reply.
        let forged = writer::sanitize(&line);
        assert_eq!(parse_metrics_line(&forged), None);
    }
}
