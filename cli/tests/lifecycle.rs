//! `vm` against a real guest under the tcg driver: output and exit-code passthrough,
//! interrupt and timeout codes, and the `run -d` / `exec NAME` / `cp` / `ps` / `stop` /
//! `rm` lifecycle with no leftovers. When the built-in images are not built or tcg is
//! unavailable each test fails, naming why (a SKIP only with `VM_TEST_ALLOW_NO_DRIVER=1`).

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::Env;

/// Longer than tokio's default blocking-thread keep-alive (10 s) plus a margin.
const IDLE_PAST_KEEP_ALIVE: Duration = Duration::from_secs(16);

#[test]
fn exec_passes_output_and_exit_code_through() {
    let env = Env::new();
    if common::no_guest_here(&env, "exec_passes_output_and_exit_code_through") {
        return;
    }
    let out = env.run(&[
        "exec",
        "--allow-emulation",
        "--",
        "sh",
        "-c",
        "echo hi; echo oops >&2; exit 7",
    ]);
    assert_eq!(out.code, 7, "stderr: {}", out.stderr);
    assert_eq!(out.stdout, "hi\n");
    assert!(out.stderr.contains("oops"), "{}", out.stderr);
    // A signal-killed guest command maps to 128+N.
    let out = env.run(&["exec", "--allow-emulation", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.code, 137, "stderr: {}", out.stderr);
    // -e and -w reach the command.
    let out = env.run(&[
        "exec",
        "--allow-emulation",
        "-e",
        "GREETING=hello",
        "-w",
        "/work",
        "--",
        "sh",
        "-c",
        "echo $GREETING; pwd",
    ]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(out.stdout, "hello\n/work\n");
    // Any absolute guest directory, outside the root /work too (docker's -w).
    let out = env.run(&["exec", "--allow-emulation", "-w", "/tmp/", "--", "pwd"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "/tmp\n"),
        "{}",
        out.stderr
    );
}

#[test]
fn exec_timeout_exits_124() {
    let env = Env::new();
    if common::no_guest_here(&env, "exec_timeout_exits_124") {
        return;
    }
    let started = Instant::now();
    let out = env.run(&[
        "exec",
        "--allow-emulation",
        "--timeout",
        "20s",
        "--",
        "sleep",
        "600",
    ]);
    assert_eq!(out.code, 124, "stderr: {}", out.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
}

/// Starts `vm ARGS` with piped output and waits for the guest command's first output line,
/// which must be `started`.
fn spawn_until_started(env: &Env, args: &[&str]) -> common::ChildGuard {
    let mut child = common::ChildGuard(
        env.cmd()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = child.0.stdout.take().unwrap();
    let mut buf = [0u8; 8];
    stdout
        .read_exact(&mut buf)
        .expect("the command's output was not streamed");
    assert_eq!(&buf, b"started\n");
    child
}

/// SIGINT to `vm`, which must exit 130 within 30 s.
fn interrupt_expecting_130(child: &mut common::ChildGuard) {
    let sent = Instant::now();
    // Our own unreaped child.
    vm_sys::control::signal(child.0.id(), vm_sys::control::Signal::Interrupt).unwrap();
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        sent.elapsed() < Duration::from_secs(30),
        "{:?}",
        sent.elapsed()
    );
}

#[test]
fn ctrl_c_cancels_the_guest_command_and_exits_130() {
    let env = Env::new();
    if common::no_guest_here(&env, "ctrl_c_cancels_the_guest_command_and_exits_130") {
        return;
    }
    // A one-shot `vm exec`: Ctrl-C exits 130 and the VM's host processes (QEMU and the vsock
    // backend, children of `vm`) are gone with it.
    let mut child = spawn_until_started(
        &env,
        &[
            "exec",
            "--allow-emulation",
            "--",
            "sh",
            "-c",
            "echo started; sleep 600",
        ],
    );
    let vm_processes = common::descendants(child.0.id());
    assert!(
        !vm_processes.is_empty(),
        "no host process of the VM found under vm"
    );
    interrupt_expecting_130(&mut child);
    for pid in &vm_processes {
        assert!(
            !common::pid_alive(*pid),
            "VM host process {pid} outlived the interrupted vm exec"
        );
    }

    // In a named VM that outlives the command: Ctrl-C kills the guest command's whole
    // tree (a background grandchild included), and the VM itself keeps running.
    let _cleanup = common::VmGuard {
        env: &env,
        name: "intr",
    };
    let out = env.run(&["run", "-d", "--name", "intr", "--allow-emulation"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let mut child = spawn_until_started(
        &env,
        &[
            "exec",
            "intr",
            "--",
            "sh",
            "-c",
            "sleep 601 & echo started; sleep 602",
        ],
    );
    let out = env.run(&["exec", "intr", "--", "ps"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    for sleeper in ["sleep 601", "sleep 602"] {
        assert!(out.stdout.contains(sleeper), "before: {}", out.stdout);
    }
    interrupt_expecting_130(&mut child);
    let out = env.run(&["exec", "intr", "--", "ps"]);
    assert_eq!(out.code, 0, "the VM did not survive: {}", out.stderr);
    let left: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains("sleep 60"))
        .collect();
    assert_eq!(left, Vec::<&str>::new(), "guest command tree left behind");
}

#[test]
fn run_exec_cp_ps_stop_rm_lifecycle() {
    let env = Env::new();
    if common::no_guest_here(&env, "run_exec_cp_ps_stop_rm_lifecycle") {
        return;
    }
    let _cleanup = common::VmGuard {
        env: &env,
        name: "box",
    };
    let out = env.run(&[
        "run",
        "-d",
        "--name",
        "box",
        "--allow-emulation",
        "--timeout",
        "10m",
        "-e",
        "COLOR=blue",
    ]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(out.stdout.trim(), "box");

    let ps = env.run(&["ps", "--json"]).json();
    assert_eq!(ps[0]["name"], "box");
    assert_eq!(ps[0]["state"], "running");
    assert_eq!(ps[0]["driver"], "tcg");
    assert_eq!(ps[0]["labels"]["vm.trust"], "untrusted");
    assert_eq!(ps[0]["labels"]["vm.driver"], "tcg");
    let supervisor = ps[0]["supervisor_pid"].as_u64().unwrap() as u32;
    assert!(common::pid_alive(supervisor));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.runtime().join("box/record.json")).unwrap())
            .unwrap();
    let host_pids: Vec<u32> = record["host_pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap() as u32)
        .collect();
    assert!(!host_pids.is_empty(), "no VM processes recorded");
    let socket = std::path::PathBuf::from(record["agent_socket"].as_str().unwrap());
    assert!(socket.exists());
    assert!(
        socket.starts_with(env.runtime().join("box")),
        "agent socket {} is not in the VM's state dir",
        socket.display()
    );

    // The VM survives idling past tokio's blocking-thread keep-alive (10 s): the supervisor
    // booted it on a blocking thread that has retired by now, and the VM's helper processes
    // carry PR_SET_PDEATHSIG, so they must not have been forked from that thread.
    std::thread::sleep(IDLE_PAST_KEEP_ALIVE);
    for pid in &host_pids {
        assert!(
            common::pid_alive(*pid),
            "VM process {pid} died while the VM was idle"
        );
    }
    assert!(common::pid_alive(supervisor), "supervisor died while idle");
    let out = env.run(&["exec", "box", "--", "true"]);
    assert_eq!(out.code, 0, "after idling: {}", out.stderr);

    // Several commands in the one VM; state persists between them.
    let out = env.run(&[
        "exec",
        "box",
        "--",
        "sh",
        "-c",
        "echo $((6*7)) > /tmp/answer; echo $COLOR",
    ]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "blue\n"),
        "stderr: {}",
        out.stderr
    );
    let out = env.run(&[
        "exec",
        "box",
        "-e",
        "COLOR=red",
        "--",
        "sh",
        "-c",
        "cat /tmp/answer; echo $COLOR; exit 3",
    ]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (3, "42\nred\n"),
        "stderr: {}",
        out.stderr
    );

    // A missing guest command: 127 with a shell-like line (docker/podman's code).
    let out = env.run(&["exec", "box", "--", "no-such-command"]);
    assert_eq!(out.code, 127, "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains("no-such-command: command not found"),
        "{}",
        out.stderr
    );

    // cp in and out.
    let host_in = env.dir.path().join("in.txt");
    std::fs::write(&host_in, b"payload\n").unwrap();
    let out = env.run(&["cp", host_in.to_str().unwrap(), "box:/tmp/in.txt"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let out = env.run(&["exec", "box", "--", "cat", "/tmp/in.txt"]);
    assert_eq!(out.stdout, "payload\n");
    let host_out = env.dir.path().join("out.txt");
    let out = env.run(&["cp", "box:/tmp/answer", host_out.to_str().unwrap()]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert_eq!(std::fs::read(&host_out).unwrap(), b"42\n");

    // A duplicate name is refused while it runs.
    let out = env.run(&["run", "-d", "--name", "box", "--allow-emulation"]);
    assert_eq!(out.code, 125);
    assert!(out.stderr.contains("already exists"), "{}", out.stderr);
    // rm refuses a running VM without -f.
    let out = env.run(&["rm", "box"]);
    assert_eq!(out.code, 2, "{}", out.stderr);

    let out = env.run(&["stop", "box"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert!(!common::pid_alive(supervisor), "supervisor still alive");
    for pid in &host_pids {
        assert!(!common::pid_alive(*pid), "VM process {pid} left behind");
    }
    assert!(!socket.exists(), "agent socket left behind");
    let ps = env.run(&["ps", "--json"]).json();
    assert_eq!(ps[0]["state"], "exited");
    let out = env.run(&["exec", "box", "--", "true"]);
    assert_eq!(out.code, 125);

    let out = env.run(&["rm", "box"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert!(
        common::files_under(&env.runtime()).is_empty(),
        "{:?}",
        common::files_under(&env.runtime())
    );
}

#[test]
fn rm_force_stops_a_running_vm() {
    let env = Env::new();
    if common::no_guest_here(&env, "rm_force_stops_a_running_vm") {
        return;
    }
    let _cleanup = common::VmGuard {
        env: &env,
        name: "doomed",
    };
    let out = env.run(&["run", "-d", "--name", "doomed", "--allow-emulation"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let supervisor = env.run(&["ps", "--json"]).json()[0]["supervisor_pid"]
        .as_u64()
        .unwrap() as u32;
    let out = env.run(&["rm", "-f", "doomed"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert!(!common::pid_alive(supervisor));
    assert!(common::files_under(&env.runtime()).is_empty());
}

#[test]
fn serve_publishes_a_guest_port_until_ctrl_c() {
    use std::io::{BufRead, BufReader, Write};
    let env = Env::new();
    if common::no_guest_here(&env, "serve_publishes_a_guest_port_until_ctrl_c") {
        return;
    }
    let mut child = common::ChildGuard(
        env.cmd()
            .args([
                "serve",
                "-p",
                "0:8000",
                "--allow-emulation",
                "--",
                "httpd",
                "-f",
                "-p",
                "8000",
                "-h",
                "/work",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = common::http::url_addr(&line);
    assert!(addr.ip().is_loopback(), "{addr}");
    // The server may need a moment to bind inside the guest.
    let deadline = Instant::now() + Duration::from_secs(60);
    let reply = loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect(addr)?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
            // Read the reply's head only: whether the guest's close reaches the host
            // client is the forward's business, not the CLI's.
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut chunk)?;
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Ok(String::from_utf8_lossy(&buf).into_owned())
        })();
        match attempt {
            Ok(r) if r.starts_with("HTTP/1.") => break r,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(500)),
            other => panic!("no HTTP reply from {addr}: {other:?}"),
        }
    };
    assert!(reply.starts_with("HTTP/1."), "{reply}");
    // Our own unreaped child.
    vm_sys::control::signal(child.0.id(), vm_sys::control::Signal::Interrupt).unwrap();
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the port is still published after stop"
    );
}

#[test]
fn named_vm_ends_at_its_wall_lifetime() {
    let env = Env::new();
    if common::no_guest_here(&env, "named_vm_ends_at_its_wall_lifetime") {
        return;
    }
    let _cleanup = common::VmGuard {
        env: &env,
        name: "brief",
    };
    let out = env.run(&[
        "run",
        "-d",
        "--name",
        "brief",
        "--allow-emulation",
        "--timeout",
        "4s",
    ]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let supervisor = env.run(&["ps", "--json"]).json()[0]["supervisor_pid"]
        .as_u64()
        .unwrap() as u32;
    let deadline = Instant::now() + Duration::from_secs(60);
    let ps = loop {
        let ps = env.run(&["ps", "--json"]).json();
        if ps[0]["state"] == "exited" || Instant::now() > deadline {
            break ps;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(ps[0]["state"], "exited", "{ps}");
    assert!(
        ps[0]["exit_reason"].as_str().unwrap().contains("wall"),
        "{ps}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::pid_alive(supervisor) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !common::pid_alive(supervisor),
        "the supervisor outlived its VM"
    );
    let out = env.run(&["exec", "brief", "--", "true"]);
    assert_eq!(out.code, 125);
    assert!(
        out.stderr.contains("wall lifetime expired"),
        "{}",
        out.stderr
    );
    let out = env.run(&["rm", "brief"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
}
