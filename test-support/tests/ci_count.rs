//! `ci/count-tests.awk`, which turns the runner's counts and the records this crate writes into
//! the summary line, on a log with every kind of record: whole-test skips, per-driver units,
//! a failed scenario, a scenario that ran nowhere, and a retried test that wrote its lines twice.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the script over `log` (in a directory of its own, named after `case`) with the
/// runner's `passed` and `failed`; returns its output.
fn count(case: &str, passed: u32, failed: u32, log: &str) -> String {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("vm-ci-count-{case}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("skipped.log");
    std::fs::write(&path, log).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/count-tests.awk");
    let out = Command::new("awk")
        .arg("-v")
        .arg(format!("passed={passed}"))
        .arg("-v")
        .arg(format!("failed={failed}"))
        .arg("-f")
        .arg(script)
        .arg(&path)
        .output()
        .expect("awk runs");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn each_test_and_unit_counts_once() {
    // What the runner saw: 20 tests passed (a_test, boot after its retry, env, files and 16
    // plain tests), 2 failed (exec, pids).
    let log = "\
SKIP a_test: no widget here: really
SKIP boot [kvm]: /dev/kvm is: pvm
SKIP boot [hvf]: macOS
UNITS boot: 0 passed, 1 failed, 2 skipped
SKIP boot [kvm]: /dev/kvm is: pvm
SKIP boot [hvf]: macOS
UNITS boot: 1 passed, 0 failed, 2 skipped
SKIP exec [kvm]: pvm
UNITS exec: 0 passed, 1 failed, 1 skipped
SKIP env [kvm]: pvm
UNITS env: 2 passed, 0 failed, 1 skipped
SKIP files [tcg]: no images
UNITS files: 0 passed, 0 failed, 1 skipped
SKIP pids [tcg]: no images
UNITS pids: 0 passed, 1 failed, 1 skipped
";
    let out = count("units", 20, 2, log);
    let lines: Vec<&str> = out.lines().collect();
    // Passed: 16 plain tests, boot [tcg] and env's two drivers; a_test and files ran nowhere.
    // Failed: exec [tcg], and pids (no driver ran). Skipped: each unit once, retry or not.
    assert_eq!(lines.last(), Some(&"COUNTS 19 2 7"), "{out}");
    assert_eq!(
        &lines[..lines.len() - 1],
        [
            "SKIP a_test: no widget here: really",
            "SKIP boot [kvm]: /dev/kvm is: pvm",
            "SKIP boot [hvf]: macOS",
            "SKIP exec [kvm]: pvm",
            "SKIP env [kvm]: pvm",
            "SKIP files [tcg]: no images",
            "SKIP pids [tcg]: no images",
        ]
    );
}

#[test]
fn an_empty_log_keeps_the_runner_counts() {
    assert_eq!(count("empty", 7, 1, ""), "COUNTS 7 1 0\n");
}
