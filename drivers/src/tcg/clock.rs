//! The host's TSC rate, which a TCG guest's TSC runs at: QEMU's TCG reads the host's counter
//! for the guest's `rdtsc` (not under `icount`, which we never use). Told to a distribution
//! kernel as `tsc_early_khz` (see [`super::args::ACPI_TIMER_CMDLINE`]).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the measurement counts: 20 ms gives the rate to well under 0.1 % (the kernel's own
/// watchdog then judges the clock, as on any machine).
const WINDOW: Duration = Duration::from_millis(20);

/// The host's TSC rate in kHz, measured once per process against the monotonic clock; `None`
/// off x86-64 or when the counter does not advance.
pub(super) fn host_tsc_khz() -> Option<u64> {
    static KHZ: OnceLock<Option<u64>> = OnceLock::new();
    *KHZ.get_or_init(measure)
}

#[cfg(target_arch = "x86_64")]
fn measure() -> Option<u64> {
    let read = || {
        // SAFETY: `rdtsc` reads a counter; it touches no memory and every x86-64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }
    };
    let (t0, c0) = (Instant::now(), read());
    std::thread::sleep(WINDOW);
    let (t1, c1) = (Instant::now(), read());
    let nanos = t1.duration_since(t0).as_nanos();
    let cycles = u128::from(c1.checked_sub(c0)?);
    let khz = cycles.checked_mul(1_000_000)? / nanos.max(1);
    u64::try_from(khz).ok().filter(|&k| k > 0)
}

#[cfg(not(target_arch = "x86_64"))]
fn measure() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_host_tsc_rate_is_a_plausible_cpu_clock() {
        let khz = super::host_tsc_khz().expect("an x86-64 TSC advances");
        // 100 MHz .. 10 GHz: any x86-64 machine's counter.
        assert!((100_000..10_000_000).contains(&khz), "{khz} kHz");
        assert_eq!(super::host_tsc_khz(), Some(khz), "measured once");
    }
}
