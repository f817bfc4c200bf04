//! Whole-process VM lifecycle benchmark: start a VM process whose guest's first instructions
//! reset the machine through the i8042, N times, and report the median wall time, the median
//! CPU time (user + sys from wait4's rusage) and the peak RSS (ru_maxrss). Three paths: `vmm
//! --tiny-reset`, `vm-vmm` bare, and `vm-vmm` jailed with seccomp (what the kvm driver runs);
//! the jailed figures include the reaper process (wait4's rusage covers waited-for children).
//!
//! Bare and jailed `vm-vmm` runs alternate (the same load for both on a shared machine) and the
//! jail's cost is printed as the median of the paired differences.
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

/// One run: wall time, CPU time (user + sys) and peak RSS in KiB.
#[derive(Clone, Copy)]
struct Sample {
    wall: Duration,
    cpu: Duration,
    rss_kib: u64,
}

/// Runs `start` (which spawns one VM process) once and waits for it.
fn once(label: &str, start: &dyn Fn() -> std::process::Child) -> Sample {
    let t0 = Instant::now();
    let child = start();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, `status` and `ru` are valid for writes.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let wall = t0.elapsed();
    assert_eq!(r, pid, "wait4 failed");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{label}: failed: status {status:#x}"
    );
    std::mem::forget(child); // already reaped by wait4
    Sample {
        wall,
        cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
        rss_kib: ru.ru_maxrss as u64,
    }
}

/// Prints the medians (and the peak RSS) of `samples`.
fn report(label: &str, samples: &[Sample]) {
    let mut wall: Vec<_> = samples.iter().map(|s| s.wall).collect();
    let mut cpu: Vec<_> = samples.iter().map(|s| s.cpu).collect();
    let mut rss_kib: Vec<_> = samples.iter().map(|s| s.rss_kib).collect();
    let peak = rss_kib.iter().copied().max().unwrap_or(0);
    rss_kib.sort();
    println!(
        "{label} (tiny reset guest, 128 MiB, 1 vCPU), {} runs:",
        samples.len()
    );
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

/// Runs `start` `runs` times and reports.
fn measure(label: &str, runs: usize, start: impl Fn() -> std::process::Child) {
    let samples: Vec<_> = (0..runs).map(|_| once(label, &start)).collect();
    report(label, &samples);
}

/// The median of `f(b) - f(a)` over paired runs, in ms (negative when `b` is cheaper).
fn median_delta(a: &[Sample], b: &[Sample], f: impl Fn(&Sample) -> Duration) -> f64 {
    let mut d: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f(y).as_secs_f64() - f(x).as_secs_f64()) * 1e3)
        .collect();
    d.sort_by(f64::total_cmp);
    d[d.len() / 2]
}

/// Starts `vm-vmm` for `cfg`; the configuration goes down its control channel, which is then
/// closed (the guest resets at once, so nothing more is needed).
fn start_vm_vmm(cfg: &vmm::process::ProcessConfig) -> std::process::Child {
    let bin = env!("CARGO_BIN_EXE_vm-vmm");
    let mut cmd = vmm::process::command(bin.as_ref());
    if let Some(fd) = cfg.jail.as_ref().and_then(|j| j.netns_fd) {
        vm_jail::pass_fd(&mut cmd, fd);
    }
    let mut child = cmd
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
    let make = || {
        vmm::process::ProcessConfig::new(vmm::VmConfig {
            mem_mib: 128,
            kernel: kernel.clone(),
            kernel_format: vmm::KernelFormat::Raw,
            ..vmm::VmConfig::default()
        })
    };
    let cfg = make();
    let mut jailed = make();
    jailed.jail = Some(vmm::process::JailConfig {
        root: run.join("root"),
        binds: vec![run.clone()],
        // As the kvm driver does: one empty network namespace for every VM of this process.
        netns_fd: Some(vm_jail::shared_netns().expect("network namespace")),
        ..vmm::process::JailConfig::default()
    });
    jailed.seccomp = true;
    // Bare and jailed alternate, so that both see the same load on a shared machine; the
    // jail's cost is the median of the paired differences.
    let bare_label = "vm-vmm bare (no jail, no seccomp)";
    let jailed_label = "vm-vmm jailed (namespaces, pivot_root, uid, seccomp)";
    let (mut bare_s, mut jailed_s) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        bare_s.push(once(bare_label, &|| start_vm_vmm(&cfg)));
        jailed_s.push(once(jailed_label, &|| start_vm_vmm(&jailed)));
    }
    report(bare_label, &bare_s);
    report(jailed_label, &jailed_s);
    println!(
        "jail cost, median of {runs} paired runs (budget +3 ms wall, +1 MiB RSS): wall {:+.2} ms, CPU {:+.2} ms",
        median_delta(&bare_s, &jailed_s, |s| s.wall),
        median_delta(&bare_s, &jailed_s, |s| s.cpu)
    );
}
