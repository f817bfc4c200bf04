//! Boot -> agent ready with an image root vs the initramfs alone, on every driver this host
//! can run (tcg here): `MicroVm::boot` until the agent answers, then a first command
//! (`true`, which for an image root also includes creating the working root in the overlay).
//! Runs alternate between the configurations so machine load hits them alike; prints the
//! median and min of each and the image root's overhead on the median.
//!
//! Roots: the busybox erofs root the tests build, and the Debian python3 + numpy root of
//! `images/rootfs-debian.sh` when it is built. `VM_BENCH_RUNS` overrides N = 7.
//! Target: an image root adds at most 10 % to boot -> agent ready.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vm_sandbox::MicroVm;
use vm_tests::rootfs::{busybox_root, debian_root};
use vm_tests::{GuestSpec, drivers_to_test, options_for, spec_for};

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// (boot -> agent ready, first command) of one VM.
async fn one(driver: &str, g: &GuestSpec) -> Result<(Duration, Duration), String> {
    let spec = spec_for(g)?;
    let start = Instant::now();
    let vm = MicroVm::boot(spec, options_for(driver, g))
        .await
        .map_err(|e| vm_tests::error_chain(&e))?;
    let ready = start.elapsed();
    let t = Instant::now();
    let out = vm
        .exec("true")
        .await
        .map_err(|e| vm_tests::error_chain(&e))?;
    let first = t.elapsed();
    vm.close().await;
    if !out.status.success() {
        return Err(format!("true exited {:?}", out.status));
    }
    Ok((ready, first))
}

fn main() {
    let runs: usize = std::env::var("VM_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut configs: Vec<(&str, Option<PathBuf>)> = vec![("initramfs", None)];
    configs.push((
        "busybox erofs root",
        Some(busybox_root(tmp.path()).expect("busybox root")),
    ));
    match debian_root() {
        Ok(Some(p)) => configs.push(("debian python3+numpy erofs root (188 MiB)", Some(p))),
        _ => eprintln!("SKIP image_root_boot debian: the Debian rootfs is not built"),
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for d in drivers_to_test() {
        if !d.availability.ok {
            eprintln!(
                "SKIP image_root_boot [{}]: {}",
                d.name, d.availability.detail
            );
            continue;
        }
        let mut ready: Vec<Vec<Duration>> = vec![Vec::new(); configs.len()];
        let mut first: Vec<Vec<Duration>> = vec![Vec::new(); configs.len()];
        for _ in 0..runs {
            for (i, (name, rootfs)) in configs.iter().enumerate() {
                let mut g = GuestSpec::new("bench");
                g.rootfs = rootfs.clone();
                match rt.block_on(one(d.name, &g)) {
                    Ok((r, f)) => {
                        ready[i].push(r);
                        first[i].push(f);
                    }
                    Err(e) => panic!("{name} on {}: {e}", d.name),
                }
            }
        }
        let base = median(&mut ready[0].clone());
        println!("boot -> agent ready, {runs} runs each [{}]:", d.name);
        for (i, (name, _)) in configs.iter().enumerate() {
            let med = median(&mut ready[i]);
            let min = ready[i][0];
            let cmd = median(&mut first[i]);
            let over = (med.as_secs_f64() / base.as_secs_f64() - 1.0) * 100.0;
            println!(
                "  {name:<42} median {:>6.0} ms  min {:>6.0} ms  ({over:+.1} %)  first command {:>4.0} ms",
                med.as_secs_f64() * 1e3,
                min.as_secs_f64() * 1e3,
                cmd.as_secs_f64() * 1e3,
            );
        }
    }
}
