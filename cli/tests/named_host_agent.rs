//! `vm exec NAME`, `vm cp`, `ps`, `stop`, `rm` against the real guest agent server running
//! on the host (no VM), reached through a hybrid-vsock style socket (`CONNECT 1024` ->
//! `OK 1024`) recorded in a VM record, exactly as a supervisor records a booted VM's.
//! This exercises the CLI's side of a named VM — record lookup, the agent protocol,
//! streaming, exit codes, Ctrl-C cancellation, file copy, stale-record cleanup — on any
//! Linux host. The same flow against a real guest is in `lifecycle.rs`.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::Env;
use guest_agent::agent::{Agent, AgentOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixListener;

/// A running "VM" named `box`: the record, a stand-in supervisor process, the agent.
fn write_record(env: &Env, root: &std::path::Path, supervisor: u32, socket: &std::path::Path) {
    let stat = std::fs::read_to_string(format!("/proc/{supervisor}/stat")).unwrap();
    let start: u64 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let spec = serde_json::json!({
        "root": root,
        "image": {"kernel": "/nonexistent", "digests": {}},
        "guarantees": {
            "egress_denied": true,
            "limits": {"vcpus": 1, "mem_mib": 256, "pids": 256, "wall_ms": 0},
            "mounts": [],
            "env": [["PATH", "/usr/sbin:/usr/bin:/sbin:/bin"], ["COLOR", "blue"]]
        }
    });
    let record = serde_json::json!({
        "version": 1, "name": "box", "state": "running",
        "supervisor": {"pid": supervisor, "start_ticks": start},
        "driver": "host-agent", "containment": "none", "created_unix": 1, "started_unix": 2,
        "exited_unix": null, "exit_reason": null, "agent_socket": socket,
        "host_pids": [], "mem_mib": 256, "vcpus": 1,
        "request": {"spec": spec, "trust": "untrusted", "policy": {"allow_emulation": true}, "driver": null, "workdir": null},
        "labels": {"vm.cli": "test", "vm.name": "box", "vm.driver": "host-agent", "vm.trust": "untrusted"}
    });
    std::fs::write(
        env.runtime().join("box/record.json"),
        serde_json::to_vec_pretty(&record).unwrap(),
    )
    .unwrap();
}

async fn vm(env: &Env, args: &[&str]) -> common::Out {
    let mut cmd = tokio::process::Command::new(common::vm_bin());
    cmd.env("VM_RUNTIME_DIR", env.runtime())
        .env_remove("RUST_LOG")
        .args(args);
    common::Out::from(cmd.output().await.unwrap())
}

/// The running "VM" `box`: the agent's root, its socket, the front task, the stand-in
/// supervisor.
struct HostBox {
    root: std::path::PathBuf,
    socket: std::path::PathBuf,
    front: tokio::task::JoinHandle<()>,
    supervisor: std::process::Child,
}

fn start_box(env: &Env) -> HostBox {
    let root = env.dir.path().join("guest-root");
    std::fs::create_dir(&root).unwrap();
    // The boot's token beside the socket, as the drivers leave it: `vm exec NAME` presents it.
    let token = vm_agent_protocol::AgentToken::generate().unwrap();
    let agent = Agent::new(AgentOptions {
        root: root.clone(),
        token: Some(token.clone()),
        ..AgentOptions::default()
    })
    .unwrap();
    std::fs::create_dir(env.runtime().join("box")).unwrap();
    token
        .write_file(&env.runtime().join("box/agent.token"))
        .unwrap();
    let socket = env.runtime().join("box/vsock.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let front = tokio::spawn(vm_test_support::hybrid::front(listener, 1024, {
        let agent = agent.clone();
        move |s| {
            agent.spawn_conn(s);
            async {}
        }
    }));
    let supervisor = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    write_record(env, &root, supervisor.id(), &socket);
    HostBox {
        root,
        socket,
        front,
        supervisor,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_vm_commands_through_the_agent_protocol() {
    let env = Env::new();
    let HostBox {
        root,
        socket,
        front,
        mut supervisor,
    } = start_box(&env);

    // Output streamed to the right descriptors, exit code passed through, the VM's env.
    let out = vm(
        &env,
        &[
            "exec",
            "box",
            "--",
            "sh",
            "-c",
            "echo hi $COLOR; echo oops >&2; exit 7",
        ],
    )
    .await;
    assert_eq!(out.code, 7, "{}", out.stderr);
    assert_eq!(out.stdout, "hi blue\n");
    assert_eq!(out.stderr, "oops\n");
    // -e overrides the VM's environment; -w sets the directory; the default is the root.
    let sub = root.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let out = vm(
        &env,
        &[
            "exec",
            "box",
            "-e",
            "COLOR=red",
            "-w",
            sub.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo $COLOR; pwd",
        ],
    )
    .await;
    assert_eq!(
        (out.code, out.stdout.clone()),
        (0, format!("red\n{}\n", sub.display())),
        "{}",
        out.stderr
    );
    let out = vm(&env, &["exec", "box", "--", "pwd"]).await;
    assert_eq!(out.stdout.trim(), root.to_str().unwrap());
    // -w outside the VM's root runs there (docker's -w: any absolute path); `..` is a usage
    // error, as for a VM booted for one command.
    let out = vm(&env, &["exec", "box", "-w", "/", "--", "pwd"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "/\n"),
        "{}",
        out.stderr
    );
    let out = vm(&env, &["exec", "box", "-w", "/tmp/../etc", "--", "pwd"]).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("'..' is refused"), "{}", out.stderr);
    // A guest command that does not exist or cannot be executed: docker/podman's 127 and
    // 126, with a shell-like line.
    let out = vm(&env, &["exec", "box", "--", "no-such-command"]).await;
    assert_eq!(out.code, 127, "{}", out.stderr);
    assert_eq!(out.stderr, "vm: no-such-command: command not found\n");
    let out = vm(&env, &["exec", "box", "--", root.to_str().unwrap()]).await;
    assert_eq!(out.code, 126, "{}", out.stderr);
    assert!(
        out.stderr
            .starts_with(&format!("vm: {}: cannot execute: ", root.display())),
        "{}",
        out.stderr
    );
    // A secret-looking variable is refused unless allowed.
    let out = vm(&env, &["exec", "box", "-e", "GH_TOKEN=x", "--", "true"]).await;
    assert_eq!(out.code, 126, "{}", out.stderr);
    let out = vm(
        &env,
        &[
            "exec",
            "box",
            "-e",
            "GH_TOKEN=x",
            "--env-allow",
            "GH_TOKEN",
            "--",
            "sh",
            "-c",
            "echo $GH_TOKEN",
        ],
    )
    .await;
    assert_eq!(out.stdout, "x\n", "{}", out.stderr);
    // Signal and timeout codes.
    let out = vm(&env, &["exec", "box", "--", "sh", "-c", "kill -TERM $$"]).await;
    assert_eq!(out.code, 143, "{}", out.stderr);
    let started = Instant::now();
    let out = vm(
        &env,
        &["exec", "box", "--timeout", "1s", "--", "sleep", "30"],
    )
    .await;
    assert_eq!(out.code, 124, "{}", out.stderr);
    assert!(started.elapsed() < Duration::from_secs(20));

    // Ctrl-C cancels the guest command's whole tree and exits 130.
    ctrl_c_cancels_the_tree(&env, &[]).await;

    // cp in and out, confined to the agent's root.
    let host_in = env.dir.path().join("in.txt");
    std::fs::write(&host_in, b"payload\n").unwrap();
    let out = vm(&env, &["cp", host_in.to_str().unwrap(), "box:/data/in.txt"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        std::fs::read(root.join("data/in.txt")).unwrap(),
        b"payload\n"
    );
    let host_out = env.dir.path().join("out.txt");
    // The second copy goes over an existing file: it replaces the content, keeps the mode.
    use std::os::unix::fs::PermissionsExt;
    for over_existing in [false, true] {
        if over_existing {
            std::fs::write(&host_out, b"old and longer content").unwrap();
            let perms = std::fs::Permissions::from_mode(0o600);
            std::fs::set_permissions(&host_out, perms).unwrap();
        }
        let out = vm(
            &env,
            &["cp", "box:/data/in.txt", host_out.to_str().unwrap()],
        )
        .await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert_eq!(std::fs::read(&host_out).unwrap(), b"payload\n");
    }
    let mode = std::fs::metadata(&host_out).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let out = vm(&env, &["cp", "box:/data/in.txt", "-"]).await;
    assert_eq!(out.stdout, "payload\n");
    let out = vm(&env, &["cp", "box:/nope", host_out.to_str().unwrap()]).await;
    assert_eq!(out.code, 125, "{}", out.stderr);

    // ps sees it running; stop signals the supervisor and cleans the socket; rm removes it.
    let ps = vm(&env, &["ps", "--json"]).await.json();
    assert_eq!(ps[0]["state"], "running");
    assert_eq!(ps[0]["labels"]["vm.driver"], "host-agent");
    let out = vm(&env, &["rm", "box"]).await;
    assert_eq!(out.code, 2, "rm of a running VM: {}", out.stderr);
    let stopper = tokio::spawn({
        let runtime = env.runtime();
        async move {
            let mut cmd = tokio::process::Command::new(common::vm_bin());
            cmd.env("VM_RUNTIME_DIR", runtime)
                .args(["stop", "--time", "5", "box"]);
            common::Out::from(cmd.output().await.unwrap())
        }
    });
    // Reap the stand-in supervisor once it got the SIGTERM, as init would.
    let status = tokio::task::spawn_blocking(move || supervisor.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), None, "the supervisor was not signalled");
    let out = stopper.await.unwrap();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!socket.exists(), "socket left behind");
    let ps = vm(&env, &["ps", "--json"]).await.json();
    assert_eq!(ps[0]["state"], "exited");
    let out = vm(&env, &["exec", "box", "--", "true"]).await;
    assert_eq!(out.code, 125);
    let out = vm(&env, &["rm", "box"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(common::files_under(&env.runtime()).is_empty());
    front.abort();
}

/// `vm exec FLAGS box` of a command that leaves a grandchild: SIGINT to `vm` exits 130
/// and the grandchild is gone. `stdin` stays open (a pipe nobody writes) for `-i`.
async fn ctrl_c_cancels_the_tree(env: &Env, flags: &[&str]) {
    let mut child = tokio::process::Command::new(common::vm_bin())
        .env("VM_RUNTIME_DIR", env.runtime())
        .arg("exec")
        .args(flags)
        .args(["box", "--", "sh", "-c", "sleep 600 & echo $!; wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let grandchild: u32 = lines
        .next_line()
        .await
        .unwrap()
        .expect("no output streamed")
        .trim()
        .parse()
        .unwrap();
    assert!(common::pid_alive(grandchild));
    // Our own child process.
    vm_sys::control::signal(child.id().unwrap(), vm_sys::control::Signal::Interrupt).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(130), "flags {flags:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::pid_alive(grandchild) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !common::pid_alive(grandchild),
        "the guest command's child survived the cancel (flags {flags:?})"
    );
}

/// `-i` and `-t` against the same agent: stdin piped through (and its early end), `-t`
/// without a terminal refused, and an interactive shell typed on a real terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_exec_in_a_named_vm() {
    let env = Env::new();
    let b = start_box(&env);
    let out = common::tty::with_stdin(&env, &["exec", "-i", "box", "--", "wc", "-l"], b"a\nb\n");
    assert_eq!((out.code, out.stdout.trim()), (0, "2"), "{}", out.stderr);
    // Without -i the command's stdin is empty.
    let out = common::tty::with_stdin(&env, &["exec", "box", "--", "wc", "-c"], b"ignored");
    assert_eq!(out.stdout.trim(), "0", "{}", out.stderr);
    // Stdin that ends at once: the guest sees EOF, nothing hangs.
    let started = Instant::now();
    let out = common::tty::with_stdin(
        &env,
        &["exec", "-i", "box", "--", "sh", "-c", "cat; echo eof"],
        b"",
    );
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "eof\n"),
        "{}",
        out.stderr
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // -t needs a terminal on stdin.
    let out = common::tty::with_stdin(&env, &["exec", "-it", "box", "--", "sh"], b"");
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("not a terminal"), "{}", out.stderr);
    // Without -t, Ctrl-C still cancels the tree, also while stdin is open.
    ctrl_c_cancels_the_tree(&env, &["-i"]).await;
    tokio::task::spawn_blocking(move || {
        common::tty::shell_session(
            &env,
            &["exec", "-it", "-e", "PS1=gp> ", "box", "--", "sh"],
            Duration::from_secs(20),
        );
        env
    })
    .await
    .unwrap();
    let mut supervisor = b.supervisor;
    let _ = supervisor.kill();
    let _ = supervisor.wait();
    b.front.abort();
}

