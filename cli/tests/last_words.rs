//! A guest whose agent cannot start says why, through the CLI: a root image the guest cannot
//! mount makes the agent (PID 1) print its fatal error and power off; `vm exec` names it in
//! its error, and a `vm run -d` VM that never booted keeps it for `vm logs --console`. Run on
//! the driver `vm` selects here (tcg on these hosts; the nested-KVM runner's L1 checks the
//! same on kvm, `ci/kvm-nested-init.sh`).

mod common;

use common::Env;

/// An "erofs" image that is nothing but the superblock magic: accepted by the host's format
/// check, refused by the guest kernel's mount.
fn broken_root(env: &Env) -> String {
    let mut b = vec![0u8; 1 << 20];
    b[1024..1028].copy_from_slice(&0xE0F5_E1E2u32.to_le_bytes());
    let p = env.dir.path().join("broken.erofs");
    std::fs::write(&p, b).unwrap();
    p.display().to_string()
}

const FATAL: &str = "vm-agent: fatal: image root";

#[test]
fn exec_and_logs_show_the_agents_last_words() {
    let env = Env::new();
    if common::no_guest_here(&env, "exec_and_logs_show_the_agents_last_words") {
        return;
    }
    let root = broken_root(&env);
    let out = env.run(&["exec", "--allow-emulation", "--rootfs", &root, "--", "true"]);
    assert_eq!(out.code, 125, "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains(FATAL),
        "vm exec's error lacks the agent's fatal line: {}",
        out.stderr
    );

    let out = env.run(&[
        "run",
        "-d",
        "--name",
        "broken",
        "--allow-emulation",
        "--rootfs",
        &root,
    ]);
    assert_ne!(
        out.code, 0,
        "a VM whose root cannot be mounted started: {}",
        out.stdout
    );
    assert!(
        out.stderr.contains(FATAL),
        "vm run -d's error lacks the agent's fatal line: {}",
        out.stderr
    );
    let logs = env.run(&["logs", "--console", "broken"]);
    assert_eq!(logs.code, 0, "stderr: {}", logs.stderr);
    assert!(
        logs.stdout.contains(FATAL),
        "vm logs --console lacks it:\n{}",
        logs.stdout
    );
    assert!(
        logs.stdout.contains("vm-agent: powering off"),
        "{}",
        logs.stdout
    );
    assert_eq!(env.run(&["rm", "broken"]).code, 0);
}
