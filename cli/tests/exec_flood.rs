//! Issue 39, handshakes: connections to a named VM's hybrid-vsock socket that each send
//! `CONNECT 1024\n` and then nothing, reopened as they close, made `vm exec NAME -- true` fail
//! with `hybrid vsock handshake failed:` and an empty reason. The guest agent refused the
//! newest connection while its pool of connections in their handshake was full of silent
//! ones (the device's 2 s `CONNECT` deadline never applies to them: they completed it).
//!
//! Here, against a real guest (tcg) started by `vm run -d`: 300 such connections, the flood
//! held while measuring (`vm exec NAME -- true` one after another for 7 s, longer than the
//! agent's 5 s handshake deadline, so a wave of them closed and reopened falls in it), and
//! every `vm exec NAME -- true` during it and the first one after it succeeds within 1 s. The 5,000-connection flood is the slow tier (`#[ignore]`): run it
//! with `cargo nextest run -p vm-cli --test exec_flood --run-ignored ignored-only`.
//! Fails (naming why) when no guest can be booted, unless `VM_TEST_ALLOW_NO_DRIVER=1`.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Env, VmGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The limit for one `vm exec NAME -- true`, the process's whole run.
const EXEC_LIMIT: Duration = Duration::from_secs(1);
/// How long `vm exec` runs one after another while the flood is held: longer than the agent's
/// 5 s handshake deadline, so a wave of silent connections closed and reopened falls in it.
const DURING: Duration = Duration::from_secs(7);

/// What the flood did, counted by its tasks.
#[derive(Default)]
struct Counts {
    /// Connections opened.
    opened: AtomicUsize,
    /// Answered `OK` by the device: the guest accepted them (they "completed CONNECT").
    answered: AtomicUsize,
    /// Open and answered now (silent, held).
    held: AtomicUsize,
}

/// One attacker connection, reopened as it closes until `stop`: connect, `CONNECT 1024\n`,
/// then read (and never write) until the far side closes.
async fn silent_connector(sock: PathBuf, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = UnixStream::connect(&sock).await else {
            // A full listen backlog: try again at once, as an attacker would (yielding).
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        counts.opened.fetch_add(1, Ordering::Relaxed);
        if s.write_all(b"CONNECT 1024\n").await.is_err() {
            continue;
        }
        let mut buf = [0u8; 64];
        let mut answered = false;
        loop {
            let n = tokio::select! {
                r = s.read(&mut buf) => r.unwrap_or(0),
                () = tokio::time::sleep(Duration::from_millis(100)) => {
                    if stop.load(Ordering::Relaxed) { 0 } else { continue }
                }
            };
            if n == 0 {
                break;
            }
            if !answered && buf[..n].starts_with(b"OK ") {
                answered = true;
                counts.answered.fetch_add(1, Ordering::Relaxed);
                counts.held.fetch_add(1, Ordering::Relaxed);
            }
        }
        if answered {
            counts.held.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// One `vm exec NAME -- true`: its wall time, or why it failed.
fn exec_true(env: &Env, name: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let out = env.run(&["exec", name, "--", "true"]);
    let took = t.elapsed();
    if out.code != 0 {
        return Err(format!(
            "exit {} after {took:?}: {}",
            out.code,
            out.stderr.trim()
        ));
    }
    Ok(took)
}

/// Boots `name`, holds `n` silent connections to its socket (reopened as they close), and
/// runs `vm exec NAME -- true` during the flood and once after it.
fn flood_then_exec(test: &str, name: &'static str, n: usize) {
    let env = Env::new();
    if common::no_guest_here(&env, test) {
        return;
    }
    let limit = vm_sys::control::raise_nofile().unwrap_or(0);
    assert!(
        limit >= n as u64 + 512,
        "RLIMIT_NOFILE {limit}: the test needs {} descriptors",
        n + 512
    );
    let _cleanup = VmGuard { env: &env, name };
    let out = env.run(&["run", "-d", "--name", name, "--allow-emulation"]);
    assert_eq!(out.code, 0, "vm run -d: {}", out.stderr);
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(env.runtime().join(name).join("record.json")).unwrap(),
    )
    .unwrap();
    let sock = PathBuf::from(record["agent_socket"].as_str().unwrap());
    exec_true(&env, name).expect("vm exec before the flood");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let tasks: Vec<_> = (0..n)
        .map(|_| rt.spawn(silent_connector(sock.clone(), stop.clone(), counts.clone())))
        .collect();
    // Held: the flood has gone round, every connector at least once answered `OK`.
    let start = Instant::now();
    while counts.answered.load(Ordering::Relaxed) < n && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let ramp = start.elapsed();
    let mut during = Vec::new();
    let mut failed = Vec::new();
    let measuring = Instant::now();
    for i in 0.. {
        if i >= 3 && measuring.elapsed() >= DURING {
            break;
        }
        let held = counts.held.load(Ordering::Relaxed);
        match exec_true(&env, name) {
            Ok(t) => during.push((t, held)),
            Err(e) => failed.push(format!("run {i} ({held} silent connections held): {e}")),
        }
    }
    let (opened, answered) = (
        counts.opened.load(Ordering::Relaxed),
        counts.answered.load(Ordering::Relaxed),
    );
    stop.store(true, Ordering::Relaxed);
    rt.block_on(async {
        for t in tasks {
            let _ = t.await;
        }
    });
    drop(rt);
    let after = exec_true(&env, name);
    let mut times: Vec<Duration> = during.iter().map(|(t, _)| *t).collect();
    times.sort();
    let held: Vec<usize> = during.iter().map(|(_, h)| *h).collect();
    eprintln!(
        "{n} silent connections: {opened} opened, {answered} answered OK (ramp {ramp:?}); \
         {} vm exec during (held {:?}..{:?}): median {:?}, slowest {:?}; after: {after:?}",
        times.len(),
        held.iter().min(),
        held.iter().max(),
        times.get(times.len() / 2),
        times.last(),
    );
    assert!(
        answered >= n,
        "the flood never reached the guest: only {answered} of {n} connections answered OK"
    );
    assert!(
        failed.is_empty(),
        "vm exec failed during the flood: {failed:#?}"
    );
    let slow: Vec<_> = during.iter().filter(|(t, _)| *t >= EXEC_LIMIT).collect();
    assert!(
        slow.is_empty(),
        "vm exec took 1 s or more during the flood: {slow:?}"
    );
    let after = after.expect("vm exec after the flood");
    assert!(after < EXEC_LIMIT, "vm exec after the flood: {after:?}");
    let stop = env.run(&["stop", name]);
    assert_eq!(stop.code, 0, "{}", stop.stderr);
}

#[test]
fn exec_beside_300_silent_connected_clients() {
    flood_then_exec("exec_beside_300_silent_connected_clients", "flood300", 300);
}

#[test]
#[ignore = "slow tier: 5,000 connections against a booted guest"]
fn exec_beside_5000_silent_connected_clients() {
    flood_then_exec("exec_beside_5000_silent_connected_clients", "flood5k", 5000);
}