/// Names in `dir`, sorted (temporary files of a copy start with `.`).
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `vm cp` streams: a 2 GiB sparse file goes in and comes back with the same sha256 while each
/// `vm cp` peaks below the documented RSS bound, holes stay holes on both sides; a file over
/// `--max-size` and a non-regular source are refused before any byte moves, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_streams_two_gib_with_flat_memory_and_refuses_before_copying() {
    use common::copy::{self, MIB};
    let env = Env::new();
    let HostBox {
        root,
        front,
        mut supervisor,
        ..
    } = start_box(&env);
    let src = env.dir.path().join("big.bin");
    copy::sparse_file(&src, 2048 * MIB);
    let want = copy::sha256_of(&src);
    let src_s = src.to_str().unwrap();

    let (out, hwm_in) = tokio::task::block_in_place(|| {
        copy::run_peak_rss(
            &env,
            &["cp", "--max-size", "3G", src_s, "box:/data/big.bin"],
        )
    });
    assert_eq!(out.code, 0, "{}", out.stderr);
    let inside = root.join("data/big.bin");
    assert_eq!(std::fs::metadata(&inside).unwrap().len(), 2048 * MIB);
    assert_eq!(copy::sha256_of(&inside), want, "changed on the way in");
    assert!(copy::allocated(&inside) < 64 * MIB, "holes not kept inside");
    let back = env.dir.path().join("back.bin");
    let back_s = back.to_str().unwrap();
    let (out, hwm_out) = tokio::task::block_in_place(|| {
        copy::run_peak_rss(
            &env,
            &["cp", "--max-size", "3G", "box:/data/big.bin", back_s],
        )
    });
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(copy::sha256_of(&back), want, "changed on the way out");
    assert!(copy::allocated(&back) < 64 * MIB, "holes not kept outside");
    eprintln!("vm cp of 2 GiB: peak RSS {hwm_in} KiB in, {hwm_out} KiB out");
    for hwm in [hwm_in, hwm_out] {
        assert!(
            hwm < copy::VM_CP_HWM_BOUND_KIB,
            "vm cp peaked at {hwm} KiB (bound {} KiB)",
            copy::VM_CP_HWM_BOUND_KIB
        );
    }

    // Over the cap (the default, 1 GiB): refused before the copy, both ways, nothing left.
    let out = vm(&env, &["cp", src_s, "box:/data/capped.bin"]).await;
    assert_eq!(out.code, 125, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "{src_s}: 2147483648 bytes is over the copy cap of 1073741824 bytes"
        )),
        "{}",
        out.stderr
    );
    assert_eq!(names(&root.join("data")), ["big.bin"]);
    let capped = env.dir.path().join("capped.bin");
    let out = vm(
        &env,
        &[
            "cp",
            "--max-size",
            "1G",
            "box:/data/big.bin",
            capped.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(out.code, 125, "{}", out.stderr);
    assert!(
        out.stderr.contains("over the cap of 1073741824 bytes"),
        "{}",
        out.stderr
    );
    assert!(!capped.exists());
    assert!(
        !names(env.dir.path()).iter().any(|n| n.contains(".vm-cp-")),
        "{:?}",
        names(env.dir.path())
    );

    // A source that grows past the cap while it is copied in: refused mid-stream, and the
    // agent removes its temporary file (no half file in the guest).
    let mut cp = tokio::process::Command::new(common::vm_bin())
        .env("VM_RUNTIME_DIR", env.runtime())
        .args(["cp", "--max-size", "3G", src_s, "box:/data/grow.bin"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !names(&root.join("data"))
        .iter()
        .any(|n| n.starts_with(".grow.bin.vm-part-"))
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the copy never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&src)
        .unwrap()
        .set_len(4096 * MIB)
        .unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(cp.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    let status = cp.wait().await.unwrap();
    assert_eq!(status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{src_s} grew past the copy cap of 3221225472 bytes while being copied"
        )),
        "{stderr}"
    );
    let end = Instant::now() + Duration::from_secs(5);
    while names(&root.join("data")) != ["big.bin"] && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(names(&root.join("data")), ["big.bin"]);

    // Not a regular file: refused up front, named in the error, never read.
    let fifo = env.dir.path().join("fifo");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    for (source, kind) in [
        ("/dev/zero", "a character device"),
        (fifo.to_str().unwrap(), "a FIFO"),
        (env.dir.path().to_str().unwrap(), "a directory"),
    ] {
        let out = vm(&env, &["cp", source, "box:/data/x"]).await;
        assert_eq!(out.code, 125, "{source}: {}", out.stderr);
        assert!(
            out.stderr
                .contains(&format!("{source}: not a regular file ({kind})")),
            "{source}: {}",
            out.stderr
        );
    }
    assert_eq!(names(&root.join("data")), ["big.bin"]);

    front.abort();
    let _ = supervisor.kill();
    let _ = supervisor.wait();
}
