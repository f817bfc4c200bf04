//! `vm`'s runtime state without a guest: unknown names, stale records of dead VMs, a failed
//! start that must leave nothing behind, and `images ls`/`prune` over the image cache.

mod common;

use common::Env;

const FAILED: i32 = 125;

#[test]
fn unknown_vm_names_fail_with_125() {
    let env = Env::new();
    let file = env.dir.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let file = file.display().to_string();
    for args in [
        vec!["stop", "nosuch"],
        vec!["rm", "nosuch"],
        vec!["logs", "nosuch"],
        vec!["exec", "nosuch", "--", "true"],
        vec!["cp", &file, "nosuch:/tmp/f"],
    ] {
        let out = env.run(&args);
        assert_eq!(out.code, FAILED, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("no VM named \"nosuch\""),
            "{args:?}: {}",
            out.stderr
        );
    }
    let out = env.run(&["ps", "--json"]);
    assert_eq!(out.code, 0);
    assert_eq!(out.json(), serde_json::json!([]));
}

/// A record whose supervisor is gone is shown as exited by `ps`, refused by `exec NAME`,
/// a duplicate name is refused, and `rm` removes it.
#[test]
fn stale_records_are_exited_and_removable() {
    let env = Env::new();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let start: u64 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    child.wait().unwrap();
    let dir = env.runtime().join("ghost");
    std::fs::create_dir(&dir).unwrap();
    let sock = dir.join("vsock.sock");
    std::fs::write(&sock, b"").unwrap();
    let record = serde_json::json!({
        "version": 1, "name": "ghost", "state": "running",
        "supervisor": {"pid": pid, "start_ticks": start},
        "driver": "tcg", "containment": "user-kernel", "created_unix": 1, "started_unix": 2,
        "exited_unix": null, "exit_reason": null, "agent_socket": sock,
        "host_pids": [], "mem_mib": 256, "vcpus": 1, "request": null,
        "labels": {"vm.cli": "0.1.0", "vm.name": "ghost", "vm.driver": "tcg", "vm.trust": "untrusted"}
    });
    std::fs::write(
        dir.join("record.json"),
        serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();

    let out = env.run(&["ps", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let doc = out.json();
    assert_eq!(doc[0]["name"], "ghost");
    assert_eq!(doc[0]["state"], "exited");
    assert_eq!(doc[0]["labels"]["vm.driver"], "tcg");
    assert!(!sock.exists(), "stale socket left behind");
    let out = env.run(&["ps"]);
    let line = out.stdout.lines().find(|l| l.starts_with("ghost")).unwrap();
    assert!(
        line.contains("exited") && line.contains("vm.trust=untrusted"),
        "{line}"
    );

    let out = env.run(&["exec", "ghost", "--", "true"]);
    assert_eq!(out.code, FAILED);
    assert!(out.stderr.contains("exited"), "{}", out.stderr);

    let mut args: Vec<String> = vec![
        "run".into(),
        "-d".into(),
        "--name".into(),
        "ghost".into(),
        "--allow-emulation".into(),
    ];
    args.extend(env.image_args());
    let out = env.run(&args);
    assert_eq!(out.code, FAILED, "{}", out.stderr);
    assert!(out.stderr.contains("already exists"), "{}", out.stderr);

    let out = env.run(&["rm", "ghost"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!dir.exists());
}

/// A VM that cannot boot leaves nothing behind: no record, no process.
/// A `run -d` whose boot failed keeps its record (state exited, the error, the console) for
/// `vm logs --console`, as docker keeps a container that failed to start; `vm rm` removes all of
/// it, and nothing else is left.
#[test]
fn failed_start_keeps_its_record_until_rm() {
    let env = Env::new();
    if !common::tcg_available(&env) {
        return vm_test_support::no_guest_driver(
            "failed_start_keeps_its_record_until_rm",
            "the tcg driver is not available",
        );
    }
    let mut args: Vec<String> = vec![
        "run".into(),
        "-d".into(),
        "--name".into(),
        "broken".into(),
        "--allow-emulation".into(),
        "--timeout".into(),
        "30s".into(),
    ];
    args.extend(env.image_args());
    let out = env.run(&args);
    assert_eq!(out.code, FAILED, "{}", out.stderr);
    assert!(
        out.stderr.starts_with("vm: ") && out.stderr.contains("tcg"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("vm rm broken"), "{}", out.stderr);
    let logs = env.run(&["logs", "--console", "broken"]);
    assert_eq!(logs.code, 0, "{}", logs.stderr);
    assert_eq!(env.run(&["rm", "broken"]).code, 0);
    assert!(
        common::files_under(&env.runtime()).is_empty(),
        "{:?}",
        common::files_under(&env.runtime())
    );
}

/// `images ls`/`prune` only see complete image sets: build.sh's own `kernels/`, `logs/`,
/// `agent-target/` and in-progress `.tmp.*` directories are never listed or removed, nor is
/// `current`, nor a hex-named directory without `manifest.json` (an incomplete set).
#[test]
fn images_prune_keeps_current_and_build_state() {
    let env = Env::new();
    let images = env.dir.path().join("images");
    for d in [
        "kernels/k1",
        "logs",
        "agent-target/debug",
        ".tmp.abc/work",
        "aaaa",
        "bbbb",
        "cccc",
    ] {
        std::fs::create_dir_all(images.join(d)).unwrap();
    }
    for d in ["aaaa", "bbbb", ".tmp.abc"] {
        std::fs::write(images.join(d).join("manifest.json"), b"{}").unwrap();
    }
    std::os::unix::fs::symlink("aaaa", images.join("current")).unwrap();
    let run = |args: &[&str]| {
        common::Out::from(
            env.cmd()
                .env("VM_IMAGES_DIR", &images)
                .args(args)
                .output()
                .unwrap(),
        )
    };
    let ls = run(&["images", "ls", "--json"]);
    assert_eq!(ls.code, 0, "{}", ls.stderr);
    let hashes: Vec<String> = ls
        .json()
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "set")
        .map(|e| e["hash"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(hashes, ["aaaa", "bbbb"]);
    let out = run(&["images", "prune"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("removed bbbb"), "{}", out.stdout);
    assert!(!images.join("bbbb").exists());
    for kept in [
        "aaaa",
        "current",
        "cccc",
        "kernels/k1",
        "logs",
        "agent-target/debug",
        ".tmp.abc/work",
    ] {
        assert!(images.join(kept).exists(), "{kept} was removed");
    }
}
