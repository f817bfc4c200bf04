//! The kvm proof: a self-contained run of the end-to-end suite and the boot/exec benchmarks
//! on the kvm driver only, for a host with hardware virtualization and no Rust toolchain.
//!
//! `ci/kvm-proof.sh pack DIR` lays out a pack (see [`Pack`]); `DIR/run.sh` calls the
//! `vm-kvm-proof` binary, whose [`run`] prints the host facts ([`facts`]), runs `vm drivers`,
//! then (only where kvm can run) the suite and the benchmarks ([`bench`]), and writes
//! `report.json` and `summary.txt` into the output directory. The exit code is the
//! [`Outcome`](report::Outcome)'s: 0 passed, 1 failed, 2 broken pack, 3 this host cannot run
//! kvm — the last is how a host without hardware virtualization (a PVM-native one, like this
//! project's development machines) answers, with the facts that say why.

pub mod bench;
pub mod facts;
pub mod report;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use bench::BenchPlan;
use facts::HostReport;
use report::{CaseResult, Outcome, Report};
use vm_drivers::Registry;

/// The driver the proof is about.
pub const DRIVER: &str = "kvm";

/// The files of a pack, relative to its root.
#[derive(Debug, Clone)]
pub struct Pack {
    pub root: PathBuf,
}

impl Pack {
    /// The `vm` binary.
    pub fn vm(&self) -> PathBuf {
        self.root.join("bin/vm")
    }
    /// The end-to-end suite as one test binary.
    pub fn e2e(&self) -> PathBuf {
        self.root.join("bin/e2e-all")
    }
    /// The image set (what `VM_IMAGES_DIR` points at; `current/` inside).
    pub fn images(&self) -> PathBuf {
        self.root.join("images")
    }

    /// Every file the run needs that is missing.
    pub fn missing(&self) -> Vec<PathBuf> {
        let current = self.images().join("current");
        [
            self.vm(),
            self.e2e(),
            current.join("vmlinux"),
            current.join("bzImage"),
            current.join("initramfs.cpio"),
        ]
        .into_iter()
        .filter(|p| !p.is_file())
        .collect()
    }
}

/// What one invocation is told.
#[derive(Debug, Clone)]
pub struct Args {
    pub pack: Pack,
    pub out: PathBuf,
    pub plan: BenchPlan,
    /// [`DRIVER`] unless `--driver` names another registered one: CI here runs the whole
    /// pipeline on `tcg` (the only driver that runs a guest on this host) so that the runner's
    /// suite and benchmark paths are exercised, not only its "cannot run kvm" answer.
    pub driver: &'static str,
    /// `--only NAME`: run only the suite's tests whose name contains NAME (libtest's filter;
    /// debugging one scenario on a host where the whole suite takes long).
    pub only: Option<String>,
    /// `--carry LOG` (repeatable): the suite's output of an attempt an L1 stall cut off. The
    /// tests it finished `ok` are not run again; their cases count as they were.
    pub carry: Vec<PathBuf>,
    /// `--suite-only`: no benchmarks after the suite.
    pub suite_only: bool,
}

