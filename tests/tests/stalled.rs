//! Stalled peers cost the host nothing (issue 25): a guest server that never reads an upload
//! stalls the upload at the host's socket (backpressure, not buffering, not a busy loop), and
//! 100 host connections into a guest that never reads them leave the vsock device's memory
//! bounded. Runs on every driver (tcg: our `vm-vsock` vhost-user backend and QEMU; kvm: the
//! same muxer inside `vm-vmm`).
//!
//! - `upload_into_a_server_that_never_reads`: busybox `nc -ll -e sleep` served through a
//!   published port; the host uploads until its writes stop being taken, then the VM's host
//!   processes and this process (the forwarder) together use < 5 % of a core over 20 s (on
//!   kvm, where the only KVM here is nested in TCG and the guest's idle work is emulated: < 5 %
//!   above the same VM's cost before the upload), the upload is still open (stalled, not
//!   dropped), and a command still runs.
//! - `hundred_stalled_vsock_connections`: `vsock-probe sink` accepts 100 host connections
//!   (`CONNECT` on the hybrid socket) and never reads them; each is written to until it
//!   stalls. The vsock process' resident memory outside guest RAM grows < 8 MiB, the host
//!   stays under 5 % of a core over 10 s, and every connection is still open.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vm_sandbox::{PublishSpec, ServeSpec, Serving};
use vm_tests::probe::{PROBE, install_probe};
use vm_tests::procs::{cpu_by_process, find, rss_outside_kib, tree};
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure, exec_ok, sh};

const SERVER_PORT: u16 = 8100;
const SINK_PORT: u32 = 5200;
const CONNS: usize = 100;
/// The budget: 5 % of one core.
const CPU_SHARE: f64 = 0.05;
/// The budget for the vsock process' memory growth with every connection stalled.
const RSS_GROWTH_KIB: u64 = 8 * 1024;
/// Writes taken by one stalled peer before the test calls it a missing backpressure.
const MAX_TAKEN: u64 = 64 << 20;
/// No write progress for this long = stalled.
const STALL: Duration = Duration::from_secs(2);

/// Writes to every stream until none has taken a byte for [`STALL`]; returns the bytes each
/// took. A write error (the peer closed or reset) or more than [`MAX_TAKEN`] into one fails.
fn fill<S: Write>(streams: &mut [S]) -> Result<Vec<u64>, String> {
    let chunk = vec![0x5au8; 64 << 10];
    let mut taken = vec![0u64; streams.len()];
    let mut last_progress = Instant::now();
    while last_progress.elapsed() < STALL {
        let mut progressed = false;
        for (i, s) in streams.iter_mut().enumerate() {
            match s.write(&chunk) {
                Ok(n) => {
                    taken[i] += n as u64;
                    progressed |= n > 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("stream #{i} failed after {} bytes: {e}", taken[i])),
            }
            ensure!(
                taken[i] <= MAX_TAKEN,
                "stream #{i} took {} bytes without stalling",
                taken[i]
            );
        }
        if progressed {
            last_progress = Instant::now();
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(taken)
}

/// Still open: a read finds nothing to read (`WouldBlock`), not end-of-file or a reset.
fn still_open<S: Read>(i: usize, s: &mut S) -> Result<(), String> {
    match s.read(&mut [0u8; 64]) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(()),
        Ok(0) => Err(format!("stream #{i} was closed while stalled")),
        Ok(n) => Err(format!(
            "stream #{i} received {n} bytes from a peer that never writes"
        )),
        Err(e) => Err(format!("stream #{i}: {e}")),
    }
}

/// CPU used by this process and everything under it (the VM's host processes are its
/// children or their children) over `window`: the total, its share of one core, and who
/// used it (`comm: ms` of every process that used any).
fn cpu_share_over(window: Duration) -> (Duration, f64, String) {
    let procs: BTreeSet<u32> = tree(&[std::process::id()]);
    let before = cpu_by_process(&procs);
    std::thread::sleep(window);
    let after = cpu_by_process(&procs);
    let mut used = Duration::ZERO;
    let mut who = Vec::new();
    for (pid, comm, t) in after {
        let t0 = before
            .iter()
            .find(|b| b.0 == pid)
            .map_or(Duration::ZERO, |b| b.2);
        let d = t.saturating_sub(t0);
        if !d.is_zero() {
            who.push(format!("{comm} {} ms", d.as_millis()));
        }
        used += d;
    }
    (
        used,
        used.as_secs_f64() / window.as_secs_f64(),
        who.join(", "),
    )
}

async fn serve_sink(vm: &MicroVm) -> Result<Serving, String> {
    let spec = ServeSpec {
        argv: [
            "nc",
            "-ll",
            "-p",
            &SERVER_PORT.to_string(),
            "-e",
            "sleep",
            "600",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        publish: vec![PublishSpec::parse(&format!("0:{SERVER_PORT}")).ctx("publish spec")?],
    };
    let s = vm.serve(spec).await.ctx("serve nc")?;
    exec_ok(
        vm,
        &format!(
            "for i in $(seq 100); do netstat -ltn | grep -q ':{SERVER_PORT} ' && exit 0; sleep 0.1; done; exit 1"
        ),
    )
    .await
    .map_err(|e| format!("waiting for nc to listen: {e}"))?;
    Ok(s)
}

async fn upload_into_a_server_that_never_reads(vm: &MicroVm, driver: &str) -> Result<(), String> {
    let server = serve_sink(vm).await?;
    let addr = server.addr();
    // On tcg (the road the issue measures) the budget is absolute; under a nested KVM the
    // guest's own idle work (its ticks, the serve monitor's status polls) is emulated and runs
    // as the VMM's CPU time, so there the stall may add at most the budget to the idle cost.
    let absolute = driver == "tcg";
    let stalled = tokio::task::spawn_blocking(move || -> Result<String, String> {
        let (_, idle, _) = cpu_share_over(Duration::from_secs(10));
        let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let taken = fill(std::slice::from_mut(&mut s))?[0];
        let (used, share, who) = cpu_share_over(Duration::from_secs(20));
        still_open(0, &mut s)?;
        let line = format!(
            "stalled upload: {taken} bytes taken, then {} ms of host CPU over 20 s ({:.1} % of a core: {who}; {:.1} % before the upload)",
            used.as_millis(),
            share * 100.0,
            idle * 100.0
        );
        eprintln!("{line}");
        let over = if absolute { share } else { share - idle };
        ensure!(over < CPU_SHARE, "{line}: over the {:.0} % budget", CPU_SHARE * 100.0);
        Ok(line)
    })
    .await
    .map_err(|e| format!("join: {e}"))??;
    let out = exec_ok(vm, "echo still-serving")
        .await
        .map_err(|e| format!("after the stall ({stalled}): {e}"))?;
    ensure!(out == "still-serving\n", "exec after the stall: {out:?}");
    ensure!(server.running(), "nc exited: {}", server.output());
    server.stop().await.ctx("stopping nc")
}

/// `CONNECT port` on the hybrid socket, retried until the guest listens (up to 20 s).
fn connect_vsock(sock: &Path, port: u32) -> Result<UnixStream, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = (|| -> std::io::Result<Option<UnixStream>> {
            let mut s = UnixStream::connect(sock)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(format!("CONNECT {port}\n").as_bytes())?;
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line)?;
            Ok(line.starts_with("OK ").then_some(s))
        })();
        match attempt {
            Ok(Some(s)) => return Ok(s),
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Ok(None) => return Err(format!("CONNECT {port}: refused until the deadline")),
            Err(e) => return Err(format!("CONNECT {port}: {e}")),
        }
    }
}

