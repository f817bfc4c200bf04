//! The proof's verdict: its exit-code contract, the per-case results parsed from the
//! end-to-end suite's output, and the JSON report and human summary written under `$OUT`.

use std::fmt::Write as _;

use serde::Serialize;

use super::bench::BenchReport;
use super::facts::HostReport;

/// How a proof run ended. Each has its own exit code, so a caller (CI, a person, a script
/// on a lent machine) can tell "this host cannot run kvm" from "kvm is broken".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// kvm ran and every case and benchmark passed.
    Passed,
    /// kvm ran and at least one case (or a benchmark's boots) failed.
    Failed,
    /// The pack itself is unusable (missing file, bad arguments): nothing was proved.
    Broken,
    /// This host cannot run the kvm driver (the facts say why): not a failure of `vm`.
    HostCannotRunKvm,
}

impl Outcome {
    /// The process exit code: 0 passed, 1 failed, 2 broken pack / usage, 3 host cannot run kvm.
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Passed => 0,
            Outcome::Failed => 1,
            Outcome::Broken => 2,
            Outcome::HostCannotRunKvm => 3,
        }
    }

    /// Passed unless any case failed or nothing ran at all.
    pub fn from_cases(cases: &[CaseResult], bench_ok: bool) -> Outcome {
        if !cases.is_empty() && bench_ok && cases.iter().all(|c| c.passed) {
            Outcome::Passed
        } else {
            Outcome::Failed
        }
    }
}

/// One case of the end-to-end suite on the kvm driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CaseResult {
    /// `scenario/case`, or `scenario` for a scenario that failed before its cases ran.
    pub name: String,
    pub passed: bool,
}

/// The per-case results in the suite's output: its `  ok   scenario/case [kvm] (..)` and
/// `  FAIL scenario/case [kvm] (..)` lines, plus one failed entry named `scenario` for a
/// `FAIL scenario [kvm] after ..` line with no failed case of its own (a boot failure).
/// Lines for other drivers are ignored.
///
/// The suite runs on one libtest thread with `--nocapture`: libtest writes `test PATH ... `
/// (no newline) as each test starts, so a scenario's first line follows it on the same line;
/// that prefix is read off first and says which test the following lines belong to. A test
/// libtest lists as failed that printed no failure of its own for this driver (a panic
/// before its first case line) is a failed entry named by its path, so every failed
/// scenario is named.
pub fn parse_cases(output: &str, driver: &str) -> Vec<CaseResult> {
    let tag = format!("[{driver}]");
    let mut cases: Vec<CaseResult> = Vec::new();
    let mut failed_scenarios = Vec::new();
    let mut current: Option<&str> = None;
    let mut named_a_failure: Vec<&str> = Vec::new();
    for line in output.lines() {
        let mut t = line.trim_start();
        if let Some((path, rest)) = libtest_start(t) {
            current = Some(path);
            t = rest.trim_start();
        }
        let (passed, rest) = if let Some(r) = t.strip_prefix("ok   ") {
            (true, r)
        } else if let Some(r) = t.strip_prefix("FAIL ") {
            (false, r)
        } else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(d)) = (words.next(), words.next()) else {
            continue;
        };
        if d != tag {
            continue;
        }
        if !passed && let Some(test) = current {
            named_a_failure.push(test);
        }
        if name.contains('/') {
            cases.push(CaseResult {
                name: name.to_string(),
                passed,
            });
        } else if !passed {
            failed_scenarios.push(name.to_string());
        }
    }
    for scenario in failed_scenarios {
        let prefix = format!("{scenario}/");
        if !cases
            .iter()
            .any(|c| !c.passed && c.name.starts_with(&prefix))
        {
            cases.push(CaseResult {
                name: scenario,
                passed: false,
            });
        }
    }
    for test in libtest_failures(output) {
        if !named_a_failure.contains(&test) {
            cases.push(CaseResult {
                name: format!("{test} (failed before naming a case; see e2e.log)"),
                passed: false,
            });
        }
    }
    cases
}

