//! The one limiter of every log line a guest can trigger (as Firecracker's
//! `logger/rate_limited.rs`): a token bucket per call site.
//!
//! Each [`warn_limited!`](crate::warn_limited) / [`error_limited!`](crate::error_limited) call
//! site owns a static [`RateLimit`]: [`BURST`] lines at once, then one more per [`REFILL`].
//! A line over budget is dropped and counted (in the process-wide [`suppressed_total`] and,
//! when the site names one, in its device's [`DeviceMetrics`](crate::metrics::DeviceMetrics));
//! the next line the site logs carries `suppressed=N`, how many were dropped before it. So a
//! guest flooding a device costs at most [`budget`] lines per call site, never a full disk or
//! a busy logger.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vm_sync::Lock;

/// Lines a call site may log at once.
pub const BURST: u32 = 10;
/// After the burst, one more line per this interval.
pub const REFILL: Duration = Duration::from_millis(500);

/// Every line dropped by any limiter in this process.
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// How many lines the limiters of this process have dropped.
pub fn suppressed_total() -> u64 {
    SUPPRESSED.load(Ordering::Relaxed)
}

/// The most lines one call site logs over `window`: the burst plus one per refill.
pub fn budget(window: Duration) -> u64 {
    u64::from(BURST) + (window.as_nanos() / REFILL.as_nanos()) as u64
}

#[derive(Debug)]
struct Bucket {
    tokens: u32,
    /// When the last token was added (`None`: the bucket was never used, so it is full).
    refilled: Option<Instant>,
    /// Lines dropped since the last one logged.
    suppressed: u64,
}

/// One call site's token bucket.
#[derive(Debug)]
pub struct RateLimit {
    bucket: Mutex<Bucket>,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimit {
    /// A full bucket (usable in a `static`).
    pub const fn new() -> Self {
        RateLimit {
            bucket: Mutex::new(Bucket {
                tokens: BURST,
                refilled: None,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may be logged now: `Some(n)`, with `n` the lines dropped since the
    /// previous one logged, or `None` (dropped and counted).
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`Self::admit`] at time `now`.
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut b = self.bucket.locked();
        let since = *b.refilled.get_or_insert(now);
        let earned = now.saturating_duration_since(since).as_nanos() / REFILL.as_nanos();
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            b.tokens = b.tokens.saturating_add(earned).min(BURST);
            b.refilled = Some(since + REFILL * earned.min(BURST));
            if b.tokens == BURST {
                b.refilled = Some(now);
            }
        }
        if b.tokens == 0 {
            b.suppressed += 1;
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        b.tokens -= 1;
        Some(std::mem::take(&mut b.suppressed))
    }
}

/// Logs at `tracing::Level::$level` (`WARN`, `DEBUG`, ...) through the call site's own
/// [`RateLimit`]; a dropped line is counted in `$metrics` (an `Option<&DeviceMetrics>`). A
/// level the subscriber does not record costs one check: no token, no lock, no count.
#[macro_export]
macro_rules! log_limited {
    ($level:ident, $metrics:expr, $($arg:tt)+) => {{
        if ::tracing::enabled!(::tracing::Level::$level) {
            static LIMIT: $crate::logger::RateLimit = $crate::logger::RateLimit::new();
            match LIMIT.admit() {
                Some(0) => ::tracing::event!(::tracing::Level::$level, $($arg)+),
                Some(suppressed) => {
                    ::tracing::event!(::tracing::Level::$level, suppressed, $($arg)+)
                }
                None => $crate::metrics::DeviceMetrics::count_log_drop($metrics),
            }
        }
    }};
}

/// `tracing::warn!` for a line a guest can trigger: rate-limited per call site. The first
/// argument is the device's `Option<&DeviceMetrics>` (its `rate_limited` counter).
#[macro_export]
macro_rules! warn_limited {
    ($metrics:expr, $($arg:tt)+) => { $crate::log_limited!(WARN, $metrics, $($arg)+) };
}

/// `tracing::error!` for a line a guest can trigger: rate-limited per call site, as
/// [`warn_limited!`](crate::warn_limited).
#[macro_export]
macro_rules! error_limited {
    ($metrics:expr, $($arg:tt)+) => { $crate::log_limited!(ERROR, $metrics, $($arg)+) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_refill_and_the_drops_are_reported() {
        let l = RateLimit::new();
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert_eq!(l.admit_at(t0), Some(0));
        }
        let before = suppressed_total();
        for _ in 0..1000 {
            assert_eq!(l.admit_at(t0), None);
        }
        assert!(suppressed_total() >= before + 1000);
        assert_eq!(l.admit_at(t0 + REFILL / 2), None);
        assert_eq!(l.admit_at(t0 + REFILL), Some(1001));
        assert_eq!(l.admit_at(t0 + REFILL), None);
        assert_eq!(l.admit_at(t0 + REFILL * 2), Some(1));
        // A long quiet spell refills to the burst, never beyond.
        let later = t0 + REFILL * 1000;
        let admitted = (0..100).filter(|_| l.admit_at(later).is_some()).count();
        assert_eq!(admitted, BURST as usize);
    }

    #[test]
    fn admitted_lines_never_exceed_the_budget() {
        let l = RateLimit::new();
        let t0 = Instant::now();
        let step = Duration::from_millis(3);
        let mut admitted = 0u64;
        let mut t = t0;
        while t < t0 + Duration::from_secs(7) {
            admitted += u64::from(l.admit_at(t).is_some());
            t += step;
        }
        assert_eq!(admitted, budget(t - t0 - step), "{admitted}");
    }
}
