//! PID-1 duties, checked against a real guest (QEMU TCG) that `tests/guest/run-tcg.sh` boots.
//!
//! Runs only when `VM_AGENT_GUEST_SOCK` names the hybrid-vsock socket of such a guest (and
//! `VM_AGENT_GUEST_TOKEN` the token file the runner put in its initramfs), booted
//! with `vm.hostname=agent-test vm.pids=64 vm.mem=64 vm.disk=data0:/mnt/data:ext4
//! vm.disk=raw0:/dev/data-raw:raw` (an ext4 disk holding `hello.txt` = "hello from disk", and
//! any raw disk); otherwise each test prints a SKIP line. The tests run in order in one
//! function because the last step powers the guest off.
mod common;

use std::time::Duration;

use vm_agent_client::AgentClient;
use vm_agent_protocol::{ExecRequest, ServeRequest};

fn client() -> Option<(AgentClient, String)> {
    let sock = std::env::var("VM_AGENT_GUEST_SOCK").ok()?;
    let token_file = std::env::var("VM_AGENT_GUEST_TOKEN").expect("VM_AGENT_GUEST_TOKEN");
    let hex = std::fs::read_to_string(&token_file).expect("token file");
    let token = vm_agent_protocol::AgentToken::read_file(token_file.as_ref()).expect("token");
    let c = AgentClient::hybrid_vsock(sock, vm_agent_protocol::AGENT_PORT).with_token(token);
    Some((c, hex.trim().to_string()))
}

async fn sh(c: &AgentClient, line: &str) -> (String, vm_agent_protocol::ExitStatus) {
    let mut req = ExecRequest::shell(line);
    req.env = vec![("PATH".into(), "/bin:/sbin:/usr/bin".into())];
    req.timeout = Some(Duration::from_secs(120));
    let t0 = std::time::Instant::now();
    let out = c.exec(req).await.unwrap_or_else(|e| panic!("{line}: {e}"));
    eprintln!("guest: {:?} for {line:.40}", t0.elapsed());
    (
        String::from_utf8_lossy(&out.output).into_owned(),
        out.status,
    )
}

/// The `oom_kill` count of a cgroup2 `memory.events` file.
fn oom_kills(events: &str) -> u64 {
    events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no oom_kill count in memory.events: {events}"))
}

