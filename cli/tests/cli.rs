//! `vm` behaviour that needs no guest: grammar, dry-run, refusals and their exit codes and
//! publish normalization (the driver table: tests/drivers_table.rs; runtime state:
//! tests/state.rs).

mod common;

use common::{Env, skip};

const REFUSED: i32 = 126;
const NO_DRIVER: i32 = 127;
const USAGE: i32 = 2;

/// `vm exec --dry-run --allow-emulation <image> EXTRA -- true`.
fn dry(env: &Env, extra: &[&str]) -> common::Out {
    let mut args: Vec<String> = vec![
        "exec".into(),
        "--dry-run".into(),
        "--allow-emulation".into(),
    ];
    args.extend(env.image_args());
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--".into(), "true".into()]);
    env.run(&args)
}

#[test]
fn help_documents_exit_codes_and_examples() {
    let env = Env::new();
    let out = env.run(&["--help"]);
    assert_eq!(out.code, 0);
    for needle in [
        "Exit status:",
        "124",
        "125",
        "126",
        "127",
        "130",
        "Examples:",
    ] {
        assert!(
            out.stdout.contains(needle),
            "missing {needle:?} in --help:\n{}",
            out.stdout
        );
    }
    for sub in [
        "exec", "run", "serve", "ps", "stop", "rm", "logs", "cp", "drivers",
    ] {
        let out = env.run(&[sub, "--help"]);
        assert_eq!(out.code, 0, "{sub} --help");
        assert!(
            out.stdout.contains("Examples:"),
            "{sub} --help has no examples"
        );
    }
    let out = env.run(&["images", "build", "--help"]);
    assert!(out.stdout.contains("Examples:"));
}

#[test]
fn dry_run_json_has_the_resolved_spec_and_verdict() {
    let env = Env::new();
    let data = env.dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let vol = format!("{}:/data:ro", data.display());
    let out = dry(
        &env,
        &[
            "--json",
            "--memory",
            "512M",
            "--cpus",
            "2",
            "--pids",
            "99",
            "--timeout",
            "90s",
            "-v",
            &vol,
            "-e",
            "FOO=bar",
            "-w",
            "/work/sub",
        ],
    );
    let doc = out.json();
    let g = &doc["spec"]["guarantees"];
    assert_eq!(g["limits"]["mem_mib"], 512);
    assert_eq!(g["limits"]["vcpus"], 2);
    assert_eq!(g["limits"]["pids"], 99);
    assert_eq!(g["limits"]["wall_ms"], 90_000);
    assert_eq!(g["egress_denied"], true);
    assert_eq!(g["mounts"][0]["guest_path"], "/data");
    assert_eq!(g["mounts"][0]["read_only"], true);
    let env_list = g["env"].as_array().unwrap();
    assert!(
        env_list.iter().any(|kv| kv[0] == "FOO" && kv[1] == "bar"),
        "{env_list:?}"
    );
    // The default guest PATH is vm-spec's, written into the spec (visible here).
    assert!(
        env_list
            .iter()
            .any(|kv| kv[0] == "PATH" && kv[1] == vm_spec::DEFAULT_GUEST_PATH),
        "default PATH missing: {env_list:?}"
    );
    assert_eq!(doc["command"], serde_json::json!(["true"]));
    assert_eq!(doc["workdir"], "/work/sub");
    assert_eq!(doc["trust"], "untrusted");
    // Any absolute guest path is a working directory, outside the root too (docker's -w).
    for w in ["/etc", "/", "/tmp/x"] {
        let other = dry(&env, &["--json", "-w", w]).json();
        assert_eq!(other["workdir"], w);
        assert_eq!(other["validation"]["ok"], true, "{other}");
    }
    assert_eq!(doc["policy"]["allow_emulation"], true);
    assert_eq!(doc["validation"]["ok"], true, "{doc}");
    assert!(doc["validation"]["normalized"].is_object());
    for field in ["driver", "verdict", "exit_code", "spec"] {
        assert!(!doc[field].is_null(), "{field} missing");
    }
    // The verdict is what this host's driver table says (--allow-emulation is given).
    match first_available_driver(&env) {
        Some((name, _)) => {
            assert_eq!(doc["verdict"], "ok", "{doc}");
            assert_eq!(doc["exit_code"], 0);
            assert_eq!(doc["driver"]["name"], name.as_str(), "{doc}");
            // The jail the chosen driver builds is shown (tcg: namespaces around QEMU and
            // vm-vsock, QEMU's own seccomp sandbox, our filter for the backend).
            let jail = &doc["driver"]["jail"];
            assert!(jail["granted"].is_boolean(), "{jail}");
            if name == "tcg" {
                assert_eq!(
                    jail["namespaces"],
                    serde_json::json!(["mnt", "pid", "ipc", "uts", "net"]),
                    "{jail}"
                );
                let seccomp = jail["seccomp"].as_str().unwrap();
                assert!(seccomp.contains("-sandbox"), "{jail}");
                assert!(seccomp.contains("vm-vsock: our allowlist"), "{jail}");
            }
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                assert_eq!(jail["applied"], "full", "{jail}");
            }
            assert_eq!(out.code, 0, "{}", out.stderr);
        }
        None => {
            assert_eq!(doc["verdict"], "no-driver", "{doc}");
            assert_eq!(doc["exit_code"], NO_DRIVER);
            assert_eq!(out.code, NO_DRIVER, "{}", out.stderr);
        }
    }
}

