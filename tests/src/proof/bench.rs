//! The proof's benchmarks on one driver: cold boot → agent ready, exec round trip in a warm
//! guest, and many guests booted at once. They report figures; only a boot or exec that
//! fails counts against the run (speed targets are read, never asserted).

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::task::JoinSet;

use crate::{GuestSpec, boot, error_chain};

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct BenchPlan {
    /// Sequential cold boots.
    pub cold_boots: usize,
    /// `true` round trips in one warm guest.
    pub execs: usize,
    /// Guests booted at once.
    pub parallel: usize,
}

impl Default for BenchPlan {
    fn default() -> Self {
        BenchPlan {
            cold_boots: 5,
            execs: 200,
            parallel: 20,
        }
    }
}

/// Percentiles of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Millis {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Millis {
    /// Nearest-rank percentiles of `samples` (`None` when empty).
    pub fn of(samples: &[Duration]) -> Option<Millis> {
        if samples.is_empty() {
            return None;
        }
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let rank = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        Some(Millis {
            p50: rank(0.50),
            p99: rank(0.99),
            max: ms[ms.len() - 1],
        })
    }
}

/// What the benchmarks measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchReport {
    pub driver: String,
    /// Call to agent answering, per cold boot.
    pub cold_boot_ms: Option<Millis>,
    /// One `true` exec, call to exit status.
    pub exec_round_trip_ms: Option<Millis>,
    pub parallel_boots: usize,
    pub parallel_ok: usize,
    /// First call to last guest answering its exec.
    pub parallel_wall_ms: Option<f64>,
    /// Every failure, with its cause.
    pub errors: Vec<String>,
}

impl BenchReport {
    /// True when nothing failed.
    pub fn ok(&self) -> bool {
        self.errors.is_empty() && self.parallel_ok == self.parallel_boots
    }

    /// Human lines for the summary.
    pub fn lines(&self) -> Vec<String> {
        let fmt = |m: &Option<Millis>| {
            m.map_or_else(
                || "not measured".to_string(),
                |m| {
                    format!(
                        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                        m.p50, m.p99, m.max
                    )
                },
            )
        };
        let mut v = vec![
            format!(
                "cold boot -> agent ready [{}]: {}",
                self.driver,
                fmt(&self.cold_boot_ms)
            ),
            format!("exec round trip (true): {}", fmt(&self.exec_round_trip_ms)),
            format!(
                "parallel boots: {}/{} ok{}",
                self.parallel_ok,
                self.parallel_boots,
                self.parallel_wall_ms
                    .map_or(String::new(), |w| format!(", all done in {:.0} ms", w))
            ),
        ];
        v.extend(self.errors.iter().map(|e| format!("bench error: {e}")));
        v
    }
}

/// Runs the benchmarks on `driver`.
pub async fn run(driver: &'static str, plan: BenchPlan) -> BenchReport {
    let mut r = BenchReport {
        driver: driver.into(),
        parallel_boots: plan.parallel,
        ..BenchReport::default()
    };
    let mut boots = Vec::new();
    for i in 0..plan.cold_boots {
        let start = Instant::now();
        match boot(driver, &GuestSpec::new(&format!("proof-cold-{i}"))).await {
            Ok(vm) => {
                boots.push(start.elapsed());
                if i == 0 {
                    r.exec_round_trip_ms = exec_round_trips(&vm, plan.execs, &mut r.errors).await;
                }
                vm.close().await;
            }
            Err(e) => r.errors.push(format!("cold boot {i}: {e}")),
        }
    }
    r.cold_boot_ms = Millis::of(&boots);
    let start = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..plan.parallel {
        set.spawn(async move {
            let vm = boot(driver, &GuestSpec::new(&format!("proof-par-{i}"))).await?;
            let out = vm.capture(&["echo", "ok"]).await;
            vm.close().await;
            match out {
                Ok(o) if o.status.success() && o.output == b"ok\n" => Ok(()),
                Ok(o) => Err(format!(
                    "guest {i}: echo gave {:?} {:?}",
                    o.status, o.output
                )),
                Err(e) => Err(format!("guest {i}: {}", error_chain(&e))),
            }
        });
    }
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(())) => r.parallel_ok += 1,
            Ok(Err(e)) => r.errors.push(format!("parallel {e}")),
            Err(e) => r.errors.push(format!("parallel task: {e}")),
        }
    }
    r.parallel_wall_ms = Some(start.elapsed().as_secs_f64() * 1e3);
    r
}

async fn exec_round_trips(
    vm: &vm_sandbox::MicroVm,
    n: usize,
    errors: &mut Vec<String>,
) -> Option<Millis> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        match vm.capture(&["true"]).await {
            Ok(o) if o.status.success() => samples.push(start.elapsed()),
            Ok(o) => {
                errors.push(format!("exec {i}: true exited {:?}", o.status));
                break;
            }
            Err(e) => {
                errors.push(format!("exec {i}: {}", error_chain(&e)));
                break;
            }
        }
    }
    Millis::of(&samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let m = Millis::of(&s).unwrap();
        assert_eq!((m.p50, m.p99, m.max), (50.0, 99.0, 100.0));
        let one = Millis::of(&[Duration::from_millis(7)]).unwrap();
        assert_eq!((one.p50, one.p99, one.max), (7.0, 7.0, 7.0));
        assert!(Millis::of(&[]).is_none());
    }

    #[test]
    fn a_failed_parallel_boot_is_not_ok() {
        let r = BenchReport {
            parallel_boots: 20,
            parallel_ok: 19,
            ..BenchReport::default()
        };
        assert!(!r.ok());
        let r = BenchReport {
            parallel_boots: 20,
            parallel_ok: 20,
            ..BenchReport::default()
        };
        assert!(r.ok());
    }
}
