//! The end-to-end suite as one test binary, for the kvm proof pack: every scenario file of
//! `tests/`, included as a module (`vm_tests::tests::the_proof_binary_includes_every_scenario`
//! fails when one is missing here).

#[path = "../tests/agent_fatal.rs"]
mod agent_fatal;
#[path = "../tests/attacker.rs"]
mod attacker;
#[path = "../tests/boot.rs"]
mod boot;
#[path = "../tests/cancel.rs"]
mod cancel;
#[path = "../tests/egress.rs"]
mod egress;
#[path = "../tests/env.rs"]
mod env;
#[path = "../tests/exec.rs"]
mod exec;
#[path = "../tests/files.rs"]
mod files;
#[path = "../tests/interactive.rs"]
mod interactive;
#[path = "../tests/memory.rs"]
mod memory;
#[path = "../tests/mounts.rs"]
mod mounts;
#[path = "../tests/parallel.rs"]
mod parallel;
#[path = "../tests/pause.rs"]
mod pause;
#[path = "../tests/pids.rs"]
mod pids;
#[path = "../tests/refusal.rs"]
mod refusal;
#[path = "../tests/rootfs.rs"]
mod rootfs;
#[path = "../tests/rootfs_debian.rs"]
mod rootfs_debian;
#[path = "../tests/serve.rs"]
mod serve;
#[path = "../tests/snapshot.rs"]
mod snapshot;
#[path = "../tests/stalled.rs"]
mod stalled;
#[path = "../tests/vsock_host.rs"]
mod vsock_host;
#[path = "../tests/wall.rs"]
mod wall;