/// The tests that libtest finished `ok` in the suite's output (its `ok` line after the test's
/// own), each with its cases for `driver`: what an attempt that was cut off (an L1 stall)
/// proved before it stopped. A test still running where the output ends, or one that failed,
/// is not among them.
pub fn finished_ok(output: &str, driver: &str) -> Vec<(String, Vec<CaseResult>)> {
    let lines: Vec<&str> = output.lines().collect();
    let mut done = Vec::new();
    let mut current: Option<(&str, usize)> = None;
    for (i, line) in lines.iter().enumerate() {
        if let Some((path, _)) = libtest_start(line.trim_start()) {
            current = Some((path, i));
        } else if line.trim_end() == "FAILED" {
            current = None;
        } else if line.trim_end() == "ok"
            && let Some((path, start)) = current.take()
        {
            let cases = parse_cases(&lines[start..i].join("\n"), driver);
            if cases.iter().all(|c| c.passed) {
                done.push((path.to_string(), cases));
            }
        }
    }
    done
}

/// `test PATH ... REST` → (PATH, REST): the line on which libtest started a test.
fn libtest_start(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix("test ")?;
    let (path, after) = rest.split_once(" ...")?;
    (!path.is_empty() && !path.contains(' ')).then_some((path, after))
}

/// The tests libtest lists as failed: the indented names after its last `failures:` line.
fn libtest_failures(output: &str) -> Vec<&str> {
    let lines: Vec<&str> = output.lines().collect();
    let Some(at) = lines.iter().rposition(|l| l.trim_end() == "failures:") else {
        return Vec::new();
    };
    lines[at + 1..]
        .iter()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.starts_with("    ") && !l.trim().is_empty())
        .map(|l| l.trim())
        .collect()
}

