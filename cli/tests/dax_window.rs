//! `--dax-window SIZE`: each read-only mount's DAX window (kvm maps the host's page cache into
//! the guest through it). tcg has none, so a window asked for there is refused before anything
//! is created (by `vm exec`, and by `vm run -d` before its supervisor starts), naming the
//! setting and why, never dropped; `--dax-window 0` (no window: the guest's
//! own page cache) boots and the mount reads as the host has it. kvm's own checks (a size not
//! a multiple of 2 MiB, past the stride) are the driver's unit tests; the window itself is
//! the nested kvm road's (`mounts`, `ci/kvm-nested.sh --weights`).

mod common;

use common::Env;
use vm_test_support::no_guest_driver;

const TEST: &str = "a_dax_window_on_tcg_is_refused_and_none_reads_the_mount";
/// `vm`'s own failure code: what the driver does not do (as a VM that could not boot).
const VM_FAILED: i32 = 125;

#[test]
fn a_dax_window_on_tcg_is_refused_and_none_reads_the_mount() {
    let env = Env::new();
    if let Some(why) = common::guest_unavailable(&env) {
        return no_guest_driver(TEST, &why);
    }
    let share = env.dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    std::fs::write(share.join("w"), b"weights\n").unwrap();
    let mount = format!("{}:/m:ro", share.display());
    let exec = |window: &str| {
        env.run(&[
            "exec",
            "--allow-emulation",
            "--driver",
            "tcg",
            "--dax-window",
            window,
            "-v",
            &mount,
            "--",
            "cat",
            "/m/w",
        ])
    };
    let out = exec("64M");
    assert_eq!(out.code, VM_FAILED, "{out:?}");
    assert!(
        out.stderr.contains("dax_window_mib: 64 MiB asked for")
            && out.stderr.contains("tcg has no DAX window"),
        "{}",
        out.stderr
    );
    let out = exec("0");
    assert_eq!((out.code, out.stdout.as_str()), (0, "weights\n"), "{out:?}");

    // `vm run -d` refuses it before its supervisor starts: nothing is left to `vm rm`.
    let out = env.run(&[
        "run",
        "-d",
        "--name",
        "daxw",
        "--allow-emulation",
        "--driver",
        "tcg",
        "--dax-window",
        "64M",
        "-v",
        &mount,
    ]);
    assert_eq!(out.code, VM_FAILED, "{out:?}");
    assert!(
        out.stderr.contains("dax_window_mib: 64 MiB asked for"),
        "{}",
        out.stderr
    );
    assert!(
        !env.runtime().join("daxw").exists(),
        "a refused window left a VM record"
    );
}
