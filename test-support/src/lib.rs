//! Shared by the workspace's tests: the one way a test that cannot run on this host says so,
//! and the one rule for tests that boot a guest on whatever driver the host has.
//!
//! # Skips
//! A skipped test prints `SKIP <test>: <reason>` to stderr and appends the same line to the file
//! named by `VM_TEST_SKIP_LOG` (set by `ci/test.sh`, which lists those lines and counts them in
//! its `N passed, N failed, N skipped` summary). A skip is never a pass in disguise: the reason
//! is always visible, and `ci/test.sh` counts a skipped test as skipped only, not also as the
//! pass libtest reports for it. Skip only for a fact about the host, never for the failure
//! under test.
//!
//! # Tests that boot "on whatever driver is available"
//! When no driver can boot a guest here (none detected, or the guest images are missing), such
//! a test **fails** ([`no_guest_driver`], [`DriverRuns::finish`]), unless the environment says
//! `VM_TEST_ALLOW_NO_DRIVER=1`: the explicit, visible opt-out for a host that truly has none
//! (CI never sets it). With the opt-out the test is skipped, with its reason.
//!
//! # Tests counted per driver
//! A test that runs once per registered driver (the end-to-end scenarios) counts one unit per
//! driver: `boot [tcg]` passes, `boot [kvm]` is skipped. [`DriverRuns`] writes a
//! `SKIP <test> [<driver>]: <reason>` line per skipped driver and, when the test ends, one
//! `UNITS <test>: P passed, F failed, S skipped` record that `ci/test.sh` uses in place of the
//! single pass or failure libtest reports for the test. A retried test writes its lines again;
//! `ci/test.sh` keeps the last record of each unit.
//!
//! # Stand-in VMs
//! [`hybrid`] is the hybrid-vsock handshake in front of a test server, for tests that reach
//! a stand-in VM the way a host client reaches a real one.

use std::io::Write;

pub mod capture;
pub mod data;
pub mod guest_tool;
pub mod hybrid;
pub mod procfs;

