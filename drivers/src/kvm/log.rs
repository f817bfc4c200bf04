//! The `vm-vmm` log, kept apart from the guest console: its stderr, read line by line into
//! the run directory's [`VMM_LOG`] (at most [`VMM_LOG_MAX_BYTES`], then one line saying so
//! and nothing more, so a guest that makes the VMM log cannot fill the host disk) and a
//! bounded in-memory tail; the VMM's replies to the `metrics` control command
//! (`vm_vmm_protocol::metrics::METRICS_PREFIX` lines) are taken out of the stream and kept as the latest
//! [`MetricsReport`], and so are its replies to `snapshot` (`SNAPSHOT_PREFIX` lines, the
//! latest [`SnapshotReply`]).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use vm_sync::{Lock, Wait};
use vm_vmm_protocol::MetricsReport;
use vm_vmm_protocol::metrics::parse_metrics_line;
use vm_vmm_protocol::snapshot::{SnapshotReply, parse_reply_line};

use crate::ring::SharedRing;

/// The log file in the run directory.
pub(crate) const VMM_LOG: &str = "vmm.log";
/// The most bytes of log lines [`VMM_LOG`] takes.
pub(crate) const VMM_LOG_MAX_BYTES: u64 = 4 << 20;
/// The log tail kept in memory (for errors and `vm logs --vmm`).
const TAIL_BYTES: usize = 64 * 1024;
/// The longest line read at once (a VMM record is at most 2 KiB; longer text is split).
const MAX_LINE: u64 = 8 * 1024;

/// A file that takes lines until `cap` bytes, then one notice, then nothing.
#[derive(Debug)]
pub(crate) struct CappedFile<W: Write> {
    out: W,
    written: u64,
    cap: u64,
    full: bool,
}

impl<W: Write> CappedFile<W> {
    pub(crate) fn new(out: W, cap: u64) -> Self {
        CappedFile {
            out,
            written: 0,
            cap,
            full: false,
        }
    }

    /// Appends `line` if it fits under the cap; the first line that does not is replaced by
    /// the notice. Write errors are ignored (the tail in memory still has the line).
    pub(crate) fn push(&mut self, line: &[u8]) {
        if self.full {
            return;
        }
        if self.written + line.len() as u64 > self.cap {
            self.full = true;
            let notice = format!(
                "vm: {VMM_LOG} reached its cap of {} bytes; later lines are not kept here\n",
                self.cap
            );
            let _ = self.out.write_all(notice.as_bytes());
            return;
        }
        if self.out.write_all(line).is_ok() {
            self.written += line.len() as u64;
        }
    }
}

#[derive(Debug, Default)]
struct Latest {
    /// Replies seen so far.
    seq: u64,
    report: Option<MetricsReport>,
    /// Snapshot replies seen so far.
    snapshot_seq: u64,
    snapshot: Option<SnapshotReply>,
}

/// The reader side of a VMM's log stream.
#[derive(Debug, Clone)]
pub(crate) struct VmmLog {
    tail: SharedRing,
    latest: Arc<(Mutex<Latest>, Condvar)>,
}

