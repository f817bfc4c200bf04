//! A real model server in a real guest (tcg here): the python + onnxruntime OCI image that
//! `images/onnx-image.sh` builds, served by `vm serve --image … --memory 256M -v
//! models:/models:ro -p 0:8000 --ready /health`, in ONE guest that goes through, in order:
//! - `vm logs onnx` shows the server's own start line;
//! - its inference endpoint answers exactly what onnxruntime on the host (the same version,
//!   `~/.cache/vm/venv-onnx`) gives for the same model and inputs;
//! - 8 concurrent clients × 50 requests through the forwarded port all succeed, exactly;
//! - 100 clients that disconnect mid-request; afterwards the fds of `vm serve` and of its
//!   VM processes are back to their baseline and the `vm serve` RSS within
//!   [`RSS_MARGIN_KIB`] of it, and the server still answers;
//! - the server runs as the image's non-root user (uid 1000);
//! - the guest has no network (a connect to a host port fails; no interface but `lo`);
//! - the model file is unchanged (sha256) and a write to it from the guest, even as root,
//!   fails (read-only mount);
//! - last, a request that makes the server allocate past the cap (a batch of 2.5 M rows:
//!   40 MB of input, 160 MB per hidden tensor, then ~7.5 M Python floats for the JSON
//!   reply, each allocation small enough to pass the kernel's overcommit check): the guest
//!   kernel OOM-kills it, the VM survives it (its agent still powers it off cleanly),
//!   `vm serve` reports the server's exit (`killed by signal 9`, exit 137), and the host
//!   side stays bounded by the guest's memory.
//!
//! SKIP (counted) when the image is not built (`ci/setup-tests.sh` builds it); fails when no
//! guest can be booted (unless `VM_TEST_ALLOW_NO_DRIVER=1`).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::http::{self, url_addr};
use common::{ChildGuard, Env, VmGuard};
use sha2::{Digest, Sha256};

/// How far above its baseline the `vm serve` RSS may be after the load: glibc keeps freed
/// per-thread arena memory and tokio its worker stacks; a leak per connection (500 + 100
/// of them) would exceed it.
const RSS_MARGIN_KIB: u64 = 8 * 1024;
/// Guest RAM (`--memory`).
const GUEST_MIB: u64 = 256;
/// What the host processes of the VM (QEMU and its vsock backend) may hold beyond the
/// guest's RAM at the OOM moment: QEMU's own code, TCG translation cache and heap.
const HOST_OVERHEAD_MIB: u64 = 384;
/// Rows of the inputs sent (and run on the host) for the exact-match check.
const ROWS: usize = 64;

/// The image the setup built: its directory (oci/, models/, manifest.json) and its name.
struct OnnxImage {
    dir: PathBuf,
    reference: String,
    host_python: PathBuf,
}

fn onnx_image() -> Result<OnnxImage, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/onnx-image.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg("--print-path")
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(
            "the onnxruntime image is not built (images/onnx-image.sh, which \
                    ci/setup-tests.sh runs)"
                .into(),
        );
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let venv = std::env::var_os("VM_ONNX_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/vm/venv-onnx")
        });
    let host_python = venv.join("bin/python");
    if !host_python.exists() {
        return Err(format!("no host onnxruntime venv at {}", venv.display()));
    }
    Ok(OnnxImage {
        dir,
        reference: manifest["ref"].as_str().unwrap().to_string(),
        host_python,
    })
}

/// `ROWS` rows of 4 multiples of 1/8 in [-4, 4] (exact in float32; see make-model.py).
fn inputs() -> Vec<[f64; 4]> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) % 65) as f64 / 8.0 - 4.0
    };
    (0..ROWS)
        .map(|_| [next(), next(), next(), next()])
        .collect()
}

