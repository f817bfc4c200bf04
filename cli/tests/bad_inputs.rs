//! Bad inputs found by the issue 25 audit, refused by name before anything boots, and the same
//! way by `--dry-run` and a real run; a closed stdout/stderr is not a crash. No guest needed.

mod common;

use std::process::Stdio;

use common::Env;

const REFUSED: i32 = 126;
const USAGE: i32 = 2;
/// A Rust panic's exit code.
const PANICKED: i32 = 101;

/// Each value, and the field its refusal names.
const CASES: [(&str, &str, &str); 4] = [
    ("--cpus", "0", "guarantees.limits.vcpus: 0 refused"),
    ("--pids", "0", "guarantees.limits.pids: 0 refused"),
    ("--timeout", "0", "guarantees.limits.wall_ms: 0 refused"),
    ("--env-allow", "*", "guarantees.env_allow[0]: \"*\" refused"),
];

/// `--cpus 0` once became 1 vCPU, `--pids 0` 1024 processes, and `--timeout 0` booted a VM
/// that was killed at once (exit 124) while `--dry-run` said "no time limit".
#[test]
fn zero_limits_are_refused_by_name_in_dry_and_real_runs() {
    let env = Env::new();
    let img = env.image_args();
    let img: Vec<&str> = img.iter().map(String::as_str).collect();
    for (flag, value, needle) in CASES {
        let mut heads = vec![
            vec!["exec", "--dry-run"],
            vec!["exec"],
            vec!["run", "-d", "--name", "r1"],
            vec!["serve", "-p", "8000"],
            vec!["serve", "--dry-run", "-p", "8000"],
        ];
        for args in &mut heads {
            args.extend(["--allow-emulation", flag, value]);
            args.extend(img.iter().copied());
            if args[0] != "run" {
                args.extend(["--", "true"]);
            }
            let out = env.run(args);
            assert_eq!(out.code, REFUSED, "{args:?}: {}", out.stderr);
            assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
            assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {}", out.stderr);
            if args.contains(&"--dry-run") {
                assert!(out.stdout.contains(needle), "{args:?}: {}", out.stdout);
                // The dry run shows the 0 it refuses, not "no time limit".
                if flag == "--timeout" {
                    assert!(out.stdout.contains("wall 0ms"), "{args:?}: {}", out.stdout);
                }
            }
        }
    }
    // Nothing was created for any of them: no record, no run directory, no VM process.
    assert!(
        common::files_under(&env.runtime()).is_empty(),
        "{:?}",
        common::files_under(&env.runtime())
    );
    // A named VM's command: no spec is validated there, so the CLI refuses it itself.
    let out = env.run(&["exec", "box", "--timeout", "0", "--", "true"]);
    assert_eq!(out.code, USAGE, "{}", out.stderr);
    assert!(
        out.stderr.contains("--timeout: 0 refused"),
        "{}",
        out.stderr
    );
}

/// `vm` with stdout and/or stderr a pipe nobody reads any more (`vm … 2>&1 | head -1`):
/// `println!`/`eprintln!` panicked (exit 101); now the write is dropped.
fn run_with_closed(env: &Env, args: &[&str], stdout: bool, stderr: bool) -> i32 {
    let closed = || {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        Stdio::from(writer)
    };
    let mut cmd = env.cmd();
    cmd.args(args)
        .stdout(if stdout { closed() } else { Stdio::null() })
        .stderr(if stderr { closed() } else { Stdio::null() });
    cmd.status().unwrap().code().unwrap_or(-1)
}

#[test]
fn a_closed_stdout_or_stderr_is_not_a_crash() {
    let env = Env::new();
    let img = env.image_args();
    let mut dry: Vec<&str> = vec!["exec", "--dry-run", "--allow-emulation"];
    dry.extend(img.iter().map(String::as_str));
    dry.extend(["--", "true"]);
    let mut refused: Vec<&str> = vec!["exec", "--allow-emulation", "--cpus", "0"];
    refused.extend(img.iter().map(String::as_str));
    refused.extend(["--", "true"]);
    let cases: [(&[&str], bool, bool, i32); 5] = [
        // A report on stdout.
        (&dry, true, false, 0),
        (&dry, true, true, 0),
        // A refusal on stderr.
        (&refused, false, true, REFUSED),
        (&refused, true, true, REFUSED),
        // A table on stdout.
        (&["ps"], true, true, 0),
    ];
    for (args, stdout, stderr, want) in cases {
        let code = run_with_closed(&env, args, stdout, stderr);
        assert_ne!(code, PANICKED, "{args:?} panicked");
        assert_eq!(
            code, want,
            "{args:?} (stdout closed {stdout}, stderr {stderr})"
        );
    }
}