impl VmmLog {
    /// Starts a thread that reads `src` to its end: metrics replies to the latest report,
    /// every other line to `file` and the tail.
    pub(crate) fn start(
        src: impl Read + Send + 'static,
        file: impl Write + Send + 'static,
    ) -> Self {
        let log = VmmLog {
            tail: SharedRing::new(TAIL_BYTES),
            latest: Arc::default(),
        };
        let reader = log.clone();
        let tail = log.tail.writer();
        let mut file = CappedFile::new(file, VMM_LOG_MAX_BYTES);
        let spawned = std::thread::Builder::new()
            .name("vm-vmm-log".into())
            .spawn(move || {
                let mut src = BufReader::new(src);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match src.by_ref().take(MAX_LINE).read_until(b'\n', &mut line) {
                        Ok(0) => break,
                        Ok(_) => {
                            if let Some(report) = parse_metrics_line(&line) {
                                reader.store(report);
                            } else if let Some(reply) = parse_reply_line(&line) {
                                reader.store_snapshot(reply);
                            } else {
                                file.push(&line);
                                tail.push(&line);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the vm-vmm log reader; its log is dropped");
        }
        log
    }

    /// Opens `path` (created, truncated) and [`Self::start`]s on it.
    pub(crate) fn to_file(
        src: impl Read + Send + 'static,
        path: &std::path::Path,
    ) -> io::Result<Self> {
        Ok(Self::start(src, File::create(path)?))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Latest> {
        self.latest.0.locked()
    }

    fn store(&self, report: MetricsReport) {
        let mut l = self.lock();
        l.seq += 1;
        l.report = Some(report);
        self.latest.1.notify_all();
    }

    fn store_snapshot(&self, reply: SnapshotReply) {
        let mut l = self.lock();
        l.snapshot_seq += 1;
        l.snapshot = Some(reply);
        self.latest.1.notify_all();
    }

    /// How many snapshot replies have arrived.
    pub(crate) fn snapshot_replies(&self) -> u64 {
        self.lock().snapshot_seq
    }

    /// The first snapshot reply newer than number `seen`, waiting at most `timeout`.
    pub(crate) fn snapshot_after(&self, seen: u64, timeout: Duration) -> Option<SnapshotReply> {
        self.newer_than(seen, timeout, |l| (l.snapshot_seq, l.snapshot.clone()))
    }

    /// Waits at most `timeout` until the counter `pick` reads passes `seen`, then its value.
    fn newer_than<T>(
        &self,
        seen: u64,
        timeout: Duration,
        pick: impl Fn(&Latest) -> (u64, Option<T>),
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        let mut l = self.lock();
        while pick(&l).0 <= seen {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            l = self.latest.1.wait_timeout_locked(l, left);
        }
        pick(&l).1
    }

    /// How many metrics replies have arrived.
    pub(crate) fn replies(&self) -> u64 {
        self.lock().seq
    }

    /// The first report newer than reply number `seen`, waiting at most `timeout`.
    pub(crate) fn report_after(&self, seen: u64, timeout: Duration) -> Option<MetricsReport> {
        self.newer_than(seen, timeout, |l| (l.seq, l.report.clone()))
    }

    /// The log's tail (bounded); once the VMM has exited, waits briefly for its last lines.
    pub(crate) fn tail(&self, exited: bool) -> String {
        if exited {
            self.tail.wait_writers_done(Duration::from_secs(1));
        }
        self.tail.tail_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_test_support::capture::Captured;
    use vm_vmm_protocol::DeviceSnapshot;

    #[test]
    fn the_file_stops_at_its_cap_and_says_so() {
        let mut f = CappedFile::new(Vec::new(), 10);
        f.push(b"12345\n");
        f.push(b"abcd\n");
        f.push(b"x\n");
        f.push(b"y\n");
        let text = String::from_utf8(f.out).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("12345"));
        assert!(
            lines
                .next()
                .unwrap()
                .contains("reached its cap of 10 bytes")
        );
        assert_eq!(lines.next(), None);
    }

    #[test]
    fn metrics_replies_are_taken_out_of_the_log() {
        let report = MetricsReport {
            devices: vec![DeviceSnapshot {
                name: "virtio-rng".into(),
                requests: 1,
                bytes: 64,
                errors: 0,
                rate_limited: 0,
            }],
            log_suppressed: 0,
        };
        let mut stream = b"2026-12-01T00:00:00Z  WARN vmm: one\n".to_vec();
        stream.extend(vm_vmm_protocol::metrics::metrics_line(&report));
        stream.extend_from_slice(b"2026-12-01T00:00:01Z  INFO vmm: exit Ended\n");
        let file = Captured::default();
        let log = VmmLog::start(io::Cursor::new(stream), file.clone());
        assert_eq!(log.report_after(0, Duration::from_secs(5)), Some(report));
        assert_eq!(log.replies(), 1);
        assert_eq!(log.report_after(1, Duration::from_millis(20)), None);
        let tail = log.tail(true);
        assert_eq!(tail.lines().count(), 2, "{tail:?}");
        assert!(!tail.contains("metrics"), "{tail:?}");
        assert_eq!(file.text(), tail);
    }

    #[test]
    fn snapshot_replies_are_taken_out_of_the_log() {
        let reply = SnapshotReply {
            ok: true,
            state_bytes: 4096,
            ..SnapshotReply::default()
        };
        let mut stream = b"2026-12-02T00:00:00Z  INFO vmm: paused\n".to_vec();
        stream.extend(vm_vmm_protocol::snapshot::reply_line(&reply));
        let file = Captured::default();
        let log = VmmLog::start(io::Cursor::new(stream), file.clone());
        assert_eq!(log.snapshot_after(0, Duration::from_secs(5)), Some(reply));
        assert_eq!((log.snapshot_replies(), log.replies()), (1, 0));
        assert_eq!(log.snapshot_after(1, Duration::from_millis(20)), None);
        let tail = log.tail(true);
        assert!(!tail.contains("snapshot"), "{tail:?}");
        assert_eq!(tail.lines().count(), 1, "{tail:?}");
    }
}
