//! Teardown that survives `SIGKILL`: a `kill -9` of `vm exec`, of a `run -d` supervisor or
//! of an unnamed `vm serve` (whose record goes too), then one more `vm` command, and no process, socket or directory of the dead VM remains.
//! Against a real guest under tcg; SKIPs (with the reason) when that cannot boot here.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Env, guest_unavailable};

/// The one run directory (`vm-*`) directly under `parent`.
fn run_dir_in(parent: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(parent)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("vm-"))
        .collect();
    assert_eq!(
        dirs.len(),
        1,
        "run dirs under {}: {dirs:?}",
        parent.display()
    );
    dirs[0].clone()
}

/// Pids of processes whose command line mentions `needle` (the VM's QEMU and vsock helper
/// name files in its run directory).
fn processes_mentioning(needle: &Path) -> Vec<u32> {
    let needle = needle.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
        })
        .filter(|pid| common::pid_alive(*pid))
        .collect()
}

fn sigkill(pid: u32) {
    // SAFETY: kill(2) on a process this test started (directly or through `vm run -d`).
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
}

/// After the owner's death and one `vm ps`: the run dir is gone and so is every process that
/// named it (they die by PR_SET_PDEATHSIG; allow them a moment).
fn assert_nothing_left(env: &Env, run_dir: &Path, vm_pids: &[u32]) {
    let out = env.run(&["ps"]);
    assert_eq!(out.code, 0, "vm ps: {}", out.stderr);
    assert!(
        !run_dir.exists(),
        "{} survived the sweep",
        run_dir.display()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while vm_pids.iter().any(|p| common::pid_alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for p in vm_pids {
        assert!(!common::pid_alive(*p), "VM process {p} outlived its owner");
    }
    assert_eq!(processes_mentioning(run_dir), Vec::<u32>::new());
}

/// `kill -9` of the `vm` child owning `run_dir`, then [`assert_nothing_left`].
fn kill_9_then_nothing_left(env: &Env, child: &mut common::ChildGuard, run_dir: &Path) {
    let vm_pids = processes_mentioning(run_dir);
    assert!(
        !vm_pids.is_empty(),
        "no VM process names {}",
        run_dir.display()
    );
    sigkill(child.0.id());
    child.0.wait().unwrap();
    assert!(
        run_dir.exists(),
        "nothing to sweep: the test proves nothing"
    );
    assert_nothing_left(env, run_dir, &vm_pids);
}

#[test]
fn kill_9_of_vm_exec_leaves_nothing_after_the_next_command() {
    let env = Env::new();
    if let Some(why) = guest_unavailable(&env) {
        return vm_test_support::no_guest_driver(
            "kill_9_of_vm_exec_leaves_nothing_after_the_next_command",
            &why,
        );
    }
    let mut child = common::ChildGuard(
        env.cmd()
            .args(["exec", "--allow-emulation", "--", "sh", "-c"])
            .arg("echo started; sleep 600")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut buf = [0u8; 8];
    child.0.stdout.take().unwrap().read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"started\n");
    let run_dir = run_dir_in(&env.runtime().join(".exec"));
    kill_9_then_nothing_left(&env, &mut child, &run_dir);
}

#[test]
fn kill_9_of_a_supervisor_leaves_nothing_after_the_next_command() {
    let env = Env::new();
    if let Some(why) = guest_unavailable(&env) {
        return vm_test_support::no_guest_driver(
            "kill_9_of_a_supervisor_leaves_nothing_after_the_next_command",
            &why,
        );
    }
    let _cleanup = common::VmGuard {
        env: &env,
        name: "doomed",
    };
    let out = env.run(&["run", "-d", "--name", "doomed", "--allow-emulation"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let ps = env.run(&["ps", "--json"]).json();
    let supervisor = ps[0]["supervisor_pid"].as_u64().unwrap() as u32;
    let run_dir = run_dir_in(&env.runtime().join("doomed"));
    let vm_pids = processes_mentioning(&run_dir);
    assert!(
        !vm_pids.is_empty(),
        "no VM process names {}",
        run_dir.display()
    );
    sigkill(supervisor);
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::pid_alive(supervisor) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        run_dir.exists(),
        "nothing to sweep: the test proves nothing"
    );
    assert_nothing_left(&env, &run_dir, &vm_pids);
    let ps = env.run(&["ps", "--json"]).json();
    assert_eq!(ps[0]["state"], "exited", "{ps}");
}

#[test]
fn kill_9_of_vm_serve_leaves_nothing_after_the_next_command() {
    let env = Env::new();
    if let Some(why) = guest_unavailable(&env) {
        return vm_test_support::no_guest_driver(
            "kill_9_of_vm_serve_leaves_nothing_after_the_next_command",
            &why,
        );
    }
    let mut child = common::ChildGuard(
        env.cmd()
            .args(["serve", "--allow-emulation", "-p", "0:8000", "--"])
            .args(["httpd", "-f", "-p", "8000", "-h", "/proc"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut url = [0u8; 7];
    child.0.stdout.take().unwrap().read_exact(&mut url).unwrap();
    assert_eq!(&url, b"http://");
    let name = format!("serve-{}", child.0.id());
    let run_dir = run_dir_in(&env.runtime().join(&name));
    kill_9_then_nothing_left(&env, &mut child, &run_dir);
    assert!(
        !env.runtime().join(&name).exists(),
        "the record of {name} is left"
    );
    assert_eq!(env.run(&["ps", "--json"]).json(), serde_json::json!([]));
}
