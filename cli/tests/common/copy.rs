//! Helpers of the `vm cp` streaming tests: sparse files with data islands and their digests
//! (`vm_test_support::data`), and one `vm` run's peak RSS (VmHWM at exit, from `wait4`).

use std::path::Path;

use super::{Env, Out};

pub const MIB: u64 = vm_test_support::data::MIB;

/// The documented bound: a `vm cp` of any size peaks below this RSS.
pub const VM_CP_HWM_BOUND_KIB: u64 = 64 * 1024;

pub fn sparse_file(p: &Path, size: u64) {
    vm_test_support::data::sparse_file(p, size).unwrap();
}

pub fn sha256_of(p: &Path) -> String {
    vm_test_support::data::sha256_file(p).unwrap()
}

pub fn allocated(p: &Path) -> u64 {
    vm_test_support::data::allocated(p).unwrap()
}

/// Runs `vm ARGS` to completion; its result and its peak RSS in KiB.
pub fn run_peak_rss(env: &Env, args: &[&str]) -> (Out, u64) {
    let out_path = env.dir.path().join("peak.stdout");
    let err_path = env.dir.path().join("peak.stderr");
    let child = env
        .cmd()
        .args(args)
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; status and ru are ours.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child); // reaped by wait4
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    let out = Out {
        code,
        stdout: String::from_utf8_lossy(&std::fs::read(&out_path).unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&std::fs::read(&err_path).unwrap()).into_owned(),
    };
    (out, ru.ru_maxrss as u64)
}
