//! Bulk throughput of a forwarded port: one large HTTP body (`VM_BENCH_MIB`, default 64 MiB)
//! fetched from busybox `httpd` in a guest through `Serving`'s published loopback port
//! (host TCP -> agent Forward over vsock -> guest TCP), against the same `httpd` binary
//! (`/bin/busybox`, busybox-static) serving the same bytes on a direct host loopback
//! connection, in one run. Fetches alternate between the two so machine load hits them
//! alike; prints the median MB/s of each and their ratio. `VM_BENCH_RUNS` = N (default 5).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vm_sandbox::{MicroVm, PublishSpec, Readiness, ServeSpec};
use vm_tests::{GuestSpec, drivers_to_test, options_for, spec_for};

const GUEST_PORT: u16 = 8000;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// GET `path` with HTTP/1.0 and read to EOF: (body bytes, seconds).
fn fetch(addr: SocketAddr, path: &str) -> Result<(usize, f64), String> {
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    let mut head = Vec::new();
    let mut total = 0usize;
    loop {
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("read from {addr}: {e}"))?;
        if n == 0 {
            break;
        }
        if head.len() < 4096 {
            head.extend_from_slice(&buf[..n.min(4096)]);
        }
        total += n;
    }
    let secs = start.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&head);
    let body_at = text.find("\r\n\r\n").ok_or("no reply head")? + 4;
    if !text.starts_with("HTTP/1.0 200") && !text.starts_with("HTTP/1.1 200") {
        return Err(format!("status: {:?}", text.lines().next()));
    }
    Ok((total - body_at, secs))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// busybox httpd on the host, serving `dir` on a free loopback port; killed on drop.
struct HostHttpd(std::process::Child, SocketAddr);

impl HostHttpd {
    fn start(dir: &std::path::Path) -> HostHttpd {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("/bin/busybox")
            .args(["httpd", "-f", "-p", &format!("127.0.0.1:{port}"), "-h"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("/bin/busybox httpd (busybox-static)");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        HostHttpd(child, addr)
    }
}

impl Drop for HostHttpd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn bench(driver: &str, mib: usize, runs: usize) -> Result<(), String> {
    let mut g = GuestSpec::new("forward-bench");
    g.mem_mib = 256 + 2 * mib as i64; // the body lives in the guest's tmpfs
    let vm = MicroVm::boot(spec_for(&g)?, options_for(driver, &g))
        .await
        .map_err(|e| vm_tests::error_chain(&e))?;
    let make = format!(
        "mkdir -p /tmp/www && head -c {} /dev/zero > /tmp/www/big",
        mib << 20
    );
    let out = vm
        .exec(&make)
        .await
        .map_err(|e| vm_tests::error_chain(&e))?;
    if !out.status.success() {
        return Err(format!("{make}: {}", String::from_utf8_lossy(&out.output)));
    }
    let argv = ["httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/tmp/www"];
    let serving = vm
        .serve(ServeSpec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            publish: vec![PublishSpec::loopback(0, GUEST_PORT)],
        })
        .await
        .map_err(|e| vm_tests::error_chain(&e))?;
    let ready = Readiness {
        http_path: Some("/big".into()),
        timeout: Duration::from_secs(60),
    };
    serving
        .wait_ready(&ready)
        .await
        .map_err(|e| vm_tests::error_chain(&e))?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::write(dir.path().join("big"), vec![0u8; mib << 20]).map_err(|e| e.to_string())?;
    let host = HostHttpd::start(dir.path());
    let forwarded = serving.addr();
    let (mut fwd, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        for (addr, into) in [(forwarded, &mut fwd), (host.1, &mut direct)] {
            let (bytes, secs) = tokio::task::spawn_blocking(move || fetch(addr, "/big"))
                .await
                .map_err(|e| e.to_string())??;
            if bytes != mib << 20 {
                return Err(format!("{addr}: {bytes} bytes, want {}", mib << 20));
            }
            into.push(bytes as f64 / 1e6 / secs);
        }
    }
    let (f, d) = (median(&mut fwd), median(&mut direct));
    println!(
        "forward_throughput [{driver}] {mib} MiB body, {runs} runs: forwarded {f:.0} MB/s \
         (min {:.0}, max {:.0}), direct host {d:.0} MB/s (min {:.0}, max {:.0}); \
         forwarded/direct = {:.3}",
        fwd[0],
        fwd[fwd.len() - 1],
        direct[0],
        direct[direct.len() - 1],
        f / d
    );
    serving
        .stop()
        .await
        .map_err(|e| vm_tests::error_chain(&e))?;
    vm.close().await;
    Ok(())
}

fn main() {
    let (mib, runs) = (env_num("VM_BENCH_MIB", 64), env_num("VM_BENCH_RUNS", 5));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for d in drivers_to_test() {
        if !d.availability.ok {
            eprintln!(
                "SKIP forward_throughput [{}]: {}",
                d.name, d.availability.detail
            );
            continue;
        }
        if let Err(e) = rt.block_on(bench(d.name, mib, runs)) {
            panic!("forward_throughput on {}: {e}", d.name);
        }
    }
}