impl Args {
    /// `--pack DIR --out DIR [--quick] [--driver NAME] [--only NAME] [--carry LOG]...
    /// [--suite-only]`; `--quick` measures less (3 boots, 50 execs, 4 at once, 200 keystrokes).
    pub fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
        let (mut pack, mut out, mut plan) = (None, None, BenchPlan::default());
        let mut driver = DRIVER;
        let (mut only, mut carry, mut suite_only) = (None, Vec::new(), false);
        while let Some(a) = it.next() {
            match a.as_str() {
                "--pack" => pack = it.next().map(PathBuf::from),
                "--out" => out = it.next().map(PathBuf::from),
                "--quick" => {
                    plan = BenchPlan {
                        cold_boots: 3,
                        execs: 50,
                        parallel: 4,
                        keystrokes: 200,
                    }
                }
                "--driver" => {
                    let name = it.next().unwrap_or_default();
                    driver = Registry::with_defaults()
                        .get(&name)
                        .map(|d| d.name())
                        .ok_or_else(|| format!("--driver {name:?} is not a registered driver"))?;
                }
                "--only" => {
                    only = Some(it.next().filter(|n| !n.is_empty()).ok_or("--only NAME")?);
                }
                "--carry" => carry.push(it.next().map(PathBuf::from).ok_or("--carry LOG")?),
                "--suite-only" => suite_only = true,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(Args {
            pack: Pack {
                root: pack.ok_or("--pack DIR is required")?,
            },
            out: out.ok_or("--out DIR is required")?,
            plan,
            driver,
            only,
            carry,
            suite_only,
        })
    }
}

/// Runs the proof and returns its exit code (see the module docs).
pub fn run(args: &Args) -> i32 {
    let host = HostReport::gather_from(Path::new("/"));
    for l in host.lines() {
        println!("{l}");
    }
    let mut report = Report {
        outcome: Outcome::Broken,
        exit_code: Outcome::Broken.exit_code(),
        date: now_utc(),
        host,
        driver: args.driver.to_string(),
        drivers: String::new(),
        cases: Vec::new(),
        bench: None,
        notes: Vec::new(),
    };
    let outcome = prove(args, &mut report);
    report.outcome = outcome;
    report.exit_code = outcome.exit_code();
    let summary = report.summary();
    print!("{summary}");
    if let Err(e) = write_report(&args.out, &report, &summary) {
        eprintln!(
            "vm-kvm-proof: cannot write the report to {}: {e}",
            args.out.display()
        );
        return Outcome::Broken.exit_code();
    }
    println!("report: {}", args.out.join("report.json").display());
    report.exit_code
}

fn prove(args: &Args, report: &mut Report) -> Outcome {
    let missing = args.pack.missing();
    if !missing.is_empty() {
        report.notes.extend(
            missing
                .iter()
                .map(|p| format!("the pack lacks {}", p.display())),
        );
        return Outcome::Broken;
    }
    if let Err(e) = fs::create_dir_all(&args.out) {
        report
            .notes
            .push(format!("cannot create {}: {e}", args.out.display()));
        return Outcome::Broken;
    }
    report.drivers = match Command::new(args.pack.vm()).arg("drivers").output() {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("cannot run vm drivers: {e}"),
    };
    print!("$ vm drivers\n{}", report.drivers);
    let available = if args.driver == DRIVER {
        report.host.kvm_ok
    } else {
        let a = Registry::with_defaults()
            .get(args.driver)
            .map(|d| d.detect());
        let ok = a.as_ref().is_some_and(|a| a.ok);
        report.notes.push(format!(
            "run on driver {} (not kvm): {}",
            args.driver,
            a.map_or_else(|| "not registered".into(), |a| a.detail)
        ));
        ok
    };
    if !available {
        return Outcome::HostCannotRunKvm;
    }
    let carried = match carried(args) {
        Ok(c) => c,
        Err(e) => {
            report.notes.push(e);
            return Outcome::Broken;
        }
    };
    if !carried.is_empty() {
        let tests: Vec<&str> = carried.iter().map(|(t, _)| t.as_str()).collect();
        let cases: usize = carried.iter().map(|(_, c)| c.len()).sum();
        let note = format!(
            "carried from an attempt an L1 stall cut off: {} tests ({cases} cases), not run again: {}",
            tests.len(),
            tests.join(" ")
        );
        println!("{note}");
        report.notes.push(note);
    }
    report.cases = match run_suite(args, &carried) {
        Ok(cases) => cases,
        Err(e) => {
            report.notes.push(e);
            return Outcome::Broken;
        }
    };
    // What the suite skipped on this driver, and why, is part of what was (not) proved.
    let skipped = fs::read_to_string(args.out.join("skipped.log")).unwrap_or_default();
    report.notes.extend(
        skipped
            .lines()
            .filter(|l| l.starts_with("SKIP "))
            .filter(|l| l.contains(&format!("[{}]", args.driver)) || !l.contains(" ["))
            .map(|l| format!("skipped: {l}")),
    );
    if args.suite_only {
        return Outcome::from_cases(&report.cases, true);
    }
    println!("benchmarks on {} ...", args.driver);
    let bench = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(bench::run(args.driver, args.plan)),
        Err(e) => {
            report
                .notes
                .push(format!("cannot start a tokio runtime: {e}"));
            return Outcome::Broken;
        }
    };
    let bench_ok = bench.ok();
    report.bench = Some(bench);
    Outcome::from_cases(&report.cases, bench_ok)
}

/// The most of a carried log read: a whole suite's output is a few hundred KiB.
const MAX_CARRIED_LOG: u64 = 16 << 20;

/// The tests the `--carry` logs finished `ok`, each once, with their cases.
fn carried(args: &Args) -> Result<Vec<(String, Vec<CaseResult>)>, String> {
    let mut out: Vec<(String, Vec<CaseResult>)> = Vec::new();
    for log in &args.carry {
        let mut text = String::new();
        fs::File::open(log)
            .and_then(|f| {
                io::Read::read_to_string(&mut io::Read::take(f, MAX_CARRIED_LOG), &mut text)
            })
            .map_err(|e| format!("reading the carried log {}: {e}", log.display()))?;
        for (test, cases) in report::finished_ok(&text, args.driver) {
            if !out.iter().any(|(t, _)| *t == test) {
                out.push((test, cases));
            }
        }
    }
    Ok(out)
}