/// What onnxruntime on the host answers for `rows` with the same model.
fn host_outputs(img: &OnnxImage, rows: &[[f64; 4]]) -> Vec<Vec<f64>> {
    let script = "import json, sys, numpy as np, onnxruntime as ort\n\
                  s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n\
                  x = np.asarray(json.load(sys.stdin)['inputs'], dtype=np.float32)\n\
                  print(json.dumps(s.run(['y'], {'x': x})[0].tolist()))";
    let mut child = std::process::Command::new(&img.host_python)
        .args(["-c", script])
        .arg(img.dir.join("models/tiny.onnx"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let body = serde_json::json!({ "inputs": rows }).to_string();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "host onnxruntime failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The guest's answer for `rows`.
fn guest_outputs(addr: SocketAddr, rows: &[[f64; 4]]) -> Vec<Vec<f64>> {
    let body = serde_json::json!({ "inputs": rows }).to_string();
    let reply = http::post(addr, "/v1/infer", &body).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    serde_json::from_value(reply.json()["outputs"].clone()).unwrap()
}

fn sha256(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// A `/proc/PID/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Open fds of `vm serve` and of every process under it (the VM's QEMU and vsock backend),
/// each as "COMM PID fd N -> TARGET", so that a leak names what leaked.
fn tree_fds(pid: u32) -> std::collections::BTreeSet<String> {
    let mut pids = common::descendants(pid);
    pids.push(pid);
    let mut fds = std::collections::BTreeSet::new();
    for p in pids {
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        let Ok(dir) = std::fs::read_dir(format!("/proc/{p}/fd")) else {
            continue;
        };
        for fd in dir.flatten() {
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            let n = fd.file_name();
            fds.insert(format!(
                "{} {p} fd {} -> {}",
                comm.trim(),
                n.to_string_lossy(),
                target.display()
            ));
        }
    }
    fds
}

/// 100 clients that go away mid-request, three ways: half a body, a whole request closed
/// before the reply, a bare connect.
fn abandoning_clients(addr: SocketAddr) {
    let threads: Vec<_> = (0..10)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..10 {
                    let Ok(mut s) = TcpStream::connect(addr) else {
                        continue;
                    };
                    let _ = match (t * 10 + i) % 3 {
                        0 => s.write_all(
                            b"POST /v1/infer HTTP/1.1\r\nContent-Length: 4096\r\n\r\n{\"inputs\": [[1,",
                        ),
                        1 => s.write_all(
                            b"POST /v1/infer HTTP/1.1\r\nContent-Length: 23\r\n\r\n{\"inputs\": [[1,2,3,4]]}",
                        ),
                        _ => Ok(()),
                    };
                    drop(s);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
}

/// All a child's stderr (to its end).
fn stderr_of(child: &mut ChildGuard) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.0.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

#[test]
fn onnx_model_server_in_a_guest() {
    let env = Env::new();
    let img = match onnx_image() {
        Ok(i) => i,
        Err(why) => return vm_test_support::skip("onnx_model_server_in_a_guest", &why),
    };
    if common::no_guest_here(&env, "onnx_model_server_in_a_guest") {
        return;
    }
    let _cleanup = VmGuard {
        env: &env,
        name: "onnx",
    };
    let store = img.dir.join("store");
    let vm = |args: &[&str]| {
        common::Out::from(
            env.cmd()
                .env("VM_OCI_DIR", &store)
                .args(args)
                .output()
                .unwrap(),
        )
    };
    let oci = img.dir.join("oci");
    let import = vm(&[
        "images",
        "import",
        oci.to_str().unwrap(),
        "--name",
        &img.reference,
    ]);
    assert_eq!(import.code, 0, "{}", import.stderr);
    let model = img.dir.join("models/tiny.onnx");
    let model_sum = sha256(&model);
    let volume = format!("{}:/models:ro", img.dir.join("models").display());

    let started = Instant::now();
    let mut child = ChildGuard(
        env.cmd()
            .env("VM_OCI_DIR", &store)
            .args([
                "serve",
                "--name",
                "onnx",
                "--allow-emulation",
                "--image",
                &img.reference,
            ])
            .args(["--memory", "256M", "-v", &volume, "-p", "0:8000"])
            .args(["--ready", "/health", "--ready-timeout", "600s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let vm_pid = child.0.id();
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.is_empty() {
        panic!("vm serve printed no URL: {}", stderr_of(&mut child));
    }
    let addr = url_addr(&line);
    eprintln!("model server ready after {:?} at {addr}", started.elapsed());

    let health = http::get(addr, "/health").unwrap();
    assert_eq!(health.status, 200, "{}", health.body);
    assert_eq!(health.json()["onnxruntime"], "1.32.0", "{}", health.body);

    // `vm logs NAME` is the server's own output (refreshed every second).
    let deadline = Instant::now() + Duration::from_secs(20);
    let banner = "server: onnxruntime 1.32.0 serving /models/tiny.onnx on 127.0.0.1:8000";
    let logs = loop {
        let logs = vm(&["logs", "onnx"]).stdout;
        if logs.contains(banner) || Instant::now() > deadline {
            break logs;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(logs.contains(banner), "vm logs onnx: {logs}");

    // Exact match with the host's onnxruntime.
    let rows = inputs();
    let want = host_outputs(&img, &rows);
    assert_eq!(want.len(), ROWS);
    assert_eq!(
        guest_outputs(addr, &rows),
        want,
        "guest and host onnxruntime differ"
    );

    // Baseline after a warm-up, then 8 clients x 50 requests, each checked exactly.
    for r in 0..8 {
        assert_eq!(guest_outputs(addr, &rows[r..=r]), want[r..=r]);
    }
    std::thread::sleep(Duration::from_secs(2));
    let (fds0, rss0) = (tree_fds(vm_pid), status_kib(vm_pid, "VmRSS:"));
    let load = Instant::now();
    let want = Arc::new(want);
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let want = want.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let r = (c * 50 + i) % ROWS;
                    let rows = inputs();
                    assert_eq!(
                        guest_outputs(addr, &rows[r..=r]),
                        want[r..=r],
                        "client {c} #{i}"
                    );
                }
            })
        })
        .collect();
    clients
        .into_iter()
        .for_each(|t| t.join().expect("a client failed"));
    let secs = load.elapsed().as_secs_f64();
    eprintln!("8 x 50 requests in {secs:.1} s ({:.1} req/s)", 400.0 / secs);
    abandoning_clients(addr);
    // Connections close asynchronously: wait (bounded) for the fds to come back.
    let deadline = Instant::now() + Duration::from_secs(30);
    let fds1 = loop {
        let n = tree_fds(vm_pid);
        if n.len() <= fds0.len() || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let rss1 = status_kib(vm_pid, "VmRSS:");
    let (n0, n1) = (fds0.len(), fds1.len());
    eprintln!("fds {n0} -> {n1}; vm serve RSS {rss0} KiB -> {rss1} KiB");
    assert!(
        n1 <= n0,
        "fds of vm serve and its VM: {n0} before, {n1} after; new: {:#?}; gone: {:#?}",
        fds1.difference(&fds0).collect::<Vec<_>>(),
        fds0.difference(&fds1).collect::<Vec<_>>()
    );
    assert!(
        rss1 <= rss0 + RSS_MARGIN_KIB,
        "vm serve RSS {rss0} KiB -> {rss1} KiB"
    );
    assert_eq!(guest_outputs(addr, &rows[..2]), want[..2], "after the load");

    // No network: no interface but lo, and a connect to a host port fails.
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let host_ip = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .unwrap();
    let host_ip = String::from_utf8_lossy(&host_ip.stdout);
    let host_ip = host_ip
        .split_whitespace()
        .next()
        .unwrap_or("10.0.2.2")
        .to_string();
    let probe = format!(
        "import socket\ntry:\n socket.create_connection(('{host_ip}', {port}), timeout=10)\n \
         print('CONNECTED')\nexcept OSError as e:\n print('FAILED', e)"
    );
    let net = vm(&["exec", "onnx", "--", "python3", "-c", &probe]);
    assert!(
        net.stdout.starts_with("FAILED"),
        "guest reached {host_ip}:{port}: {net:?}"
    );
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
    let ifaces = vm(&["exec", "onnx", "--", "cat", "/proc/net/dev"]).stdout;
    let names: Vec<&str> = ifaces
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .collect();
    assert_eq!(
        names.iter().map(|n| n.trim()).collect::<Vec<_>>(),
        ["lo"],
        "{ifaces}"
    );

    // The server runs as the image's user app (1000), not root.
    let who = "import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n \
               c = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n \
               print(os.stat(f'/proc/{p}').st_uid) if b'/app/server.py' in c else None";
    let uids = vm(&["exec", "onnx", "--", "python3", "-c", who]);
    assert_eq!(
        uids.stdout.trim(),
        "1000",
        "uid of the server process: {uids:?}"
    );

    // The model: a write from the guest fails even as root, the file is unchanged.
    let write = vm(&[
        "exec",
        "-u",
        "0",
        "onnx",
        "--",
        "sh",
        "-c",
        "echo x >> /models/tiny.onnx",
    ]);
    assert_ne!(write.code, 0, "a guest write to the model succeeded");
    assert!(
        write.stdout.contains("Read-only") || write.stderr.contains("Read-only"),
        "{write:?}"
    );
    assert_eq!(sha256(&model), model_sum, "the model file changed");

    // OOM: a batch past the 256 MiB guest. Watch the VM's host processes meanwhile.
    let host_rss = move || -> u64 {
        let pids = common::descendants(vm_pid);
        pids.into_iter().map(|p| status_kib(p, "VmRSS:")).sum()
    };
    let before_mib = host_rss() / 1024;
    let peak = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(host_rss(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let oom = http::post(addr, "/v1/infer", r#"{"fill": 0.5, "rows": 2500000}"#);
    assert!(oom.as_ref().map_or(true, |r| r.status != 200), "{oom:?}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        match child.0.try_wait().unwrap() {
            Some(s) => break s,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            None => panic!("vm serve still runs 120 s after the OOM request: {oom:?}"),
        }
    };
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(137), "vm serve: {err}");
    assert!(
        err.contains("the server exited (killed by signal 9)"),
        "{err}"
    );
    let console = vm(&["logs", "--console", "onnx"]).stdout;
    assert!(
        console.contains("Out of memory") || console.contains("oom-kill"),
        "{console}"
    );
    assert!(
        console.contains("vm-agent: powering off"),
        "the VM did not survive: {console}"
    );
    let peak_mib = peak.load(Ordering::Relaxed) / 1024;
    eprintln!("VM host processes RSS {before_mib} MiB before, peak {peak_mib} MiB during the OOM");
    assert!(
        peak_mib < GUEST_MIB + HOST_OVERHEAD_MIB,
        "{peak_mib} MiB on the host"
    );
    let ps = vm(&["ps", "--json"]).json();
    assert_eq!(
        ps[0]["exit_reason"], "the server exited (killed by signal 9)",
        "{ps}"
    );
    assert_eq!(sha256(&model), model_sum, "the model file changed");
}
