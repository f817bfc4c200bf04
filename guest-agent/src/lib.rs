//! The guest agent's server: what `vm-agent` runs, as PID 1 in a guest over vsock, or on the
//! host over a Unix socket for tests (`vm-agent --unix PATH [--root DIR]`). Its protocol is
//! `vm-agent-protocol`, its host client `vm-agent-client`; host crates link those two, and this
//! crate only in tests that run an agent in-process.
//!
//! # Containment of what the agent runs
//! Each Exec/Serve gets its own process group (`setsid`) and, when `/sys/fs/cgroup` is cgroup2,
//! its own cgroup `/sys/fs/cgroup/work/<id>` under a `work` cgroup carrying `pids.max` and
//! `memory.max`. Killing a tree = `cgroup.kill` (else `SIGKILL` to the process group), then
//! reaping. When the main process of an Exec exits, whatever it left behind is killed too.
//! Children get `oom_score_adj` 0; the agent itself runs at -1000, so the OOM killer picks the
//! allocating process, never the agent.
//!
//! # Reaping
//! One reaper owns `waitpid`: children are spawned while holding the reaper's table lock and
//! registered by pid before it is released, and the reaper (woken by `SIGCHLD`, with a periodic
//! tick as a fallback) dispatches each status to the registered waiter. As PID 1 (or a
//! subreaper on the host) it reaps with `waitpid(-1)` and silently discards orphans' statuses.
//!
//! # Files
//! Paths are relative to a root; `..` components and absolute paths are refused up front, and
//! every open goes through `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` on directory fds,
//! so symlinks (or a directory swapped for a symlink mid-call) cannot lead outside the root.
//!
//! # Client API
//! [`AgentClient`] (see [`client`]): one method per request, each bounded in size and time.
//!
//! # Testing
//! `tests/*.rs` run the real `vm-agent` binary (with `vm-agent-client`) on the host over a Unix socket inside a temp root
//! (exec, files, serve, forward, hostile peers, config). cgroup and PID-1 duties cannot run on
//! these hosts (cgroup v1, no guest user space under KVM): the agent skips cgroup setup cleanly
//! when its base is not cgroup2 (`tests/cgroup.rs`), and `tests/guest.rs` checks the PID-1
//! duties and the cgroup limits in a QEMU TCG guest booted by `tests/guest/run-tcg.sh BZIMAGE`
//! (SKIP without `VM_AGENT_GUEST_SOCK`).

#[cfg(target_os = "linux")]
pub mod agent;