/// The first driver `vm drivers` lists as available (the registry's preference order), with
/// its containment.
fn first_available_driver(env: &Env) -> Option<(String, String)> {
    common::drivers(env)
        .into_iter()
        .find(|(_, ok, _, _)| *ok)
        .map(|(name, _, containment, _)| (name, containment))
}

/// `-e PATH=…` replaces the default PATH; the spec's environment is exactly what is shown.
#[test]
fn dry_run_env_is_exactly_the_spec_env() {
    let env = Env::new();
    let out = dry(&env, &["--json", "-e", "PATH=/opt/bin", "-e", "X=1"]);
    let doc = out.json();
    assert_eq!(
        doc["spec"]["guarantees"]["env"],
        serde_json::json!([["PATH", "/opt/bin"], ["X", "1"]]),
        "{doc}"
    );
    let out = dry(&env, &["--json"]);
    assert_eq!(
        out.json()["spec"]["guarantees"]["env"],
        serde_json::json!([["PATH", vm_spec::DEFAULT_GUEST_PATH]])
    );
}

#[test]
fn dry_run_text_names_the_verdict() {
    let env = Env::new();
    let out = dry(&env, &["--memory", "1G"]);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines.contains(&"limits       memory 1024 MiB, cpus 1, pids 256, wall none"),
        "{}",
        out.stdout
    );
    assert!(lines.contains(&"validation   ok"), "{}", out.stdout);
    // The floor itself validates (and boots: drivers check the same vm_spec::MIN_MEM_MIB).
    let least = dry(&env, &["--memory", "64M"]);
    assert!(
        least.stdout.lines().any(|l| l == "validation   ok"),
        "{}",
        least.stdout
    );
    // The verdict itself, as this host's driver table decides it (--allow-emulation is given).
    let (driver, verdict, code) = match first_available_driver(&env) {
        Some((name, containment)) => (format!("{name} ({containment})"), "ok (exit 0)", 0),
        None => (String::new(), "no-driver (exit 127)", NO_DRIVER),
    };
    if code == 0 {
        assert!(
            lines.contains(&format!("driver       {driver}").as_str()),
            "{}",
            out.stdout
        );
    }
    assert_eq!(
        lines.last().copied(),
        Some(format!("verdict      {verdict}").as_str()),
        "{}",
        out.stdout
    );
    assert_eq!(out.code, code, "{}", out.stderr);
}

