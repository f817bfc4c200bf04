//! `vm cp` of a 2 GiB sparse file into and out of a real tcg guest: the sha256 survives the
//! round trip, every `vm cp` and the guest agent (PID 1) stay below the documented peak-RSS
//! bound, and the cap holds mid-stream when the guest file grows during a copy out.
//!
//! The guest keeps the file in its `/tmp`, a tmpfs of half the guest's memory (128 MiB by
//! default): the agent writes all-zero blocks as holes, so the 2 GiB file costs the guest only
//! its 3 MiB of data — that is what lets a file far larger than the guest's memory land there.
//! `VM_CP_GUEST_MIB` overrides the size (for a quick local run).

mod common;

use std::time::Instant;

use common::Env;
use common::copy::{self, MIB};
use vm_test_support::no_guest_driver;

/// The agent's lifetime peak RSS (it is PID 1) stays under this through the copies.
const AGENT_HWM_BOUND_KIB: u64 = 64 * 1024;

fn guest_unavailable(env: &Env) -> Option<String> {
    if common::built_images().is_none() {
        return Some("guest images are not built (<images dir>/current/)".into());
    }
    if !common::tcg_available(env) {
        return Some("the tcg driver is not available".into());
    }
    None
}

/// Sets the size of the guest file `/tmp/grow` to `mib` MiB without writing (a sparse
/// extension, busybox `dd` with `seek` and no data).
fn grow_in_guest(env: &Env, mib: u64) {
    let seek = format!("seek={mib}");
    let out = env.run(&[
        "exec",
        "cpbox",
        "--",
        "dd",
        "if=/dev/zero",
        "of=/tmp/grow",
        "bs=1M",
        "count=0",
        &seek,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// Whether a copy's temporary file is in `dir`.
fn has_part(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy().contains(".vm-cp-"))
}

/// A `KEY:  N kB` field of a `/proc/PID/status` text.
fn status_kib(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {status}"))
}

#[test]
fn cp_two_gib_sparse_through_a_guest_with_flat_memory() {
    let name = "cp_two_gib_sparse_through_a_guest_with_flat_memory";
    let env = Env::new();
    if let Some(why) = guest_unavailable(&env) {
        return no_guest_driver(name, &why);
    }
    let mib: u64 = std::env::var("VM_CP_GUEST_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2048);
    let size = mib * MIB;
    let _cleanup = common::VmGuard {
        env: &env,
        name: "cpbox",
    };
    let out = env.run(&["run", "-d", "--name", "cpbox", "--allow-emulation"]);
    assert_eq!(out.code, 0, "{}", out.stderr);

    let src = env.dir.path().join("big.bin");
    copy::sparse_file(&src, size);
    let want = copy::sha256_of(&src);
    let cap = "3G";
    let started = Instant::now();
    let (out, hwm_in) = copy::run_peak_rss(
        &env,
        &[
            "cp",
            "--max-size",
            cap,
            src.to_str().unwrap(),
            "cpbox:/tmp/big.bin",
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let t_in = started.elapsed();
    let out = env.run(&[
        "exec",
        "cpbox",
        "--",
        "sh",
        "-c",
        "stat -c %s /tmp/big.bin; du -k /tmp/big.bin",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut words = out.stdout.split_whitespace();
    let guest_size: u64 = words.next().unwrap().parse().unwrap();
    let guest_kib: u64 = words.next().unwrap().parse().unwrap();
    assert_eq!(guest_size, size, "{}", out.stdout);
    assert!(guest_kib < 64 * 1024, "the guest allocated {guest_kib} KiB");

    let back = env.dir.path().join("back.bin");
    let started = Instant::now();
    let (out, hwm_out) = copy::run_peak_rss(
        &env,
        &[
            "cp",
            "--max-size",
            cap,
            "cpbox:/tmp/big.bin",
            back.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let t_out = started.elapsed();
    assert_eq!(
        copy::sha256_of(&back),
        want,
        "content changed in the round trip"
    );
    assert!(
        copy::allocated(&back) < 64 * MIB,
        "holes not kept on the host"
    );

    let out = env.run(&["exec", "cpbox", "--", "cat", "/proc/1/status"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let agent_hwm = status_kib(&out.stdout, "VmHWM:");
    eprintln!(
        "vm cp {mib} MiB: in {t_in:.1?} (vm peak {hwm_in} KiB), out {t_out:.1?} (vm peak \
         {hwm_out} KiB); agent VmHWM {agent_hwm} KiB"
    );
    for hwm in [hwm_in, hwm_out] {
        assert!(hwm < copy::VM_CP_HWM_BOUND_KIB, "vm cp peaked at {hwm} KiB");
    }
    assert!(
        agent_hwm < AGENT_HWM_BOUND_KIB,
        "the agent peaked at {agent_hwm} KiB"
    );

    // A guest file that grows past the cap while it is copied out: refused mid-stream, and
    // no file (not even a partial one) at the destination.
    grow_in_guest(&env, 1000);
    let grown = env.dir.path().join("grown.bin");
    let cp = env
        .cmd()
        .args([
            "cp",
            "--max-size",
            "1G",
            "cpbox:/tmp/grow",
            grown.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the copy has started (its temporary file exists), the file grows to 4 GiB.
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while !has_part(env.dir.path()) {
        assert!(Instant::now() < deadline, "the copy out never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    grow_in_guest(&env, 4096);
    let out = cp.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("grew past the cap of 1073741824 bytes while being copied"),
        "{stderr}"
    );
    assert!(!grown.exists());
    assert!(
        !has_part(env.dir.path()),
        "a temporary file was left behind"
    );
}
