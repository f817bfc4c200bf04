//! The shim under a real containerd (Debian's 1.6, started by the test in a temp dir with
//! its own config, root, state and socket), driven with `ctr` as a user would: a container
//! runs in its own microVM, prints through containerd's FIFOs and exits with its code; the
//! memory limit is the guest's memory; `exec`, `kill` and `delete` work and leave nothing
//! behind; a bundle that asks for a writable host mount is refused with our message; the
//! runtime options decide the policy; the shim survives a containerd restart; a shim killed
//! with SIGKILL leaves nothing running; `ctr task pause`/`resume` freeze and thaw the VM;
//! `ctr task metrics` reports the VM's host usage.

#[macro_use]
mod common;

use std::process::Stdio;

use common::{Containerd, alive, entries};
use vm_test_support::procfs::thread_states;

#[test]
fn run_prints_and_exits_with_its_code_with_task_events() {
    preflight!("run_prints_and_exits_with_its_code_with_task_events");
    let cd = Containerd::start();
    let mut events = cd
        .ctr_cmd()
        .arg("events")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = cd.run(&["--rm"], "hello", &["sh", "-c", "echo hi; exit 3"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (3, "hi\n"),
        "{out:?}\n{}",
        cd.log()
    );
    // The events containerd saw from the shim, in order, for this container.
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill(2) on the `ctr events` child spawned above.
    unsafe { libc::kill(events.id() as i32, libc::SIGTERM) };
    let text = {
        use std::io::Read;
        let mut s = String::new();
        events
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        let _ = events.wait();
        s
    };
    let topics: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("hello"))
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|t| t.starts_with("/tasks/"))
        .collect();
    assert_eq!(
        topics,
        [
            "/tasks/create",
            "/tasks/start",
            "/tasks/exit",
            "/tasks/delete"
        ],
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("/tasks/exit") && l.contains("\"exit_status\":3")),
        "{text}"
    );
}

/// What the guest kernel keeps out of the memory asked for, in KiB (measured on tcg with the
/// built-in images; the same window as the e2e memory test).
const RESERVED_KIB: std::ops::RangeInclusive<i64> = (14 * 1024)..=(23 * 1024);

#[test]
fn memory_limit_is_the_guest_memory() {
    preflight!("memory_limit_is_the_guest_memory");
    let cd = Containerd::start();
    let asked_mib: i64 = 300;
    let bytes = (asked_mib << 20).to_string();
    let out = cd.run(
        &["--rm", "--memory-limit", &bytes],
        "mem",
        &["head", "-1", "/proc/meminfo"],
    );
    assert_eq!(out.code, 0, "{out:?}\n{}", cd.log());
    let kb: i64 = out
        .stdout
        .strip_prefix("MemTotal:")
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MemTotal in {out:?}"));
    let reserved = asked_mib * 1024 - kb;
    assert!(
        RESERVED_KIB.contains(&reserved),
        "MemTotal {kb} kB for {asked_mib} MiB: {reserved} kB reserved, outside {RESERVED_KIB:?}"
    );
}

#[test]
fn detached_exec_kill_delete_leave_nothing() {
    preflight!("detached_exec_kill_delete_leave_nothing");
    let cd = Containerd::start();
    cd.run_detached("box");
    assert_eq!(cd.task_status("box").as_deref(), Some("RUNNING"));
    let out = cd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "box",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 5",
    ]);
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (5, "out\n", "err\n")
    );
    // An exec elsewhere than the container's working directory is refused, not moved.
    let out = cd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e2",
        "--cwd",
        "/etc",
        "box",
        "true",
    ]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("process.cwd \"/etc\"")
            && out.stderr.contains("working directory \"/\""),
        "{out:?}"
    );
    let vm_pids = cd.task_pids("box");
    assert!(
        !vm_pids.is_empty() && vm_pids.iter().all(|p| alive(*p)),
        "{vm_pids:?}"
    );
    let shims = cd.shim_pids();
    assert_eq!(shims.len(), 1, "one shim for the container");
    let refs = cd.snapshots().join("refs");
    assert_eq!(
        entries(&refs).len(),
        1,
        "the container holds its root image"
    );
    assert_eq!(entries(&cd.run_dir()).len(), 1, "one VM run directory");

    cd.kill_and_delete("box");
    assert_eq!(cd.ctr(&["container", "rm", "box"]).code, 0);
    cd.wait_for(30, "the shim to exit", || cd.shim_pids().is_empty());
    for pid in vm_pids.iter().chain(&shims) {
        assert!(!alive(*pid), "process {pid} is still running");
    }
    assert_eq!(
        entries(&cd.run_dir()),
        Vec::<String>::new(),
        "run dirs left"
    );
    assert_eq!(entries(&refs), Vec::<String>::new(), "root references left");
    // The image stays cached for the next container of the same snapshot.
    assert_eq!(
        entries(&cd.snapshots())
            .iter()
            .filter(|n| n.ends_with(".erofs"))
            .count(),
        1
    );
    assert_eq!(leftover_socket(&cd, "box"), None, "shim socket left");
}

