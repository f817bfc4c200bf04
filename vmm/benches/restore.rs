//! Snapshot restore vs cold boot through the `vm-vmm` process: process start → guest running.
//!
//! One tiny guest (128 MiB, 1 vCPU, as Firecracker's anchor in docs/benchmarks.md): it sets
//! COM1's scratch register to 1, prints `B`, waits while the scratch register is not 0, then
//! prints `R` and resets. A cold boot is timed from the spawn to its `B` on the console (then
//! stopped); a snapshot is taken once while it waits, and a restore is timed from the spawn to
//! the `R` of the restored guest (its serial port starts at reset values, scratch 0, so it goes
//! on at once) — the guest's own first output after the resume, so the time covers reading and
//! checking the state, mapping the memory file, setting every vCPU and VM register, the jail,
//! the filters, and the guest running again.
//!
//! Four kinds alternate round by round (cold bare, restore bare, cold jailed, restore jailed:
//! the same load for each on a shared machine) and the medians are printed, with the
//! restore/cold ratio of paired rounds. `VMM_BENCH_RUNS` overrides the 20 rounds.
//!
//! With `VMM_BENCH_FIRECRACKER=<path of a firecracker binary>`, each round also restores the
//! same guest in Firecracker (`support/firecracker.rs`) and the bench prints ours/Firecracker
//! of paired rounds: the target is a restore ≤ 0.7 × Firecracker's. With
//! `VMM_BENCH_FIRECRACKER_JAILER=<its jailer>` too, Firecracker also restores jailed (its
//! chroot, uid, PID namespace, and the same empty network namespace as ours), the pair for
//! our jailed restore.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use vmm::process::{JailConfig, ProcessConfig};

#[path = "support/firecracker.rs"]
mod firecracker;

/// The guest (see the module docs).
const GUEST: &[u8] = &[
    0x66, 0xba, 0xff, 0x03, // mov dx, 0x3ff      ; COM1 scratch
    0xb0, 0x01, //             mov al, 1
    0xee, //                   out dx, al
    0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8      ; COM1
    0xb0, b'B', //             mov al, 'B'
    0xee, //                   out dx, al
    0xb0, 0x0a, //             mov al, '\n'
    0xee, //                   out dx, al
    0x66, 0xba, 0xff, 0x03, // wait: mov dx, 0x3ff
    0xec, //                   in al, dx
    0x84, 0xc0, //             test al, al
    0x75, 0xf7, //             jnz wait
    0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
    0xb0, b'R', //             mov al, 'R'
    0xee, //                   out dx, al
    0xb0, 0x0a, //             mov al, '\n'
    0xee, //                   out dx, al
    0xb0, 0xfe, //             mov al, 0xfe
    0xe6, 0x64, //             out 0x64, al       ; reset
    0xf4, //                   hlt
];

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Spawns `vm-vmm` for `cfg` and returns it with the time of the spawn.
fn spawn(cfg: &ProcessConfig) -> (Child, Instant) {
    let bin = env!("CARGO_BIN_EXE_vm-vmm");
    let mut cmd = vmm::process::command(bin.as_ref());
    if let Some(fd) = cfg.jail.as_ref().and_then(|j| j.netns_fd) {
        vm_jail::pass_fd(&mut cmd, fd);
    }
    let t0 = Instant::now();
    let mut child = cmd.stderr(Stdio::null()).spawn().expect("spawn vm-vmm");
    let control = child.stdin.as_mut().expect("piped stdin");
    vmm::process::write_config(control, cfg).expect("send the configuration");
    (child, t0)
}

/// Reads the console until the line `want`; returns the time since `t0`.
fn until_line(child: &mut Child, t0: Instant, want: &str) -> Duration {
    let out = child.stdout.as_mut().expect("piped stdout");
    let mut lines = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        let n = lines.read_line(&mut line).expect("console");
        assert!(n > 0, "console ended before {want:?}");
        if line.trim_end() == want {
            return t0.elapsed();
        }
    }
}

/// One cold boot: spawn → `B`; then stop it.
fn cold(cfg: &ProcessConfig) -> Duration {
    let (mut child, t0) = spawn(cfg);
    let t = until_line(&mut child, t0, "B");
    let control = child.stdin.as_mut().expect("piped stdin");
    vmm::process::send_stop(control).expect("stop");
    let status = child.wait().expect("wait");
    assert!(status.success(), "cold boot failed: {status}");
    t
}

/// One restore: spawn → `R`; the guest then resets.
fn restore(cfg: &ProcessConfig) -> Duration {
    let (mut child, t0) = spawn(cfg);
    let t = until_line(&mut child, t0, "R");
    let status = child.wait().expect("wait");
    assert!(status.success(), "restore failed: {status}");
    t
}

/// The guest's VM (its code at `kernel`).
fn vm_config(kernel: &Path) -> vmm::VmConfig {
    vmm::VmConfig {
        mem_mib: 128,
        kernel: kernel.to_path_buf(),
        kernel_format: vmm::KernelFormat::Raw,
        ..vmm::VmConfig::default()
    }
}

