//! Soak (slow tier, `#[ignore]`): 2,000 `vm exec NAME` in one named VM. The supervisor's fds,
//! threads and RSS stay flat (RSS within 1 MiB, fds and threads exactly), each `vm exec`'s peak
//! RSS stays flat too, and the guest's process count is back to its baseline. `VM_SOAK_EXECS`
//! overrides the count (for a quick local run).

mod common;

use common::Env;

/// (open fds, threads, VmRSS KiB) of a process, once idle past tokio's 10 s blocking-thread
/// keep-alive (so retiring pool threads do not count as growth or shrinkage).
fn usage(pid: u32) -> (usize, u64, u64) {
    std::thread::sleep(std::time::Duration::from_secs(11));
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    (fds, field("Threads:"), field("VmRSS:"))
}

/// One `vm exec soak -- …`: its output (exit 0 required) and the largest peak RSS (KiB) of any
/// child this test has reaped so far (`RUSAGE_CHILDREN`), i.e. of every `vm exec` until now.
fn exec(env: &Env, line: &str) -> (String, u64) {
    let child = env
        .cmd()
        .args(["exec", "soak", "--", "sh", "-c", line])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: getrusage fills the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_CHILDREN with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        ru.ru_maxrss as u64,
    )
}

#[test]
#[ignore = "slow tier: 2,000 execs in one guest"]
fn two_thousand_execs_in_one_named_vm_stay_flat() {
    let env = Env::new();
    if common::no_guest_here(&env, "two_thousand_execs_in_one_named_vm_stay_flat") {
        return;
    }
    let n: usize = std::env::var("VM_SOAK_EXECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let _cleanup = common::VmGuard {
        env: &env,
        name: "soak",
    };
    let out = env.run(&["run", "-d", "--name", "soak", "--allow-emulation"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let ps = env.run(&["ps", "--json"]).json();
    let supervisor = ps[0]["supervisor_pid"].as_u64().unwrap() as u32;
    // User-space processes only (kernel threads, whose cmdline is empty, come and go with
    // the kernel's own work queues and are not ours to count).
    let procs = r#"n=0; for p in /proc/[0-9]*; do c=$(tr -d '\0' < $p/cmdline 2>/dev/null); [ -n "$c" ] && n=$((n+1)); done; echo $n"#;
    // Warm-up: allocator and runtime steady state.
    for _ in 0..50 {
        exec(&env, "true");
    }
    let (guest_before, _) = exec(&env, procs);
    let before = usage(supervisor);
    let (_, vm_peak_before) = exec(&env, "echo warm");
    for i in 0..n {
        let (o, _) = exec(&env, &format!("echo {i}"));
        assert_eq!(o, format!("{i}\n"));
    }
    let (_, vm_peak_after) = exec(&env, "echo done");
    let after = usage(supervisor);
    let (guest_after, _) = exec(&env, procs);
    eprintln!(
        "soak: {n} execs; supervisor fds {}->{}, threads {}->{}, RSS {}->{} KiB; vm peak RSS {}->{} KiB; guest processes {}->{}",
        before.0,
        after.0,
        before.1,
        after.1,
        before.2,
        after.2,
        vm_peak_before,
        vm_peak_after,
        guest_before.trim(),
        guest_after.trim()
    );
    assert_eq!(after.0, before.0, "supervisor fds");
    assert_eq!(after.1, before.1, "supervisor threads");
    assert!(
        after.2 <= before.2 + 1024,
        "supervisor RSS grew {} KiB",
        after.2 - before.2
    );
    assert!(vm_peak_after <= vm_peak_before + 1024, "vm peak RSS grew");
    assert_eq!(guest_after, guest_before, "guest process count");
}