#[test]
fn pause_and_resume_freeze_and_thaw_the_vm() {
    preflight!("pause_and_resume_freeze_and_thaw_the_vm");
    let cd = Containerd::start();
    cd.run_detached("frozen");
    let vm_pids = cd.task_pids("frozen");
    assert!(!vm_pids.is_empty(), "no VM processes");
    let out = cd.ctr(&["task", "pause", "frozen"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(cd.task_status("frozen").as_deref(), Some("PAUSED"));
    for &p in &vm_pids {
        let states = thread_states(p);
        assert!(
            !states.is_empty() && states.iter().all(|&s| s == 'T'),
            "VM process {p} not stopped while paused: {states:?}"
        );
    }
    let out = cd.ctr(&["task", "exec", "--exec-id", "e1", "frozen", "true"]);
    assert_ne!(out.code, 0, "exec in a paused VM: {out:?}");
    assert!(out.stderr.contains("paused"), "{out:?}");
    let out = cd.ctr(&["task", "resume", "frozen"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(cd.task_status("frozen").as_deref(), Some("RUNNING"));
    let out = cd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e2",
        "frozen",
        "echo",
        "thawed",
    ]);
    assert_eq!((out.code, out.stdout.as_str()), (0, "thawed\n"), "{out:?}");
    // A paused container still goes away with kill and delete.
    assert_eq!(cd.ctr(&["task", "pause", "frozen"]).code, 0);
    cd.kill_and_delete("frozen");
    for &p in &vm_pids {
        assert!(!alive(p), "VM process {p} left");
    }
}

#[test]
fn metrics_are_the_vms_host_usage() {
    preflight!("metrics_are_the_vms_host_usage");
    let cd = Containerd::start();
    cd.run_detached("counted");
    let vm_pids = cd.task_pids("counted");
    let out = cd.ctr(&["task", "metrics", "--format", "json", "counted"]);
    assert_eq!(out.code, 0, "{out:?}");
    let m: serde_json::Value = serde_json::from_str(&out.stdout).expect("metrics JSON");
    eprintln!("    ctr task metrics: {m}");
    // Every process of the VM's groups (the leaders `task ps` lists, and what they run).
    let processes = m["pids"]["current"].as_u64().unwrap_or(0);
    assert!(processes >= vm_pids.len() as u64, "{m}");
    let rss = m["memory"]["usage"]["usage"].as_u64().unwrap_or(0);
    assert!(rss > 16 << 20, "the VM's resident memory: {m}");
    assert!(m["cpu"]["usage"]["total"].as_u64().unwrap_or(0) > 0, "{m}");
    assert!(
        m["memory"]["usage"]["limit"].as_u64().unwrap_or(0) > 0,
        "{m}"
    );
    cd.kill_and_delete("counted");
}

/// The shim socket of container `id`, if it is still on disk (containerd's runtime v2 names
/// it by a hash of the address, namespace and id under /run/containerd/s).
fn leftover_socket(cd: &Containerd, id: &str) -> Option<String> {
    let sock = cd.dir.path().join("c.sock");
    let address = containerd_shim::socket_address(sock.to_str().unwrap(), "shimtest", id);
    let path = address
        .strip_prefix("unix://")
        .unwrap_or(&address)
        .to_string();
    std::path::Path::new(&path).exists().then_some(path)
}

#[test]
fn refused_bundle_fails_ctr_run_with_our_message() {
    preflight!("refused_bundle_fails_ctr_run_with_our_message");
    let cd = Containerd::start();
    let host = cd.dir.path().join("data");
    std::fs::create_dir(&host).unwrap();
    let mount = format!(
        "type=bind,src={},dst=/data,options=rbind:rw",
        host.display()
    );
    let out = cd.run(&["--rm", "--mount", &mount], "rw", &["true"]);
    assert_ne!(out.code, 0, "{out:?}");
    let want = format!(
        "writable host bind mount of {}; only read-only (ro) is allowed",
        host.display()
    );
    assert!(
        out.stderr.contains("refused: mounts[") && out.stderr.contains(&want),
        "{out:?}"
    );
    let out = cd.run(&["--rm", "--privileged"], "priv", &["true"]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("refused: process.capabilities.")
            && out.stderr.contains("beyond the default set"),
        "{out:?}"
    );
    let out = cd.run(&["--rm", "--device", "/dev/null"], "dev", &["true"]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr
            .contains("refused: linux.devices[0]: host device /dev/null cannot be given"),
        "{out:?}"
    );
    // A spec the sandbox refuses (below the memory floor) reaches containerd classified:
    // `invalid argument` naming the field, not an internal error.
    let out = cd.run(&["--rm", "--memory-limit", "1048576"], "small", &["true"]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("guarantees.limits.mem_mib") && out.stderr.contains("invalid argument"),
        "{out:?}"
    );
    // A read-only bind mount is honoured: a read-only disk in the guest.
    std::fs::write(host.join("f"), b"from the host\n").unwrap();
    let mount = format!(
        "type=bind,src={},dst=/data,options=rbind:ro",
        host.display()
    );
    let out = cd.run(&["--rm", "--mount", &mount], "ro", &["cat", "/data/f"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "from the host\n"),
        "{out:?}"
    );
    // Nothing was left by the refused ones.
    assert_eq!(entries(&cd.snapshots().join("refs")), Vec::<String>::new());
}

#[test]
fn policy_comes_from_the_runtime_options() {
    preflight!("policy_comes_from_the_runtime_options");
    let cd = Containerd::start();
    // No runtime options: the strict default. Where only emulation can run a guest, the
    // refusal names the flag; nothing is guessed from the host.
    let out = cd.ctr(&[
        "run",
        "--rm",
        "--runtime",
        common::shim_bin(),
        common::IMAGE,
        "strict",
        "true",
    ]);
    if common::strict_policy_boots() {
        assert_eq!(out.code, 0, "{out:?}");
    } else {
        assert_ne!(out.code, 0, "{out:?}");
        assert!(out.stderr.contains("--allow-emulation"), "{out:?}");
    }
    // The wall limit from the options tears the VM down: the container ends as if SIGKILLed.
    let wall = cd.dir.path().join("wall.toml");
    let base = std::fs::read_to_string(cd.shim_config()).unwrap();
    std::fs::write(&wall, format!("{base}wall_seconds = 3\n")).unwrap();
    let started = std::time::Instant::now();
    let out = cd.ctr(&[
        "run",
        "--rm",
        "--runtime",
        common::shim_bin(),
        "--runtime-config-path",
        wall.to_str().unwrap(),
        common::IMAGE,
        "walled",
        "sleep",
        "1000",
    ]);
    assert_eq!(out.code, 137, "{out:?}\n{}", cd.log());
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    // An unknown key in the options file is refused, naming it.
    let bad = cd.dir.path().join("bad.toml");
    std::fs::write(&bad, "allow_emulaton = true\n").unwrap();
    let out = cd.ctr(&[
        "run",
        "--rm",
        "--runtime",
        common::shim_bin(),
        "--runtime-config-path",
        bad.to_str().unwrap(),
        common::IMAGE,
        "typo",
        "true",
    ]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("unknown field `allow_emulaton`"),
        "{out:?}"
    );
}

#[test]
fn shim_survives_a_containerd_restart() {
    preflight!("shim_survives_a_containerd_restart");
    let mut cd = Containerd::start();
    cd.run_detached("keep");
    let shims = cd.shim_pids();
    cd.restart();
    assert_eq!(cd.shim_pids(), shims, "the same shim still serves");
    assert_eq!(
        cd.task_status("keep").as_deref(),
        Some("RUNNING"),
        "{}",
        cd.log()
    );
    let out = cd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "after",
        "keep",
        "echo",
        "again",
    ]);
    assert_eq!((out.code, out.stdout.as_str()), (0, "again\n"), "{out:?}");
    cd.kill_and_delete("keep");
    cd.wait_for(30, "the shim to exit", || cd.shim_pids().is_empty());
}