/// Takes the snapshot into `snap` from a VM of the guest at `kernel`, waiting at its loop.
fn take_snapshot(kernel: &Path, snap: &Path) {
    let mut cfg = ProcessConfig::new(vm_config(kernel));
    cfg.snapshot_dir = Some(snap.to_path_buf());
    let (mut child, t0) = spawn(&cfg);
    until_line(&mut child, t0, "B");
    let control = child.stdin.as_mut().expect("piped stdin");
    writeln!(control, "{}", vmm::process::SNAPSHOT_STOP).expect("snapshot-stop");
    control.flush().expect("snapshot-stop");
    assert!(child.wait().expect("wait").success(), "snapshot failed");
    assert!(snap.join("vmstate").exists(), "no snapshot written");
}

fn main() {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        eprintln!("SKIP restore bench: /dev/kvm unavailable");
        return;
    }
    let runs: usize = std::env::var("VMM_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().expect("bench dir");
    let kernel = dir.path().join("guest.bin");
    std::fs::write(&kernel, GUEST).expect("guest");
    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).expect("snapshot dir");
    std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o700)).expect("0700");
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("root")).expect("jail root");
    take_snapshot(&kernel, &snap);
    let fc = std::env::var_os("VMM_BENCH_FIRECRACKER").map(|bin| {
        let fc_dir = dir.path().join("firecracker");
        std::fs::create_dir(&fc_dir).expect("firecracker's dir");
        firecracker::Arm::snapshot(Path::new(&bin), GUEST, &fc_dir)
    });
    let fc_jailer = std::env::var_os("VMM_BENCH_FIRECRACKER_JAILER")
        .filter(|_| fc.is_some())
        .map(std::path::PathBuf::from);
    let netns = format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        vm_jail::shared_netns().expect("network namespace")
    );
    let make = |jailed: bool, restore: bool| {
        let mut cfg = ProcessConfig::new(vm_config(&kernel));
        if jailed {
            cfg.jail = Some(JailConfig {
                root: run.join("root"),
                binds: vec![run.clone()],
                netns_fd: Some(vm_jail::shared_netns().expect("network namespace")),
                ..JailConfig::default()
            });
            cfg.seccomp = true;
        }
        if restore {
            cfg.restore = Some(snap.clone());
        }
        cfg
    };
    let (bare, bare_r, jailed, jailed_r) = (
        make(false, false),
        make(false, true),
        make(true, false),
        make(true, true),
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    // Ours (cold bare, restore bare, cold jailed, restore jailed), then Firecracker's restore
    // (spawn → 204) where it runs, bare and jailed.
    let mut t: [Vec<f64>; 6] = Default::default();
    for round in 0..runs {
        t[0].push(ms(cold(&bare)));
        t[1].push(ms(restore(&bare_r)));
        t[2].push(ms(cold(&jailed)));
        t[3].push(ms(restore(&jailed_r)));
        if let Some(fc) = &fc {
            t[4].push(ms(fc.restore()));
            if let Some(jailer) = &fc_jailer {
                let n = u32::try_from(round).expect("rounds fit u32");
                t[5].push(ms(fc.restore_jailed(jailer, Path::new(&netns), n)));
            }
        }
    }
    let ratio = |a: usize, b: usize| {
        let mut r: Vec<f64> = t[b].iter().zip(&t[a]).map(|(x, y)| x / y).collect();
        median(&mut r)
    };
    let (rb, rj) = (ratio(0, 1), ratio(2, 3));
    let vs_fc = fc.as_ref().map(|_| (ratio(4, 1), ratio(4, 3)));
    let vs_fc_jailed = fc_jailer.as_ref().map(|_| ratio(5, 3));
    let labels = [
        "cold boot, bare:     spawn → guest running",
        "restore, bare:       spawn → guest resumed",
        "cold boot, jailed:   spawn → guest running",
        "restore, jailed:     spawn → guest resumed",
        "Firecracker restore: spawn → resumed (204)",
        "Firecracker restore, jailed: jailer spawn → resumed (204)",
    ];
    println!(
        "vm-vmm restore vs cold boot (tiny guest, 128 MiB, 1 vCPU), {runs} alternating rounds:"
    );
    for (label, v) in labels
        .iter()
        .zip(t.iter_mut())
        .filter(|(_, v)| !v.is_empty())
    {
        let (lo, hi) = (
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(0.0, f64::max),
        );
        println!("  {label}: median {:.2} ms [{lo:.2}–{hi:.2}]", median(v));
    }
    println!("  restore/cold, median of paired rounds: bare {rb:.2}, jailed {rj:.2}");
    if let Some((bare, jailed)) = vs_fc {
        println!(
            "  restore, ours/Firecracker, median of paired rounds: bare {bare:.2}, ours jailed \
             vs Firecracker bare {jailed:.2} (the target: ≤ 0.70)"
        );
    }
    if let Some(jailed) = vs_fc_jailed {
        println!("  restore, jailed, ours/Firecracker's: {jailed:.2} (the target: ≤ 0.70)");
    }
}
