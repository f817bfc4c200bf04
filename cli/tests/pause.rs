//! `vm pause` / `vm unpause` of a `vm run -d` VM under tcg: while paused every VM process is
//! stopped (each thread `T` in `/proc`), `vm ps` says `paused`, `vm exec`/`vm cp` are refused
//! (125, naming `vm unpause`), a second pause is refused; after `vm unpause` a command runs
//! again; `vm stop` of a paused VM leaves nothing behind. `vm stats` counts every VM process and
//! its memory, and shows a paused VM using no CPU (and, tcg running no VMM of ours, no device
//! counters and no `vm logs --vmm`). A ready `vm serve` pauses too: its
//! published port drops new connections until `vm unpause`, then answers again.

mod common;

use std::time::Duration;

use common::Env;
use vm_test_support::procfs::thread_states;

#[test]
fn pause_freezes_a_named_vm_until_unpause() {
    let env = Env::new();
    if common::no_guest_here(&env, "pause_freezes_a_named_vm_until_unpause") {
        return;
    }
    let _cleanup = common::VmGuard {
        env: &env,
        name: "frozen",
    };
    let out = env.run(&["run", "-d", "--name", "frozen", "--allow-emulation"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let ps = env.run(&["ps", "--json"]).json();
    let supervisor = ps[0]["supervisor_pid"].as_u64().unwrap() as u32;
    // The VM's processes: every descendant of the supervisor (helpers, reapers, programs).
    let vm_procs: Vec<u32> = common::descendants(supervisor)
        .into_iter()
        .filter(|&p| p != supervisor)
        .collect();
    assert!(!vm_procs.is_empty(), "no VM processes under the supervisor");
    let stats = env.run(&["stats", "--json", "frozen"]).json();
    assert_eq!(stats[0]["state"], "running", "{stats}");
    assert!(
        stats[0]["host_rss_bytes"].as_u64().unwrap() > 16 << 20,
        "{stats}"
    );
    assert_eq!(
        stats[0]["host_processes"].as_u64().unwrap(),
        vm_procs.len() as u64,
        "every VM process counted: {stats}"
    );
    assert_eq!(stats[0]["guest_mem_mib"], 256, "{stats}");
    // tcg runs no VMM of ours: no device counters (null, not zeros), no VMM log.
    assert!(stats[0]["vmm_devices"].is_null(), "{stats}");
    let logs = env.run(&["logs", "--vmm", "frozen"]);
    assert_eq!(logs.code, 125, "{}", logs.stderr);
    assert!(logs.stderr.contains("tcg driver"), "{}", logs.stderr);

    let out = env.run(&["unpause", "frozen"]);
    assert_eq!(out.code, 125, "unpause of a running VM: {}", out.stderr);
    assert!(out.stderr.contains("already running"), "{}", out.stderr);

    let out = env.run(&["pause", "frozen"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(out.stdout.trim(), "frozen");
    for &p in &vm_procs {
        let states = thread_states(p);
        assert!(
            !states.is_empty() && states.iter().all(|&s| s == 'T'),
            "VM process {p} not stopped while paused: {states:?}"
        );
    }
    assert_eq!(env.run(&["ps", "--json"]).json()[0]["state"], "paused");
    // A paused VM uses no CPU at all.
    let stats = env.run(&["stats", "--json"]).json();
    assert_eq!(stats[0]["state"], "paused", "{stats}");
    assert_eq!(stats[0]["cpu_percent"], 0.0, "{stats}");
    let out = env.run(&["stats"]);
    assert!(
        out.code == 0 && out.stdout.lines().any(|l| l.starts_with("frozen ")),
        "{out:?}"
    );
    let out = env.run(&["exec", "frozen", "--", "true"]);
    assert_eq!(out.code, 125, "exec while paused: {}", out.stderr);
    assert!(out.stderr.contains("vm unpause frozen"), "{}", out.stderr);
    let host_out = tempfile::tempdir().unwrap();
    let dest = host_out.path().join("hostname");
    let out = env.run(&["cp", "frozen:/etc/hostname", dest.to_str().unwrap()]);
    assert_eq!(out.code, 125, "cp while paused: {}", out.stderr);
    let out = env.run(&["pause", "frozen"]);
    assert_eq!(out.code, 125, "second pause: {}", out.stderr);
    assert!(out.stderr.contains("already paused"), "{}", out.stderr);

    let out = env.run(&["unpause", "frozen"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    for &p in &vm_procs {
        assert!(
            !thread_states(p).contains(&'T'),
            "VM process {p} still stopped after unpause"
        );
    }
    assert_eq!(env.run(&["ps", "--json"]).json()[0]["state"], "running");
    let out = env.run(&["exec", "frozen", "--", "echo", "thawed"]);
    assert_eq!(out.code, 0, "exec after unpause: {}", out.stderr);
    assert_eq!(out.stdout, "thawed\n");

    // Stopping a paused VM: the supervisor resumes it and tears it down.
    assert_eq!(env.run(&["pause", "frozen"]).code, 0);
    let out = env.run(&["stop", "frozen"]);
    assert_eq!(out.code, 0, "stop while paused: {}", out.stderr);
    assert!(!common::pid_alive(supervisor), "supervisor still alive");
    for &p in &vm_procs {
        assert!(!common::pid_alive(p), "VM process {p} left after stop");
    }
    assert_eq!(env.run(&["ps", "--json"]).json()[0]["state"], "exited");
    let out = env.run(&["stats", "frozen"]);
    assert_eq!(out.code, 125, "stats of an exited VM: {out:?}");
}

#[test]
fn a_ready_vm_serve_pauses_and_its_port_answers_again_after_unpause() {
    let env = Env::new();
    if common::no_guest_here(
        &env,
        "a_ready_vm_serve_pauses_and_its_port_answers_again_after_unpause",
    ) {
        return;
    }
    let _cleanup = common::VmGuard {
        env: &env,
        name: "web",
    };
    let mut child = common::ChildGuard(
        env.cmd()
            .args([
                "serve",
                "--name",
                "web",
                "--allow-emulation",
                "-p",
                "0:8000",
            ])
            .args([
                "--ready", "/version", "--", "httpd", "-f", "-p", "8000", "-h", "/proc",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.0.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr = common::http::url_addr(&line);
    assert_eq!(common::http::get(addr, "/version").unwrap().status, 200);

    let out = env.run(&["pause", "web"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(env.run(&["ps", "--json"]).json()[0]["state"], "paused");
    // A new connection is dropped while paused (the guest answers nothing).
    let paused = common::http::request(addr, "GET", "/version", "", Duration::from_secs(5));
    assert!(paused.is_err(), "answered while paused: {paused:?}");
    assert!(
        matches!(child.0.try_wait(), Ok(None)),
        "vm serve exited while paused"
    );

    let out = env.run(&["unpause", "web"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(common::http::get(addr, "/version").unwrap().status, 200);
    let out = env.run(&["stop", "web"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(child.0.wait().unwrap().code(), Some(130));
}
