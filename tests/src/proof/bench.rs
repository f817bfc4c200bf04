//! The proof's benchmarks on one driver: cold boot → agent ready, exec round trip in a warm
//! guest, many guests booted at once, and (on a driver with snapshots) restore → agent ready
//! against the cold boot, each start followed by one `true` exec as `vm exec --from NAME --
//! true` and `vm exec -- true` do. They report figures; only a boot, restore or exec that
//! fails counts against the run (speed targets are read, never asserted).

use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::task::JoinSet;

use vm_drivers::Registry;

use crate::{GuestSpec, boot, error_chain, options_for, spec_for};

/// How much to measure.
#[derive(Debug, Clone, Copy)]
pub struct BenchPlan {
    /// Sequential cold boots.
    pub cold_boots: usize,
    /// `true` round trips in one warm guest.
    pub execs: usize,
    /// Guests booted at once.
    pub parallel: usize,
    /// Bytes typed through a guest terminal (`vm exec -t`), one echo timed per byte.
    pub keystrokes: usize,
}

impl Default for BenchPlan {
    fn default() -> Self {
        BenchPlan {
            cold_boots: 5,
            execs: 200,
            parallel: 20,
            keystrokes: 1000,
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
    /// Call to the restored, re-keyed agent answering, then one `true` exec, per restore of
    /// one snapshot (as many restores as cold boots).
    pub restore_ms: Option<Millis>,
    /// Cold boot + one `true` exec, per cold boot: what `restore_ms` is compared with.
    pub cold_exec_ms: Option<Millis>,
    /// Why restores were not measured (a driver without snapshots).
    pub restore_skipped: Option<String>,
    /// One `true` exec, call to exit status.
    pub exec_round_trip_ms: Option<Millis>,
    /// One byte typed into a raw guest terminal to its echo (warm guest).
    pub keystroke_echo_ms: Option<Millis>,
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
            self.restore_line(fmt(&self.restore_ms)),
            format!("keystroke echo (-t): {}", fmt(&self.keystroke_echo_ms)),
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

    /// `restore+exec vs boot+exec`: both p50s and their ratio, or why restores were skipped.
    fn restore_line(&self, restore: String) -> String {
        if let Some(why) = &self.restore_skipped {
            return format!("restore -> agent ready + exec true: not measured ({why})");
        }
        let ratio = match (self.restore_ms, self.cold_exec_ms) {
            (Some(r), Some(c)) if r.p50 > 0.0 => {
                format!(
                    "; cold boot + exec true p50 {:.1} ms: {:.2}x",
                    c.p50,
                    c.p50 / r.p50
                )
            }
            _ => String::new(),
        };
        format!("restore -> agent ready + exec true: {restore}{ratio}")
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
    let mut boot_execs = Vec::new();
    for i in 0..plan.cold_boots {
        let start = Instant::now();
        match boot(driver, &GuestSpec::new(&format!("proof-cold-{i}"))).await {
            Ok(vm) => {
                boots.push(start.elapsed());
                match vm.capture(&["true"]).await {
                    Ok(o) if o.status.success() => boot_execs.push(start.elapsed()),
                    Ok(o) => r
                        .errors
                        .push(format!("cold boot {i}: true exited {:?}", o.status)),
                    Err(e) => r
                        .errors
                        .push(format!("cold boot {i}: exec: {}", error_chain(&e))),
                }
                if i == 0 {
                    r.exec_round_trip_ms = exec_round_trips(&vm, plan.execs, &mut r.errors).await;
                    match crate::interactive::keystroke_echoes(&vm, plan.keystrokes).await {
                        Ok(s) => r.keystroke_echo_ms = Millis::of(&s),
                        Err(e) => r.errors.push(format!("keystroke echo: {e}")),
                    }
                }
                vm.close().await;
            }
            Err(e) => r.errors.push(format!("cold boot {i}: {e}")),
        }
    }
    r.cold_boot_ms = Millis::of(&boots);
    r.cold_exec_ms = Millis::of(&boot_execs);
    restores(driver, plan.cold_boots, &mut r).await;
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

/// `n` restores of one snapshot of a booted guest, each timed from the call to its first
/// `true` exec answering (the driver's snapshot support decides; its reason is reported).
async fn restores(driver: &'static str, n: usize, r: &mut BenchReport) {
    let can = Registry::with_defaults().get(driver).map(|d| d.snapshots());
    match can {
        Some(c) if c.ok => {}
        Some(c) => {
            r.restore_skipped = Some(c.detail);
            return;
        }
        None => {
            r.restore_skipped = Some(format!("no driver {driver}"));
            return;
        }
    }
    let tmp = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => return r.errors.push(format!("restore: temp dir: {e}")),
    };
    let mut g = GuestSpec::new("proof-snapshot");
    g.run_dir_parent = Some(tmp.path().join("run"));
    let mut options = options_for(driver, &g);
    options.snapshots = Some(tmp.path().join("snapshots"));
    let snap = tmp.path().join("snapshots").join("bench");
    let saved = async {
        let vm = vm_sandbox::MicroVm::boot(spec_for(&g)?, options)
            .await
            .map_err(|e| format!("booting for a snapshot: {}", error_chain(&e)))?;
        let done = vm.snapshot(&snap).await;
        vm.close().await;
        done.map_err(|e| format!("snapshot: {}", error_chain(&e)))
    };
    if let Err(e) = saved.await {
        return r.errors.push(format!("restore: {e}"));
    }
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        let vm = match vm_sandbox::MicroVm::restore(snap.clone(), options_for(driver, &g)).await {
            Ok(vm) => vm,
            Err(e) => {
                r.errors.push(format!("restore {i}: {}", error_chain(&e)));
                break;
            }
        };
        let out = vm.capture(&["true"]).await;
        let took = start.elapsed();
        vm.close().await;
        match out {
            Ok(o) if o.status.success() => samples.push(took),
            Ok(o) => r
                .errors
                .push(format!("restore {i}: true exited {:?}", o.status)),
            Err(e) => r
                .errors
                .push(format!("restore {i}: exec: {}", error_chain(&e))),
        }
    }
    r.restore_ms = Millis::of(&samples);
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

    #[test]
    fn the_restore_line_gives_the_ratio_or_why_it_was_skipped() {
        let ms = |p50| {
            Some(Millis {
                p50,
                p99: p50,
                max: p50,
            })
        };
        let r = BenchReport {
            restore_ms: ms(50.0),
            cold_exec_ms: ms(1000.0),
            ..BenchReport::default()
        };
        let line = r
            .lines()
            .into_iter()
            .find(|l| l.starts_with("restore"))
            .unwrap();
        assert!(line.contains("p50 50.0 ms"), "{line}");
        assert!(
            line.ends_with("cold boot + exec true p50 1000.0 ms: 20.00x"),
            "{line}"
        );
        let r = BenchReport {
            restore_skipped: Some("tcg: no snapshots".into()),
            ..BenchReport::default()
        };
        assert!(r.lines().contains(
            &"restore -> agent ready + exec true: not measured (tcg: no snapshots)".to_string()
        ));
    }
}
