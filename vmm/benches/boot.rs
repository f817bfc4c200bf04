//! Whole-process VM lifecycle benchmark: start a VM process whose guest's first instructions
//! reset the machine through the i8042, N times, and report the median wall time, the median
//! CPU time (user + sys from wait4's rusage) and the peak RSS (ru_maxrss). Three paths: `vmm
//! --tiny-reset`, `vm-vmm` bare, and `vm-vmm` jailed with seccomp (what the kvm driver runs);
//! the jailed figures include the reaper process (wait4's rusage covers waited-for children).
//!
//! Targets: < 16 ms wall, < 8 ms CPU, < 11 MiB peak RSS. `VMM_BENCH_RUNS` overrides N = 30.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn tv(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
}

/// 64-bit code that resets the machine through the i8042 at once (as `vmm --tiny-reset`).
const TINY_RESET: &[u8] = &[0xb0, 0xfe, 0xe6, 0x64, 0xf4];

/// Runs `start` (which spawns one VM process) `runs` times and prints wall, CPU and peak RSS.
fn measure(label: &str, runs: usize, start: impl Fn() -> std::process::Child) {
    let mut wall = Vec::with_capacity(runs);
    let mut cpu = Vec::with_capacity(runs);
    let mut rss_kib = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        let child = start();
        let pid = child.id() as libc::pid_t;
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is our child, `status` and `ru` are valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        let elapsed = t0.elapsed();
        assert_eq!(r, pid, "wait4 failed");
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{label}: failed: status {status:#x}"
        );
        wall.push(elapsed);
        cpu.push(tv(ru.ru_utime) + tv(ru.ru_stime));
        rss_kib.push(ru.ru_maxrss as u64);
        std::mem::forget(child); // already reaped by wait4
    }
    let peak = rss_kib.iter().copied().max().unwrap_or(0);
    rss_kib.sort();
    println!("{label} (tiny reset guest, 128 MiB, 1 vCPU), {runs} runs:");
    println!(
        "  median wall time: {:.2} ms (target < 16 ms)",
        median(&mut wall).as_secs_f64() * 1e3
    );
    println!(
        "  median CPU time:  {:.2} ms (target < 8 ms)",
        median(&mut cpu).as_secs_f64() * 1e3
    );
    println!(
        "  peak RSS:         {:.2} MiB max, {:.2} MiB median (target < 11 MiB)",
        peak as f64 / 1024.0,
        rss_kib[rss_kib.len() / 2] as f64 / 1024.0
    );
}

/// Starts `vm-vmm` for `cfg`; the configuration goes down its control channel, which is then
/// closed (the guest resets at once, so nothing more is needed).
fn start_vm_vmm(cfg: &vmm::process::ProcessConfig) -> std::process::Child {
    let bin = env!("CARGO_BIN_EXE_vm-vmm");
    let mut child = vmm::process::command(bin.as_ref())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn vm-vmm");
    let mut control = child.stdin.take().expect("piped stdin");
    vmm::process::write_config(&mut control, cfg).expect("send the configuration");
    child
}

fn main() {
    let bin = env!("CARGO_BIN_EXE_vmm");
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        eprintln!("SKIP boot bench: /dev/kvm unavailable");
        return;
    }
    let runs: usize = std::env::var("VMM_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    measure("vmm --tiny-reset (in-process VM, bare)", runs, || {
        Command::new(bin)
            .args(["--tiny-reset", "--quiet", "--mem-mib", "128"])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn vmm")
    });
    let dir = tempfile::tempdir().expect("bench dir");
    let kernel = dir.path().join("tiny-reset.bin");
    std::fs::write(&kernel, TINY_RESET).expect("tiny guest");
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("root")).expect("jail root");
    let mut cfg = vmm::process::ProcessConfig::new(vmm::VmConfig {
        mem_mib: 128,
        kernel,
        kernel_format: vmm::KernelFormat::Raw,
        ..vmm::VmConfig::default()
    });
    measure("vm-vmm bare (no jail, no seccomp)", runs, || {
        start_vm_vmm(&cfg)
    });
    cfg.jail = Some(vmm::process::JailConfig {
        root: run.join("root"),
        binds: vec![run.clone()],
        ..vmm::process::JailConfig::default()
    });
    cfg.seccomp = true;
    measure(
        "vm-vmm jailed (namespaces, pivot_root, uid, seccomp)",
        runs,
        || start_vm_vmm(&cfg),
    );
}