/// Each refusal the CLI can express: its exit code and a message naming the field.
#[test]
fn refusals_exit_126_with_the_reason() {
    let env = Env::new();
    let home = env.dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let host = env.dir.path().join("data");
    std::fs::create_dir(&host).unwrap();
    let rw = format!("{}:/data:rw", host.display());
    let home_mount = format!("{}:/h", home.display());
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    let ssh_mount = format!("{}:/keys", home.join(".ssh").display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["-v", &ssh_mount],
            "(SSH keys); name it with --allow-mount-secret",
        ),
        (vec!["-v", &rw], "writable mount"),
        (vec!["-v", "relative/dir:/data"], "relative path"),
        (vec!["-v", "/:/host"], "guarantees.mounts[0].host_path"),
        (vec!["-v", &home_mount], "home"),
        (vec!["--memory", "0"], "guarantees.limits.mem_mib: 0"),
        // Below the floor a guest boots in: refused by the dry run, not at boot.
        (
            vec!["--memory", "63M"],
            "guarantees.limits.mem_mib: 63 refused; memory must be capped at >= 64 MiB",
        ),
        (vec!["--cpus", "999"], "guarantees.limits.vcpus"),
        (vec!["-e", "API_TOKEN=abc"], "looks like a secret"),
        (vec!["-v", "/tmp:/proc"], "protected"),
    ];
    for (extra, needle) in cases {
        let mut cmd = env.cmd();
        let mut args: Vec<String> = vec![
            "exec".into(),
            "--dry-run".into(),
            "--allow-emulation".into(),
        ];
        args.extend(env.image_args());
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["--".into(), "true".into()]);
        let out = common::Out::from(cmd.env("HOME", &home).args(&args).output().unwrap());
        assert_eq!(
            out.code, REFUSED,
            "{extra:?}: stdout {} stderr {}",
            out.stdout, out.stderr
        );
        assert!(
            out.stdout.contains(needle),
            "{extra:?}: want {needle:?} in {}",
            out.stdout
        );
        assert!(
            out.stderr.starts_with("vm: ") && out.stderr.lines().count() == 1,
            "{extra:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(needle),
            "{extra:?}: want {needle:?} in stderr {}",
            out.stderr
        );
    }
    // The secret refusal is lifted by naming the variable.
    let out = dry(&env, &["-e", "API_TOKEN=abc", "--env-allow", "API_TOKEN"]);
    assert!(out.stdout.contains("validation   ok"), "{}", out.stdout);
    // The credential-mount refusal by naming the path; the exception shows in the spec.
    let ssh = home.join(".ssh");
    let mut args: Vec<String> = ["exec", "--dry-run", "--json", "--allow-emulation"]
        .map(String::from)
        .to_vec();
    args.extend(env.image_args());
    args.extend([
        "-v".into(),
        ssh_mount.clone(),
        "--allow-mount-secret".into(),
    ]);
    args.extend([ssh.display().to_string(), "--".into(), "true".into()]);
    let out = common::Out::from(env.cmd().env("HOME", &home).args(&args).output().unwrap());
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.json()["spec"]["guarantees"]["mount_secret_allow"],
        serde_json::json!([ssh.display().to_string()])
    );
}

