//! `vm-agent`: PID 1 in every guest; on the host, a test server over a Unix socket.
//!
//! As PID 1 it clears its environment, makes itself unreadable to guest code (non-dumpable,
//! `CAP_SYS_PTRACE`/`CAP_SYS_RAWIO` out of every child's bounding set), mounts the early
//! filesystems, reads its configuration from `/proc/cmdline` (`vm.*` words), loads a
//! distribution kernel's modules from the initramfs (then turns module loading off), protects itself
//! from the OOM killer, brings up `lo`, sets the hostname, mounts its read-only disks, takes the
//! per-boot token the host appended to the initramfs (and unlinks it), sets up the `work`
//! cgroup with the limits, listens on vsock (host peers only) and prints `vm-agent: ready port=<port> proto=<n>` on the console. Anything
//! fatal (including a panic) is logged and ends in sync + reboot, never in an exit.
//!
//! Otherwise: `vm-agent --unix PATH [--root DIR] [--cmdline 'vm.…'] [--io-timeout-ms N]
//! [--cgroup-root DIR] [--token-file PATH]` serves on a Unix socket (as a child subreaper) and prints
//! `vm-agent: ready unix=PATH proto=<n>` on stdout.

#[cfg(target_os = "linux")]
mod run;

#[cfg(target_os = "linux")]
fn main() {
    run::main();
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("vm-agent: only Linux is supported");
    std::process::exit(2);
}
