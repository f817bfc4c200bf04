//! The guest agent: PID 1 in every guest, its versioned protocol, and the host-side client.
//!
//! # Pieces
//! - [`protocol`]: the message types shared by both sides; [`frame`]: the codec;
//!   [`sparse`]: hole-preserving writes of streamed files (both sides).
//! - [`config`]: [`config::AgentConfig`], carried on the kernel command line as `vm.*` words.
//! - [`client`]: [`client::AgentClient`], the async host client (Unix socket or hybrid vsock).
//! - [`agent`] (Linux): the server the `vm-agent` binary runs — as PID 1 in a guest over vsock,
//!   or on the host over a Unix socket for tests (`vm-agent --unix PATH [--root DIR]`).
//!
//! # Transport
//! Inside the guest the agent listens on vsock port [`AGENT_PORT`] (any CID). The host reaches it
//! through the VMM's hybrid-vsock Unix socket: the client writes `CONNECT <port>\n`, reads a
//! bounded `OK <n>\n` line, then speaks the protocol. The same server code serves a Unix socket
//! on the host (these hosts have no vsock loopback).
//!
//! Every write the agent makes on a connection is at most 16 KiB
//! ([`agent::bounded::BoundedWrites`]): larger guest vsock TX buffers become multi-descriptor
//! packets that vhost-device-vsock 0.3.0 (the tcg driver's backend before `vm-vsock`) drops. A Forward ends by closing the vsock stream in
//! full when the guest TCP peer reaches EOF (that backend ignores half closes); the host's
//! EOF still only half-closes the guest TCP side (see `agent::forward`).
//!
//! # Protocol (version [`PROTOCOL_VERSION`])
//! Frames are `u32` little-endian length + postcard body (byte payloads as `serde_bytes`), at
//! most [`protocol::MAX_FRAME`] (1 MiB) each way; a larger length prefix is refused before any
//! allocation. Each connection carries one operation:
//!
//! 1. `Hello{version}` -> `HelloOk{version, info}` or `Error{VersionMismatch}`.
//! 2. One [`protocol::Request`], then that operation's stream: each variant's docs are the
//!    reference (commands run, streamed or interactive; files streamed in 256 KiB chunks;
//!    listings; long-lived processes; port forwards; power-off). A request an agent cannot
//!    decode (a newer client) gets `Error{Unsupported}`. The exact bytes of every frame are
//!    pinned by `tests/wire_golden.rs`.
//!
//!    Any step may instead get `Error{kind, message}`. Cancellation: the client sends `Cancel`
//!    or closes the connection; either kills the operation's whole process tree.
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
//! `tests/*.rs` run the real `vm-agent` binary on the host over a Unix socket inside a temp root
//! (exec, files, serve, forward, hostile peers, config). cgroup and PID-1 duties cannot run on
//! these hosts (cgroup v1, no guest user space under KVM): the agent skips cgroup setup cleanly
//! when its base is not cgroup2 (`tests/cgroup.rs`), and `tests/guest.rs` checks the PID-1
//! duties and the cgroup limits in a QEMU TCG guest booted by `tests/guest/run-tcg.sh BZIMAGE`
//! (SKIP without `VM_AGENT_GUEST_SOCK`).

#[cfg(target_os = "linux")]
pub mod agent;
pub mod client;
pub mod config;
pub mod container;
pub mod frame;
pub mod protocol;
pub mod sparse;
pub mod token;

/// vsock port the agent listens on inside the guest.
pub const AGENT_PORT: u32 = 1024;
/// How the agent (PID 1) starts the console line that says why it gives up, before it powers
/// the guest off: a host that sees the VM stop quotes that line (its last words).
pub const FATAL_PREFIX: &str = "vm-agent: fatal: ";
/// Protocol version exchanged in the handshake.
/// 3: `ReadFile` carries the caller's cap and streams to EOF; `WriteFile{max}` replaces the
/// destination atomically (temporary file + rename).
/// 4: `Resume` carries host entropy (the guest's CRNG is reseeded with it) and the VM's
/// generation (`/run/vm/generation`).
pub const PROTOCOL_VERSION: u32 = 4;

pub use client::{
    AgentClient, ClientError, ClientLimits, ExecEvent, ExecStream, ForwardStream, Interactive,
    InteractiveInput, InteractiveOutput,
};
pub use config::{AgentConfig, DiskFs, DiskMount};
pub use protocol::{
    AgentInfo, Command, ErrorKind, ExecOutput, ExecRequest, ExitStatus, FileEntry,
    InteractiveRequest, ServeId, ServeRequest, ServeStatus, TtySize,
};
pub use token::AgentToken;