/// Runs the suite binary on kvm only, its output in `<out>/e2e.log`; the `carried` tests are
/// skipped and their cases come first.
fn run_suite(
    args: &Args,
    carried: &[(String, Vec<CaseResult>)],
) -> Result<Vec<CaseResult>, String> {
    let log_path = args.out.join("e2e.log");
    let log =
        fs::File::create(&log_path).map_err(|e| format!("creating {}: {e}", log_path.display()))?;
    let log2 = log
        .try_clone()
        .map_err(|e| format!("cloning a file handle: {e}"))?;
    println!(
        "end-to-end suite on {} (log: {}) ...",
        args.driver,
        log_path.display()
    );
    let mut suite = Command::new(args.pack.e2e());
    suite
        .args(["--test-threads=1", "--nocapture"])
        .args(args.only.iter());
    // Skips match exactly unless `--only`'s substring filter is in force (libtest's
    // `--exact` applies to both).
    if !carried.is_empty() && args.only.is_none() {
        suite.arg("--exact");
    }
    for (test, _) in carried {
        suite.args(["--skip", test]);
    }
    let status = suite
        .env("VM_TEST_DRIVERS", args.driver)
        .env("VM_TEST_SKIP_LOG", args.out.join("skipped.log"))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .status()
        .map_err(|e| format!("running {}: {e}", args.pack.e2e().display()))?;
    let text = fs::read_to_string(&log_path)
        .map_err(|e| format!("reading {}: {e}", log_path.display()))?;
    let ran = report::parse_cases(&text, args.driver);
    let ran_ok = ran.iter().all(|c| c.passed);
    let mut cases: Vec<CaseResult> = carried.iter().flat_map(|(_, c)| c.clone()).collect();
    cases.extend(ran);
    if !status.success() && ran_ok {
        cases.push(CaseResult {
            name: format!("end-to-end suite ({status})"),
            passed: false,
        });
    }
    Ok(cases)
}

fn write_report(out: &Path, report: &Report, summary: &str) -> io::Result<()> {
    fs::create_dir_all(out)?;
    let json = serde_json::to_string_pretty(report).map_err(io::Error::other)?;
    fs::write(out.join("report.json"), json + "\n")?;
    fs::write(out.join("summary.txt"), summary)
}

fn now_utc() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<Args, String> {
        Args::parse(v.iter().map(|s| s.to_string()))
    }

    #[test]
    fn arguments() {
        let a = args(&["--pack", "/p", "--out", "/o"]).unwrap();
        assert_eq!(
            (a.pack.root.as_path(), a.out.as_path()),
            (Path::new("/p"), Path::new("/o"))
        );
        assert_eq!(a.plan.parallel, 20);
        assert_eq!(
            args(&["--pack", "/p", "--out", "/o", "--quick"])
                .unwrap()
                .plan
                .parallel,
            4
        );
        assert_eq!(
            args(&["--out", "/o"]).unwrap_err(),
            "--pack DIR is required"
        );
        assert_eq!(
            args(&["--pack", "/p"]).unwrap_err(),
            "--out DIR is required"
        );
        assert!(
            args(&["--pack", "/p", "--out", "/o", "-x"])
                .unwrap_err()
                .contains("\"-x\"")
        );
        assert_eq!(a.driver, "kvm");
        let t = args(&["--pack", "/p", "--out", "/o", "--driver", "tcg"]).unwrap();
        assert_eq!(t.driver, "tcg");
        let bad = args(&["--pack", "/p", "--out", "/o", "--driver", "xen"]).unwrap_err();
        assert_eq!(bad, "--driver \"xen\" is not a registered driver");
        let carry = args(&[
            "--pack", "/p", "--out", "/o", "--carry", "/a", "--carry", "/b",
        ]);
        assert_eq!(carry.unwrap().carry, [Path::new("/a"), Path::new("/b")]);
        assert!(args(&["--pack", "/p", "--out", "/o", "--carry"]).is_err());
        assert!(
            args(&["--pack", "/p", "--out", "/o", "--suite-only"])
                .unwrap()
                .suite_only
        );
        let one = args(&["--pack", "/p", "--out", "/o", "--only", "snapshot"]).unwrap();
        assert_eq!(one.only.as_deref(), Some("snapshot"));
        assert!(args(&["--pack", "/p", "--out", "/o", "--only"]).is_err());
    }

    #[test]
    fn an_empty_pack_is_broken_with_every_missing_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let a = Args {
            pack: Pack {
                root: dir.path().join("pack"),
            },
            out: dir.path().join("out"),
            plan: BenchPlan::default(),
            driver: DRIVER,
            only: None,
            carry: Vec::new(),
            suite_only: false,
        };
        assert_eq!(a.pack.missing().len(), 5);
        let code = run(&a);
        assert_eq!(code, Outcome::Broken.exit_code());
        let json = fs::read_to_string(a.out.join("report.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["outcome"], "broken");
        assert_eq!(v["exit_code"], 2);
        assert_eq!(v["notes"].as_array().unwrap().len(), 5);
        let summary = fs::read_to_string(a.out.join("summary.txt")).unwrap();
        assert!(summary.contains("BROKEN"), "{summary}");
    }
}