/// The pid of the process running the vsock device (`vm-vsock` on tcg, `vm-vmm` on kvm).
fn vsock_process(vm: &MicroVm) -> Result<u32, String> {
    let pids = vm.machine().host_pids();
    find(&pids, "vm-vsock")
        .or_else(|| find(&pids, "vm-vmm"))
        .ok_or_else(|| format!("no vm-vsock or vm-vmm process under {pids:?}"))
}

fn stall_hundred(sock: PathBuf, vsock_pid: u32, guest_mib: u64) -> Result<(), String> {
    // Guest RAM regions are at least half the guest's memory; everything else is the process'.
    let outside_ram = || rss_outside_kib(vsock_pid, guest_mib * 1024 / 2);
    let before = outside_ram().ok_or("the vsock process is gone")?;
    let mut conns = Vec::with_capacity(CONNS);
    for i in 0..CONNS {
        let s = connect_vsock(&sock, SINK_PORT).map_err(|e| format!("connection #{i}: {e}"))?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        conns.push(s);
    }
    let taken = fill(&mut conns)?;
    std::thread::sleep(Duration::from_secs(1));
    let after = outside_ram().ok_or("the vsock process is gone")?;
    let (used, share, who) = cpu_share_over(Duration::from_secs(10));
    for (i, s) in conns.iter_mut().enumerate() {
        still_open(i, s)?;
    }
    let total: u64 = taken.iter().sum();
    let growth = after.saturating_sub(before);
    let line = format!(
        "{CONNS} stalled connections took {total} bytes (min {}, max {}); vsock process RSS outside guest RAM {before} -> {after} KiB; host CPU {} ms over 10 s ({:.1} %: {who})",
        taken.iter().min().unwrap_or(&0),
        taken.iter().max().unwrap_or(&0),
        used.as_millis(),
        share * 100.0
    );
    eprintln!("{line}");
    ensure!(growth < RSS_GROWTH_KIB, "{line}: grew {growth} KiB");
    ensure!(share < CPU_SHARE, "{line}: over the CPU budget");
    Ok(())
}

async fn hundred_stalled_vsock_connections(vm: &MicroVm, guest_mib: u64) -> Result<(), String> {
    install_probe(vm).await?;
    let sock = vm.agent_socket().to_path_buf();
    let pid = vsock_process(vm)?;
    let line = format!("./{PROBE} sink {SINK_PORT} {CONNS} 300");
    let guest = sh(vm, &line);
    let host = async {
        let r = tokio::task::spawn_blocking(move || stall_hundred(sock, pid, guest_mib))
            .await
            .map_err(|e| format!("join: {e}"));
        let _ = sh(vm, &format!("killall {PROBE}")).await;
        r?
    };
    let (guest, host) = tokio::join!(guest, host);
    host?;
    let out = String::from_utf8_lossy(&guest?.output).into_owned();
    ensure!(
        out.contains(&format!("sink accepted {CONNS}")),
        "the guest sink said {out:?}"
    );
    exec_ok(vm, "true")
        .await
        .map_err(|e| format!("exec after the stall: {e}"))?;
    Ok(())
}

#[test]
fn stalled() {
    vm_tests::scenario("stalled", |driver| async move {
        let g = GuestSpec::new("stalled");
        let guest_mib = u64::try_from(g.mem_mib).unwrap_or(0);
        let vm = boot(driver, &g).await?;
        let mut c = Cases::new("stalled", driver);
        c.run(
            "upload_into_a_server_that_never_reads",
            upload_into_a_server_that_never_reads(&vm, driver),
        )
        .await;
        c.run(
            "hundred_stalled_vsock_connections",
            hundred_stalled_vsock_connections(&vm, guest_mib),
        )
        .await;
        vm.close().await;
        c.finish()
    });
}