#[tokio::test]
async fn pid1_duties_in_a_guest() {
    let Some((c, token_hex)) = client() else {
        common::skip(
            "pid1_duties_in_a_guest",
            "VM_AGENT_GUEST_SOCK not set (boot one with tests/guest/run-tcg.sh)",
        );
        return;
    };
    let info = c.wait_ready(Duration::from_secs(120)).await.unwrap();
    assert!(info.pid1, "{info:?}");
    // Without the token the agent says nothing and runs nothing.
    let stranger = AgentClient::hybrid_vsock(
        std::env::var("VM_AGENT_GUEST_SOCK").unwrap(),
        vm_agent_protocol::AGENT_PORT,
    );
    let e = stranger.ping().await.unwrap_err();
    assert!(
        e.agent_kind().is_none(),
        "tokenless client got a reply: {e}"
    );
    secret_stays_with_the_agent(&c, &token_hex).await;
    assert!(info.cgroups, "{info:?}");
    assert_eq!(info.hostname, "agent-test");

    let (out, _) = sh(
        &c,
        "hostname; cat /proc/1/cmdline | tr '\\0' ' '; echo; env",
    )
    .await;
    let mut l = out.lines();
    assert_eq!(l.next(), Some("agent-test"));
    assert_eq!(l.next().map(str::trim), Some("/init"));
    // Only PATH was given; the kernel's HOME/TERM for init must not leak (busybox sh adds
    // SHLVL and PWD itself).
    let mut names: Vec<&str> = l.filter_map(|v| v.split('=').next()).collect();
    names.sort();
    assert_eq!(names, ["PATH", "PWD", "SHLVL"], "{out}");

    let (out, _) = sh(&c, "cat /proc/mounts").await;
    for m in [
        " /proc proc ",
        " /sys sysfs ",
        " /dev devtmpfs ",
        " /tmp tmpfs ",
        " /sys/fs/cgroup cgroup2 ",
    ] {
        assert!(out.contains(m), "missing mount {m:?} in {out}");
    }
    assert!(
        out.contains(" /mnt/data ext4 ro"),
        "disk not mounted ro: {out}"
    );
    let (out, _) = sh(&c, "cat /mnt/data/hello.txt; touch /mnt/data/x 2>&1; readlink /dev/data-raw; cat /sys/block/$(basename $(readlink /dev/data-raw))/ro").await;
    assert!(out.starts_with("hello from disk"), "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[lines.len() - 2].starts_with("/dev/vd"),
        "raw disk link: {out}"
    );
    assert_eq!(lines[lines.len() - 1], "1", "raw disk not read-only: {out}");

    // lo is up: a guest-side TCP listener is reachable through Forward.
    let id = c
        .serve_start(ServeRequest {
            command: vm_agent_protocol::Command::Shell(
                "while true; do echo pong | nc -l -p 7000; done".into(),
            ),
            env: vec![("PATH".into(), "/bin".into())],
            cwd: None,
            user: None,
        })
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..50 {
        if let Ok(mut s) = c.forward(7000).await {
            use tokio::io::AsyncReadExt;
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
            if !got.is_empty() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(got, b"pong\n");
    c.serve_stop(id).await.unwrap();

    // The agent is protected from the OOM killer; its cgroup limits are in place.
    let (out, _) = sh(&c, "cat /proc/1/oom_score_adj /sys/fs/cgroup/work/pids.max /sys/fs/cgroup/work/memory.max; cat /proc/self/oom_score_adj; cat /proc/self/cgroup").await;
    let l: Vec<&str> = out.lines().collect();
    assert_eq!(&l[..4], ["-1000", "64", "67108864", "0"], "{out}");
    assert!(l[4].starts_with("0::/work/exec-"), "{out}");

    // Fork bomb: pids.max makes fork fail with EAGAIN; the agent survives.
    let (out, _) = sh(
        &c,
        "i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); done 2>&1; echo end",
    )
    .await;
    assert!(
        out.contains("Resource temporarily unavailable") || out.contains("can't fork"),
        "{out}"
    );
    // Memory past memory.max: the allocating process is OOM-killed, not the agent, and the
    // kill is counted in the work cgroup's (hierarchical) memory.events.
    let (events, _) = sh(&c, "cat /sys/fs/cgroup/work/memory.events").await;
    let oom_kills_before = oom_kills(&events);
    let (_, st) = sh(
        &c,
        "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived",
    )
    .await;
    assert_eq!(st.signal, Some(9), "{st:?}");
    let (out, _) = sh(&c, "echo after; cat /sys/fs/cgroup/work/memory.events").await;
    let events = out
        .strip_prefix("after\n")
        .unwrap_or_else(|| panic!("the agent did not run the next command: {out}"));
    let oom_kills_after = oom_kills(events);
    assert!(
        oom_kills_after > oom_kills_before,
        "memory.events oom_kill {oom_kills_before} -> {oom_kills_after}: {events}"
    );

    // Cancel kills a grandchild through cgroup.kill, even one that left the process group.
    let mut s = c
        .exec_stream(ExecRequest {
            env: vec![("PATH".into(), "/bin".into())],
            ..ExecRequest::shell("setsid sleep 300 & echo $!; sleep 300")
        })
        .await
        .unwrap();
    let mut seen = Vec::new();
    let pid = loop {
        match s.next().await.unwrap() {
            Some(vm_agent_client::ExecEvent::Stdout(b)) => {
                break String::from_utf8_lossy(&b).trim().to_string();
            }
            Some(ev) => seen.push(ev),
            None => panic!("no pid printed: {seen:?}"),
        }
    };
    s.cancel().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (out, _) = sh(
        &c,
        &format!("kill -0 {pid} 2>/dev/null && echo alive || echo gone; ls /sys/fs/cgroup/work"),
    )
    .await;
    let mut l = out.lines();
    assert_eq!(l.next(), Some("gone"), "grandchild {pid}: {out}");
    // Finished execs and stopped serves leave no leaf cgroups behind (only this exec's own).
    let leaves: Vec<&str> = l
        .filter(|n| n.starts_with("exec-") || n.starts_with("serve-"))
        .collect();
    assert_eq!(leaves.len(), 1, "{out}");

    large_transfers_and_forward_eof(&c).await;
    let c = resume_reseeds_and_publishes_the_generation(&c).await;

    // Shutdown ends the VM (the runner checks that QEMU exits).
    c.shutdown().await.unwrap();
}

/// `Resume` as PID 1 in a real guest kernel: the host's entropy added (`RNDADDENTROPY`) and
/// the CRNG reseeded (`RNDRESEEDCRNG`): the request fails if either ioctl does; then the
/// generation in `/run/vm/generation`, the clock stepped to the host's, and only the new
/// token answered; `boot_id` is new (our kernel's patch: a forced reseed renews it, which
/// Linux alone never does). Returns the client with the new token.
async fn resume_reseeds_and_publishes_the_generation(c: &AgentClient) -> AgentClient {
    let boot_id = "cat /proc/sys/kernel/random/boot_id";
    let (before, _) = sh(c, &format!("{boot_id}; {boot_id}")).await;
    let mut ids = before.lines();
    let first = ids.next().unwrap_or_default().to_string();
    assert!(
        first.len() == 36 && ids.next() == Some(first.as_str()),
        "boot_id is stable between reads: {before:?}"
    );
    let new = c
        .resume(vm_agent_protocol::AgentToken::generate().unwrap(), 3)
        .await
        .unwrap_or_else(|e| panic!("resume as PID 1: {}", vm_error_chain::error_chain(&e)));
    let host_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (out, _) = sh(
        &new,
        "cat /run/vm/generation; ls -l /run/vm/generation; date +%s",
    )
    .await;
    let mut l = out.lines();
    assert_eq!(l.next(), Some("3"), "{out}");
    assert!(
        l.next().is_some_and(|m| m.starts_with("-r--r--r--")),
        "{out}"
    );
    let guest_secs: u64 = l.next().and_then(|d| d.trim().parse().ok()).expect("date");
    assert!(
        guest_secs.abs_diff(host_secs) <= 30,
        "guest {guest_secs}, host {host_secs}"
    );
    assert!(c.ping().await.is_err(), "the old token still answered");
    let (after, _) = sh(&new, boot_id).await;
    let after = after.trim();
    assert!(
        after.len() == 36 && after != first,
        "boot_id after the resume: {after:?}, before: {first:?}"
    );
    new
}

/// Guest root cannot find the token: it is gone from the rootfs, absent from the command line,
/// and the agent's memory, environment and fds are closed to commands (non-dumpable agent,
/// `CAP_SYS_PTRACE`/`CAP_SYS_RAWIO` out of the bounding set); no `/dev/mem` or `/proc/kcore`.
async fn secret_stays_with_the_agent(c: &AgentClient, token_hex: &str) {
    let probes = [
        "id -u",
        "ls /vm-agent.token",
        "head -c 64 /proc/1/mem",
        "cat /proc/1/environ",
        "cat /proc/1/fd/3",
        "ls /dev/mem /proc/kcore",
        "grep -c vm-agent /proc/cmdline",
        "grep CapBnd /proc/self/status",
    ];
    let line = probes
        .iter()
        .map(|p| format!("echo \"## {p}\"; {p} 2>&1"))
        .collect::<Vec<_>>()
        .join("; ");
    let (out, _) = sh(c, &line).await;
    assert!(
        !out.contains(token_hex),
        "token visible to guest code: {out}"
    );
    let section = |p: &str| {
        let start = out.find(&format!("## {p}\n")).unwrap() + p.len() + 4;
        let rest = &out[start..];
        rest[..rest.find("## ").unwrap_or(rest.len())].to_string()
    };
    assert_eq!(section("id -u").trim(), "0", "{out}");
    assert!(
        section("ls /vm-agent.token").contains("No such file"),
        "{out}"
    );
    for p in [
        "head -c 64 /proc/1/mem",
        "cat /proc/1/environ",
        "cat /proc/1/fd/3",
    ] {
        assert!(section(p).contains("Permission denied"), "{p}: {out}");
    }
    assert_eq!(
        section("ls /dev/mem /proc/kcore")
            .matches("No such file")
            .count(),
        2
    );
    assert_eq!(
        section("grep -c vm-agent /proc/cmdline").trim(),
        "0",
        "{out}"
    );
    let bnd = section("grep CapBnd /proc/self/status");
    let hex = bnd.split_whitespace().nth(1).expect("CapBnd value");
    let caps = u64::from_str_radix(hex, 16).unwrap();
    assert_eq!(caps & (1 << 19), 0, "CAP_SYS_PTRACE in bounding set: {bnd}");
    assert_eq!(caps & (1 << 17), 0, "CAP_SYS_RAWIO in bounding set: {bnd}");
    assert_ne!(
        caps & (1 << 21),
        0,
        "CAP_SYS_ADMIN unexpectedly gone: {bnd}"
    );
}

/// Guest -> host transfers far above 32 KiB arrive whole (the agent's writes are bounded so
/// no vsock packet becomes a multi-descriptor one), and a forwarded connection that the guest
/// server closes reaches EOF on the host (the agent closes the vsock stream in full).
async fn large_transfers_and_forward_eof(c: &AgentClient) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let blob: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    c.write_file("/tmp", "blob", &blob).await.unwrap();
    let t0 = std::time::Instant::now();
    let back = tokio::time::timeout(Duration::from_secs(60), c.read_file("/tmp", "blob"))
        .await
        .expect("read_file of 300 KB timed out")
        .unwrap();
    eprintln!("guest: {:?} for read_file of 300 KB", t0.elapsed());
    assert!(
        back == blob,
        "read_file returned {} different bytes",
        back.len()
    );

    let (out, st) = sh(c, "seq 1 300000").await;
    let want: String = (1..=300_000).map(|i| format!("{i}\n")).collect();
    assert_eq!(st.code, Some(0), "{st:?}");
    assert_eq!(out.len(), want.len());
    assert!(out == want, "seq output differs");

    // busybox httpd answers an HTTP/1.0 GET and closes; the host must see EOF.
    let page: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    c.write_file("/tmp", "www/index.html", &page).await.unwrap();
    let id = c
        .serve_start(ServeRequest {
            command: vm_agent_protocol::Command::Shell(
                "exec httpd -f -p 127.0.0.1:8080 -h /tmp/www".into(),
            ),
            env: vec![("PATH".into(), "/bin".into())],
            cwd: None,
            user: None,
        })
        .await
        .unwrap();
    let mut answer = Vec::new();
    for attempt in 0.. {
        let mut s = match c.forward(8080).await {
            Ok(s) => s,
            Err(e) if attempt < 50 => {
                eprintln!("guest: forward not ready: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(e) => panic!("forward to httpd: {e}"),
        };
        s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let t0 = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut answer))
            .await
            .expect("no EOF from a forwarded connection the guest server closed")
            .unwrap();
        eprintln!("guest: {:?} for a forwarded GET", t0.elapsed());
        break;
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.") && text.contains(" 200 OK"),
        "{text:.200}"
    );
    assert!(
        answer.ends_with(&page),
        "body differs ({} bytes answered)",
        answer.len()
    );
    c.serve_stop(id).await.unwrap();
}