#[test]
fn sigkilled_shim_leaves_nothing_running() {
    preflight!("sigkilled_shim_leaves_nothing_running");
    let cd = Containerd::start();
    cd.run_detached("victim");
    let vm_pids = cd.task_pids("victim");
    let shims = cd.shim_pids();
    assert_eq!(shims.len(), 1);
    // SAFETY: kill(2) on the shim process this test's containerd started.
    unsafe { libc::kill(shims[0] as i32, libc::SIGKILL) };
    cd.wait_for(30, "the VM's processes to die with the shim", || {
        vm_pids.iter().all(|p| !alive(*p))
    });
    // containerd notices, runs `containerd-shim-vm-v1 delete`, and marks the task stopped.
    cd.wait_for(30, "containerd to clean up after the dead shim", || {
        cd.task_status("victim").is_none() || cd.task_status("victim").as_deref() == Some("STOPPED")
    });
    cd.wait_for(30, "the root reference and run dir to go", || {
        entries(&cd.snapshots().join("refs")).is_empty() && entries(&cd.run_dir()).is_empty()
    });
    assert_eq!(leftover_socket(&cd, "victim"), None, "shim socket left");
}

#[test]
fn stdin_streams_until_close_io_and_signals_reach_the_guest_process() {
    preflight!("stdin_streams_until_close_io_and_signals_reach_the_guest_process");
    let cd = Containerd::start();
    // `ctr run` passes its stdin through containerd's FIFO; at its end ctr calls CloseIO.
    let mut child = cd
        .run_cmd(&["--rm"], "stdin", &["wc", "-l"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"a\nb\nc\n").unwrap();
    }
    let out = common::Out::from(child.wait_with_output().unwrap());
    assert_eq!(
        (out.code, out.stdout.trim()),
        (0, "3"),
        "{out:?}\n{}",
        cd.log()
    );

    // `ctr task kill` (SIGTERM) reaches the guest process, which traps it and exits 7.
    let script = "trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.1; done";
    let mut child = cd
        .run_cmd(&["--rm"], "term", &["sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "ready\n", "{}", cd.log());
    let out = cd.ctr(&["task", "kill", "term"]);
    assert_eq!(out.code, 0, "{out:?}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!((status.code(), rest.as_str()), (Some(7), "got TERM\n"));
    // Both containers came from one snapshot of one image: one cached root, no reference left.
    let images: Vec<String> = entries(&cd.snapshots())
        .into_iter()
        .filter(|n| n.ends_with(".erofs"))
        .collect();
    assert_eq!(images.len(), 1, "{images:?}");
    assert_eq!(entries(&cd.snapshots().join("refs")), Vec::<String>::new());
}

/// `ctr run -t` on a real pseudo-terminal: the guest shell runs on a terminal (`stty size`
/// answers), follows a window resize (ctr's ResizePty), computes, and `exit 3` ends ctr
/// with 3; then `ctr task exec -t` gets a terminal of its own in a detached container.
#[test]
fn terminal_and_resize_through_ctr_t() {
    use expectrl::{Eof, Expect, Session};
    preflight!("terminal_and_resize_through_ctr_t");
    let cd = Containerd::start();
    let wait = Some(std::time::Duration::from_secs(60));
    let step = |p: &mut expectrl::session::OsSession, want: &str| {
        if let Err(e) = p.expect(want) {
            panic!("waiting for {want:?}: {e}\n{}", cd.log());
        }
    };
    let mut cmd = cd.run_cmd(&["--rm", "-t"], "tty", &["sh"]);
    cmd.stdin(Stdio::inherit());
    let mut p = Session::spawn(cmd).expect("spawning on a pty");
    p.set_expect_timeout(wait);
    p.send_line("echo $((6*7))").unwrap();
    step(&mut p, "42");
    // ctr forwards the new size on SIGWINCH; ask until the guest's terminal has it. ctr
    // installs its SIGWINCH handler only after the task started (its first resize reads the
    // size before): on a loaded host the shell's answer can come first and one change is
    // lost in ctr, so each round changes the size again (the kernel signals only a change).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for round in 0.. {
        if round > 0 {
            p.get_process_mut().set_window_size(100, 32).unwrap();
        }
        p.get_process_mut().set_window_size(101, 33).unwrap();
        p.send_line("echo size=$(stty size)").unwrap();
        p.set_expect_timeout(Some(std::time::Duration::from_secs(2)));
        if p.expect("size=33 101").is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the guest terminal never got 33x101"
        );
    }
    p.set_expect_timeout(wait);
    p.send_line("exit 3").unwrap();
    let _ = p.expect(Eof);
    let status = p.get_process_mut().wait().unwrap();
    // (ptyprocess's own nix WaitStatus: compared by its rendering, `Exited(Pid(N), 3)`.)
    let status = format!("{status:?}");
    assert!(
        status.starts_with("Exited(") && status.ends_with(", 3)"),
        "{status}"
    );

    cd.run_detached("texec");
    let mut cmd = cd.ctr_cmd();
    cmd.args(["task", "exec", "-t", "--exec-id", "t1", "texec", "sh"])
        .stdin(Stdio::inherit());
    let mut p = Session::spawn(cmd).expect("spawning on a pty");
    p.set_expect_timeout(wait);
    p.send_line("echo in-exec-$((2+2)); exit 4").unwrap();
    step(&mut p, "in-exec-4");
    let _ = p.expect(Eof);
    let status = p.get_process_mut().wait().unwrap();
    let status = format!("{status:?}");
    assert!(
        status.starts_with("Exited(") && status.ends_with(", 4)"),
        "{status}"
    );
    cd.kill_and_delete("texec");
}