/// A finished command: its exit code (-1 for a signal) and its output as text.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Out {
    fn from(o: std::process::Output) -> Out {
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Out {
    /// Stdout as JSON (panics, showing both streams, when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// The environment variable that lets a test that found no driver pass as skipped.
pub const ALLOW_NO_DRIVER: &str = "VM_TEST_ALLOW_NO_DRIVER";

/// Report `test` as skipped for `reason`.
pub fn skip(test: &str, reason: &str) {
    skip_line(&format!("SKIP {test}: {reason}"));
}

/// Report an already formatted `SKIP <test>: <reason>` line.
pub fn skip_line(line: &str) {
    eprintln!("{line}");
    record(line);
}

/// Appends `line` to `$VM_TEST_SKIP_LOG` when it is set.
fn record(line: &str) {
    let Some(path) = std::env::var_os("VM_TEST_SKIP_LOG") else {
        return;
    };
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        Ok(mut f) => {
            if let Err(e) = writeln!(f, "{line}") {
                eprintln!("warning: could not record {line:?} in {path:?}: {e}");
            }
        }
        Err(e) => eprintln!("warning: could not open skip log {path:?}: {e}"),
    }
}

/// Whether `VM_TEST_ALLOW_NO_DRIVER=1` is set.
pub fn no_driver_allowed() -> bool {
    std::env::var(ALLOW_NO_DRIVER).is_ok_and(|v| v == "1")
}

/// The failure message of a test that found no driver to boot a guest on.
fn no_driver_message(test: &str, reason: &str) -> String {
    format!(
        "{test}: no driver can boot a guest on this host ({reason}); a test that boots on \
         whatever driver is available fails when none ran (set {ALLOW_NO_DRIVER}=1 only on a \
         host that truly has none)"
    )
}

/// A test that boots a guest on whatever driver is available found none, for `reason`:
/// skipped with `VM_TEST_ALLOW_NO_DRIVER=1`, otherwise a failure (this panics).
///
/// ```no_run
/// # fn why_not() -> Option<String> { None }
/// if let Some(reason) = why_not() {
///     return vm_test_support::no_guest_driver("my_test", &reason);
/// }
/// ```
#[track_caller]
pub fn no_guest_driver(test: &str, reason: &str) {
    if no_driver_allowed() {
        skip(test, &format!("{reason} ({ALLOW_NO_DRIVER}=1)"));
    } else {
        panic!("{}", no_driver_message(test, reason));
    }
}

/// The outcome of one test run once per driver, one unit per driver (see the crate docs).
#[derive(Debug)]
pub struct DriverRuns {
    test: String,
    passed: usize,
    failures: Vec<String>,
    skipped: Vec<String>,
}

impl DriverRuns {
    /// Nothing run yet for `test`.
    pub fn new(test: &str) -> DriverRuns {
        DriverRuns {
            test: test.to_string(),
            passed: 0,
            failures: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// `driver` cannot run here: prints and records `SKIP <test> [<driver>]: <reason>`.
    pub fn skipped(&mut self, driver: &str, reason: &str) {
        skip_line(&format!("SKIP {} [{driver}]: {reason}", self.test));
        self.skipped.push(driver.to_string());
    }

    /// The test passed on `driver`.
    pub fn passed(&mut self, driver: &str) {
        eprintln!("PASS {} [{driver}]", self.test);
        self.passed += 1;
    }

    /// The test failed on `driver` with `error`.
    pub fn failed(&mut self, driver: &str, error: &str) {
        // `FAIL <test> [<driver>] ...`: the kvm proof's report reads this line.
        eprintln!("FAIL {} [{driver}] {error}", self.test);
        self.failures.push(format!("[{driver}] {error}"));
    }

    /// Records the `UNITS` line and says whether the test passed: every driver that ran
    /// passed, and at least one ran (or `VM_TEST_ALLOW_NO_DRIVER=1`). No driver having run
    /// counts as one failed unit.
    pub fn finish(self) -> Result<(), String> {
        let mut failures = self.failures;
        if self.passed == 0 && failures.is_empty() && !no_driver_allowed() {
            let reason = format!("every driver was skipped: {}", self.skipped.join(", "));
            failures.push(no_driver_message(&self.test, &reason));
        }
        record(&format!(
            "UNITS {}: {} passed, {} failed, {} skipped",
            self.test,
            self.passed,
            failures.len(),
            self.skipped.len()
        ));
        if failures.is_empty() {
            Ok(())
        } else {
            Err(format!("{} failed:\n{}", self.test, failures.join("\n")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test touches the process environment, so the cases run in sequence in it.
    #[test]
    fn records_skips_units_and_the_no_driver_rule() {
        let dir = std::env::temp_dir().join(format!("vm-skip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skipped.log");
        // SAFETY: no other thread of this test binary reads or writes the environment.
        unsafe { std::env::set_var("VM_TEST_SKIP_LOG", &log) };
        // SAFETY: as above.
        unsafe { std::env::remove_var(ALLOW_NO_DRIVER) };
        skip("a_test", "no widget here");
        skip_line("SKIP other: reason");

        let mut one = DriverRuns::new("boot");
        one.passed("tcg");
        one.skipped("kvm", "no vmx");
        assert_eq!(one.finish(), Ok(()));

        let mut broken = DriverRuns::new("exec");
        broken.failed("tcg", "exit 1");
        let err = broken.finish().unwrap_err();
        assert!(err.contains("[tcg] exit 1"), "{err}");

        let mut none = DriverRuns::new("env");
        none.skipped("tcg", "qemu missing");
        let err = none.finish().unwrap_err();
        assert!(err.contains("every driver was skipped: tcg"), "{err}");
        assert!(err.contains(ALLOW_NO_DRIVER), "{err}");
        let panicked = std::panic::catch_unwind(|| no_guest_driver("lone", "no images"));
        assert!(panicked.is_err(), "no driver must fail without the opt-out");

        // SAFETY: as above.
        unsafe { std::env::set_var(ALLOW_NO_DRIVER, "1") };
        let mut allowed = DriverRuns::new("files");
        allowed.skipped("tcg", "qemu missing");
        assert_eq!(allowed.finish(), Ok(()));
        no_guest_driver("lone", "no images");
        // SAFETY: as above.
        unsafe { std::env::remove_var(ALLOW_NO_DRIVER) };

        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            text,
            "SKIP a_test: no widget here\n\
             SKIP other: reason\n\
             SKIP boot [kvm]: no vmx\n\
             UNITS boot: 1 passed, 0 failed, 1 skipped\n\
             UNITS exec: 0 passed, 1 failed, 0 skipped\n\
             SKIP env [tcg]: qemu missing\n\
             UNITS env: 0 passed, 1 failed, 1 skipped\n\
             SKIP files [tcg]: qemu missing\n\
             UNITS files: 0 passed, 0 failed, 1 skipped\n\
             SKIP lone: no images (VM_TEST_ALLOW_NO_DRIVER=1)\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
