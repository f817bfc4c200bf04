//! `vm exec -i` / `-t` as a user types them: TERM only with `-t` (and shown by --dry-run),
//! and in a real guest under the tcg driver: stdin piped into `wc -l`, an early stdin EOF,
//! and an interactive shell on a real terminal (prompt, arithmetic, Ctrl-C, `exit 3`, the
//! terminal's settings restored). The guest cases SKIP (with the reason) when the built-in
//! images are not built or tcg is unavailable. The same flows against a named VM on the
//! host agent are in `named_host_agent.rs`.

mod common;

use std::time::{Duration, Instant};

use common::{Env, guest_unavailable};

/// The `env` of a `--dry-run --json` spec with `extra` flags.
fn dry_env(env: &Env, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "exec".into(),
        "--dry-run".into(),
        "--json".into(),
        "--allow-emulation".into(),
    ];
    args.extend(env.image_args());
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--".into(), "sh".into()]);
    let out = common::Out::from(
        env.cmd()
            .env("TERM", "xterm-test")
            .args(&args)
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let doc = out.json();
    doc["spec"]["guarantees"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| format!("{}={}", kv[0].as_str().unwrap(), kv[1].as_str().unwrap()))
        .collect()
}

#[test]
fn term_is_passed_only_with_t_and_dry_run_shows_it() {
    let env = Env::new();
    assert!(dry_env(&env, &["-t"]).contains(&"TERM=xterm-test".to_string()));
    assert!(
        !dry_env(&env, &["-i"])
            .iter()
            .any(|kv| kv.starts_with("TERM="))
    );
    assert!(!dry_env(&env, &[]).iter().any(|kv| kv.starts_with("TERM=")));
    // -e TERM wins over ours.
    let kv = dry_env(&env, &["-t", "-e", "TERM=vt100"]);
    assert!(kv.contains(&"TERM=vt100".to_string()), "{kv:?}");
    assert!(!kv.contains(&"TERM=xterm-test".to_string()), "{kv:?}");
}

#[test]
fn stdin_reaches_a_guest_command() {
    let env = Env::new();
    if let Some(why) = guest_unavailable(&env) {
        return vm_test_support::no_guest_driver("stdin_reaches_a_guest_command", &why);
    }
    let args = ["exec", "--allow-emulation", "-i", "--", "wc", "-l"];
    let out = common::tty::with_stdin(&env, &args, b"a\nb\n");
    assert_eq!((out.code, out.stdout.trim()), (0, "2"), "{}", out.stderr);
    // Stdin closed at once: the guest command sees EOF and nothing hangs.
    let started = Instant::now();
    let args = [
        "exec",
        "--allow-emulation",
        "-i",
        "--",
        "sh",
        "-c",
        "cat; echo eof",
    ];
    let out = common::tty::with_stdin(&env, &args, b"");
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "eof\n"),
        "{}",
        out.stderr
    );
    assert!(started.elapsed() < Duration::from_secs(120));
}

#[test]
fn interactive_shell_in_a_guest() {
    let env = Env::new();
    if let Some(why) = guest_unavailable(&env) {
        return vm_test_support::no_guest_driver("interactive_shell_in_a_guest", &why);
    }
    common::tty::shell_session(
        &env,
        &[
            "exec",
            "--allow-emulation",
            "-it",
            "-e",
            "PS1=gp> ",
            "--",
            "sh",
        ],
        Duration::from_secs(90),
    );
}