/// Everything one run found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub outcome: Outcome,
    pub exit_code: i32,
    /// UTC, `date -u +%FT%TZ` style.
    pub date: String,
    pub host: HostReport,
    /// The driver the suite and benchmarks ran on (`kvm` unless told otherwise).
    pub driver: String,
    /// What `vm drivers` printed.
    pub drivers: String,
    pub cases: Vec<CaseResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bench: Option<BenchReport>,
    /// Why the run is `broken`, or other notes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Report {
    /// The human summary (`summary.txt`).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "vm kvm proof, {}", self.date);
        for l in self.host.lines() {
            let _ = writeln!(s, "  {l}");
        }
        let passed = self.cases.iter().filter(|c| c.passed).count();
        if !self.cases.is_empty() {
            let _ = writeln!(
                s,
                "end-to-end on {}: {passed}/{} cases passed",
                self.driver,
                self.cases.len()
            );
            for c in self.cases.iter().filter(|c| !c.passed) {
                let _ = writeln!(s, "  FAILED {}", c.name);
            }
        }
        if let Some(b) = &self.bench {
            for l in b.lines() {
                let _ = writeln!(s, "  {l}");
            }
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        let d = &self.driver;
        let verdict = match self.outcome {
            Outcome::Passed => format!("PASSED: the {d} driver runs the whole suite on this host"),
            Outcome::Failed => format!("FAILED: the {d} driver ran but not every case passed"),
            Outcome::Broken => "BROKEN: the proof could not run (see notes)".to_string(),
            Outcome::HostCannotRunKvm => {
                format!("HOST CANNOT RUN {} (not a failure of vm)", d.to_uppercase())
            }
        };
        let _ = writeln!(s, "{verdict}; exit {}", self.exit_code);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct_and_fixed() {
        let codes = [
            Outcome::Passed,
            Outcome::Failed,
            Outcome::Broken,
            Outcome::HostCannotRunKvm,
        ]
        .map(Outcome::exit_code);
        assert_eq!(codes, [0, 1, 2, 3]);
    }

    #[test]
    fn cases_are_read_for_one_driver_only() {
        let out = "\
running 3 tests
boot+agent ready in 0.9 s [kvm]
  ok   boot/agent_answers_as_pid1 [kvm] (0.1 s)
  FAIL boot/uname_is_our_kernel [kvm] (0.2 s): guest runs \"x\"
FAIL boot [kvm] after 1.2 s: uname_is_our_kernel: guest runs \"x\"
  ok   boot/agent_answers_as_pid1 [tcg] (0.1 s)
FAIL exec [tcg] after 1.0 s: boom
SKIP boot [hvf]: Hypervisor.framework requires macOS
FAIL mounts [kvm] after 3.0 s: booting e2e-mounts on kvm: agent not ready
PASS env [kvm] in 2.0 s
test boot_and_kernel ... FAILED
";
        let cases = parse_cases(out, "kvm");
        assert_eq!(
            cases,
            vec![
                CaseResult {
                    name: "boot/agent_answers_as_pid1".into(),
                    passed: true
                },
                CaseResult {
                    name: "boot/uname_is_our_kernel".into(),
                    passed: false
                },
                CaseResult {
                    name: "mounts".into(),
                    passed: false
                },
            ]
        );
    }

    /// The output of an attempt an L1 stall cut off: the tests libtest finished `ok` are
    /// carried with their cases; the failed one and the one still running are not.
    #[test]
    fn an_attempt_cut_off_carries_only_what_finished_ok() {
        let out = "\
running 4 tests
test boot::boot_and_kernel ... boot+agent ready in 0.9 s [kvm]
  ok   boot/agent_answers_as_pid1 [kvm] (0.1 s)
  ok   boot/uname_is_our_kernel [kvm] (0.1 s)
PASS boot [kvm]
ok
test cancel::cancel ... FAIL cancel [kvm] after 3.0 s: boom
FAILED
test env::env ... boot+agent ready in 0.9 s [kvm]
  ok   env/path [kvm] (0.1 s)
PASS env [kvm]
ok
test exec::exec ... boot+agent ready in 0.9 s [kvm]
  ok   exec/true [kvm] (0.1 s)
";
        let carried: Vec<(String, Vec<String>)> = finished_ok(out, "kvm")
            .into_iter()
            .map(|(t, c)| (t, c.into_iter().map(|c| c.name).collect()))
            .collect();
        assert_eq!(
            carried,
            vec![
                (
                    "boot::boot_and_kernel".to_string(),
                    vec![
                        "boot/agent_answers_as_pid1".to_string(),
                        "boot/uname_is_our_kernel".to_string()
                    ]
                ),
                ("env::env".to_string(), vec!["env/path".to_string()]),
            ]
        );
    }

    /// libtest's `test PATH ... ` prefix glues a scenario's first line to it; a test that
    /// panicked before any case line is named from libtest's failure list.
    #[test]
    fn every_failed_scenario_is_named() {
        let out = "\
running 3 tests
test agent_fatal::agent_fatal_error_reaches_the_console_tail ... FAIL agent_fatal_error_reaches_the_console_tail [kvm] after 3.0 s: no console tail
FAILED
test boot::boot_and_kernel ... boot+agent ready in 0.9 s [kvm]
  ok   boot/agent_answers_as_pid1 [kvm] (0.1 s)
PASS boot [kvm]
ok
test rootfs_debian::rootfs_debian ... thread 'rootfs_debian::rootfs_debian' panicked at tests/tests/rootfs_debian.rs:40:5
FAILED

failures:

failures:
    agent_fatal::agent_fatal_error_reaches_the_console_tail
    rootfs_debian::rootfs_debian

test result: FAILED. 1 passed; 2 failed; 0 ignored
";
        let names: Vec<(String, bool)> = parse_cases(out, "kvm")
            .into_iter()
            .map(|c| (c.name, c.passed))
            .collect();
        assert_eq!(
            names,
            vec![
                ("boot/agent_answers_as_pid1".to_string(), true),
                (
                    "agent_fatal_error_reaches_the_console_tail".to_string(),
                    false
                ),
                (
                    "rootfs_debian::rootfs_debian (failed before naming a case; see e2e.log)"
                        .to_string(),
                    false
                ),
            ]
        );
    }

    #[test]
    fn nothing_ran_is_not_a_pass() {
        assert_eq!(Outcome::from_cases(&[], true), Outcome::Failed);
        let ok = vec![CaseResult {
            name: "a/b".into(),
            passed: true,
        }];
        assert_eq!(Outcome::from_cases(&ok, true), Outcome::Passed);
        assert_eq!(Outcome::from_cases(&ok, false), Outcome::Failed);
        let bad = vec![
            ok[0].clone(),
            CaseResult {
                name: "a/c".into(),
                passed: false,
            },
        ];
        assert_eq!(Outcome::from_cases(&bad, true), Outcome::Failed);
    }
}