#[test]
fn usage_errors_exit_2() {
    let env = Env::new();
    let cases: Vec<Vec<&str>> = vec![
        vec!["exec", "--memory", "12X", "--", "true"],
        vec!["exec", "--timeout", "5d", "--", "true"],
        vec!["exec", "-v", "/a", "--", "true"],
        vec!["exec", "-v", "/a:/b:xx", "--", "true"],
        vec!["exec", "-e", "1BAD=x", "--", "true"],
        vec!["exec", "--trust", "maybe", "--", "true"],
        vec!["exec", "true"],
        vec!["run", "--name", "Bad_Name", "-d"],
        vec!["run", "--name", "ok"],
        vec!["exec", "box", "--memory", "1G", "--", "true"],
        vec!["cp", "a", "b"],
        vec!["cp", "x:/a", "y:/b"],
        vec!["stop", "UPPER"],
    ];
    for args in cases {
        let out = env.run(&args);
        assert_eq!(out.code, USAGE, "{args:?}: {}", out.stderr);
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
    let out = env.run(&["exec", "box", "--memory", "1G", "--", "true"]);
    assert!(
        out.stderr.contains("--memory") && out.stderr.contains("already running"),
        "{}",
        out.stderr
    );
}

#[test]
fn driver_choice_refusals() {
    let env = Env::new();
    let mut args: Vec<String> = vec![
        "exec".into(),
        "--dry-run".into(),
        "--driver".into(),
        "nope".into(),
    ];
    args.extend(env.image_args());
    args.extend(["--".into(), "true".into()]);
    let out = env.run(&args);
    assert_eq!(out.code, USAGE, "{}", out.stderr);
    assert!(out.stderr.contains("not registered"), "{}", out.stderr);
}

/// On a PVM-native host with tcg installed (these development machines), nothing can
/// contain untrusted work without `--allow-emulation`.
#[test]
fn untrusted_work_needs_allow_emulation_on_a_pvm_native_host() {
    let env = Env::new();
    if !common::pvm_native_host() || !common::tcg_available(&env) {
        return skip(
            "untrusted_work_needs_allow_emulation_on_a_pvm_native_host",
            "needs a PVM-native host with tcg available",
        );
    }
    // Untrusted work without --allow-emulation: nothing can contain it here.
    let mut args: Vec<String> = vec!["exec".into(), "--dry-run".into()];
    args.extend(env.image_args());
    args.extend(["--".into(), "true".into()]);
    let out = env.run(&args);
    assert_eq!(out.code, NO_DRIVER, "{}", out.stderr);
    assert!(out.stderr.contains("--allow-emulation"), "{}", out.stderr);
    assert!(
        out.stderr.contains("kvm:") && out.stderr.contains("tcg:"),
        "{}",
        out.stderr
    );
    // The same without --dry-run refuses before booting anything.
    let mut args: Vec<String> = vec!["exec".into()];
    args.extend(env.image_args());
    args.extend(["--".into(), "true".into()]);
    let out = env.run(&args);
    assert_eq!(out.code, NO_DRIVER, "{}", out.stderr);
    // Naming tcg without --allow-emulation: available but refused by policy.
    let mut args: Vec<String> = vec![
        "exec".into(),
        "--dry-run".into(),
        "--driver".into(),
        "tcg".into(),
    ];
    args.extend(env.image_args());
    args.extend(["--".into(), "true".into()]);
    let out = env.run(&args);
    assert_eq!(out.code, REFUSED, "{}", out.stderr);
    // Trusted work may use the emulator without the flag.
    let mut args: Vec<String> = vec![
        "exec".into(),
        "--dry-run".into(),
        "--trust".into(),
        "trusted".into(),
    ];
    args.extend(env.image_args());
    args.extend(["--".into(), "true".into()]);
    let out = env.run(&args);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn serve_publish_specs_are_normalized() {
    let env = Env::new();
    let table = [
        ("8000", "127.0.0.1:8000:8000"),
        ("9000:8000", "127.0.0.1:9000:8000"),
        ("127.0.0.1:8080:3000", "127.0.0.1:8080:3000"),
        ("0.0.0.0:8000:8000", "0.0.0.0:8000:8000"),
        ("[::1]:8080:3000", "[::1]:8080:3000"),
        ("3000/tcp", "127.0.0.1:3000:3000"),
        ("0:8000", "127.0.0.1:0:8000"),
    ];
    let ranges = [
        (
            "8000-8002:9000-9002",
            &[
                "127.0.0.1:8000:9000",
                "127.0.0.1:8001:9001",
                "127.0.0.1:8002:9002",
            ][..],
        ),
        ("0:8000-8001", &["127.0.0.1:0:8000", "127.0.0.1:0:8001"][..]),
    ];
    let table = table
        .iter()
        .map(|(w, want)| (*w, vec![*want]))
        .chain(ranges.iter().map(|(w, want)| (*w, want.to_vec())));
    for (written, want) in table {
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--dry-run".into(),
            "--json".into(),
            "--allow-emulation".into(),
            "-p".into(),
            written.into(),
        ];
        args.extend(env.image_args());
        args.extend(["--".into(), "httpd".into()]);
        let out = env.run(&args);
        let doc = out.json();
        assert_eq!(doc["publish"], serde_json::json!(want), "{written}");
    }
    for bad in [
        "3000/udp",
        "8000-8010:9000-9001",
        "abc",
        "8000:0",
        "1:2:3:4",
        "70000",
    ] {
        let mut args: Vec<String> =
            vec!["serve".into(), "--dry-run".into(), "-p".into(), bad.into()];
        args.extend(env.image_args());
        args.extend(["--".into(), "httpd".into()]);
        let out = env.run(&args);
        assert_eq!(out.code, USAGE, "{bad}: {}", out.stderr);
        assert!(out.stderr.contains("publish"), "{bad}: {}", out.stderr);
    }
}

/// Without --dry-run, a refused spec stops exec, run -d and serve before anything boots.
#[test]
fn real_runs_refuse_before_booting() {
    let env = Env::new();
    let host = env.dir.path().join("data");
    std::fs::create_dir(&host).unwrap();
    let rw = format!("{}:/data:rw", host.display());
    let img = env.image_args();
    let img: Vec<&str> = img.iter().map(String::as_str).collect();
    let mut cases: Vec<Vec<&str>> = Vec::new();
    for head in [
        vec!["exec"],
        vec!["run", "-d", "--name", "r1"],
        vec!["serve", "-p", "8000"],
    ] {
        let mut args = head;
        args.extend(["--allow-emulation", "-v", &rw]);
        args.extend(img.iter().copied());
        if args[0] != "run" {
            args.extend(["--", "true"]);
        }
        cases.push(args);
    }
    for args in cases {
        let out = env.run(&args);
        assert_eq!(out.code, REFUSED, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("writable mount"),
            "{args:?}: {}",
            out.stderr
        );
        assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {}", out.stderr);
    }
    // A working directory with `..`: a usage error, the same rule for a VM booted for one
    // command and for the default directory of a named VM.
    for head in [vec!["exec"], vec!["run", "-d", "--name", "r2"]] {
        let mut args = head;
        args.extend(["--allow-emulation", "-w", "/tmp/../etc"]);
        args.extend(img.iter().copied());
        if args[0] != "run" {
            args.extend(["--", "true"]);
        }
        let out = env.run(&args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr
                .contains(r#"-w: path "/tmp/../etc": '..' is refused"#),
            "{args:?}: {}",
            out.stderr
        );
    }
    assert!(common::files_under(&env.runtime()).is_empty());
}
