//! The llama.cpp model server through `vm serve` against the same static `llama-server` run
//! directly on the host (the artefacts of `images/llama-server.sh`), measured in one run:
//!
//! - `vm serve --ready /health` start → URL printed (boot, model load) → first successful
//!   completion;
//! - a small greedy completion (`POST /v1/completions`, 4 tokens, one connection per
//!   request) through the forwarded port vs. straight to the host server: requests/s and
//!   p50/p99 latency, and the ratios. The two run alternately in rounds so machine load hits
//!   both alike; both servers get one thread (`-t 1`: the guest has one vCPU);
//! - `GET /health` the same way: next to no model work, so mostly the forward and the guest's
//!   network path rather than emulated arithmetic.
//!
//! `VM_BENCH_ROUNDS` (default 5) × `VM_BENCH_PER_ROUND` (default 20) requests per side.
//! Prints `SKIP llama_serve: <reason>` and exits 0 where the guest or the artefacts are
//! missing (a fact about the host).

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Env;
use common::{http, llama};

const MAX_TOKENS: u32 = 4;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// One `GET /health`; its latency (it must answer 200).
fn health(addr: SocketAddr) -> Duration {
    let t = Instant::now();
    let r = http::get(addr, "/health").unwrap_or_else(|e| panic!("/health via {addr}: {e}"));
    assert_eq!(r.status, 200, "{}", r.body);
    t.elapsed()
}

/// One completion; its latency (it must answer 200 with the tokens asked for).
fn completion(addr: SocketAddr, body: &str) -> Duration {
    let t = Instant::now();
    let r = http::post(addr, "/v1/completions", body)
        .unwrap_or_else(|e| panic!("completion via {addr}: {e}"));
    let took = t.elapsed();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["usage"]["completion_tokens"],
        MAX_TOKENS,
        "{}",
        r.body
    );
    took
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// (requests/s over the summed latencies, p50, p99).
fn summary(lat: &mut [Duration]) -> (f64, Duration, Duration) {
    lat.sort();
    let total: Duration = lat.iter().sum();
    (
        lat.len() as f64 / total.as_secs_f64(),
        percentile(lat, 0.5),
        percentile(lat, 0.99),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn main() {
    let env = Env::new();
    if let Some(why) = common::guest_unavailable(&env) {
        return common::skip("llama_serve", &why);
    }
    let art = match llama::artifacts() {
        Ok(a) => a,
        Err(why) => return common::skip("llama_serve", &why),
    };
    let rounds = env_num("VM_BENCH_ROUNDS", 5);
    let per_round = env_num("VM_BENCH_PER_ROUND", 20);
    let body = llama::completion_body(MAX_TOKENS);
    llama::import(&env, &art);

    let extra: Vec<String> = ["--ready", "/health", "--ready-timeout", "600s"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut args = llama::serve_args(&art, &extra);
    args.extend(["-t".into(), "1".into()]);
    let start = Instant::now();
    let (_guest, guest_addr) = llama::spawn_serve(&env, &args);
    let ready = start.elapsed();
    completion(guest_addr, &body);
    let first = start.elapsed();

    let port = free_port();
    let mut host = common::ChildGuard(
        Command::new(&art.server)
            .arg("-m")
            .arg(art.models.join("tiny.gguf"))
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "-t",
                "1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting llama-server on the host"),
    );
    let host_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    llama::wait_healthy(host_addr, Duration::from_secs(60)).expect("host llama-server");

    // Warm both (first requests fill caches), then alternate rounds.
    for _ in 0..3 {
        completion(guest_addr, &body);
        completion(host_addr, &body);
    }
    let (mut via_vm, mut direct) = (Vec::new(), Vec::new());
    let (mut health_vm, mut health_host) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        via_vm.extend((0..per_round).map(|_| completion(guest_addr, &body)));
        direct.extend((0..per_round).map(|_| completion(host_addr, &body)));
        health_vm.extend((0..per_round).map(|_| health(guest_addr)));
        health_host.extend((0..per_round).map(|_| health(host_addr)));
    }
    let _ = host.0.kill();
    let (vm_rps, vm_p50, vm_p99) = summary(&mut via_vm);
    let (host_rps, host_p50, host_p99) = summary(&mut direct);
    let (hvm_rps, hvm_p50, hvm_p99) = summary(&mut health_vm);
    let (hhost_rps, hhost_p50, hhost_p99) = summary(&mut health_host);
    println!(
        "llama_serve: vm serve start -> ready (URL printed) {ready:.2?}, -> first completion {first:.2?}"
    );
    println!(
        "llama_serve: {} requests each, {MAX_TOKENS}-token greedy completion, one connection per request",
        via_vm.len()
    );
    println!(
        "llama_serve: via vm serve (tcg): {vm_rps:.1} req/s, p50 {vm_p50:.2?}, p99 {vm_p99:.2?}"
    );
    println!(
        "llama_serve: host direct:        {host_rps:.1} req/s, p50 {host_p50:.2?}, p99 {host_p99:.2?}"
    );
    println!(
        "llama_serve: ratio vm/host: throughput {:.3}, p50 {:.1}x, p99 {:.1}x",
        vm_rps / host_rps,
        vm_p50.as_secs_f64() / host_p50.as_secs_f64(),
        vm_p99.as_secs_f64() / host_p99.as_secs_f64()
    );
    println!(
        "llama_serve: GET /health via vm serve: {hvm_rps:.1} req/s, p50 {hvm_p50:.2?}, p99 {hvm_p99:.2?}; \
         direct: {hhost_rps:.1} req/s, p50 {hhost_p50:.2?}, p99 {hhost_p99:.2?}; p50 ratio {:.1}x",
        hvm_p50.as_secs_f64() / hhost_p50.as_secs_f64()
    );
}
