//! The guest agent's protocol: what the host and `vm-agent` (PID 1 in every guest) say to
//! each other, shared by both sides and nothing else. The server is `guest-agent`, the host
//! client `vm-agent-client`; host crates compile this crate and the client, never the server.
//!
//! # Pieces
//! - [`protocol`]: the message types; [`frame`]: the codec; [`sparse`]: hole-preserving
//!   writes of streamed files (both sides); [`container`]: what a container exec carries.
//! - [`config`]: [`config::AgentConfig`], carried on the kernel command line as `vm.*` words.
//! - [`token`]: the per-boot token a host proves itself with.
//!
//! # Transport
//! Inside the guest the agent listens on vsock port [`AGENT_PORT`] (any CID). The host reaches it
//! through the VMM's hybrid-vsock Unix socket: the client writes `CONNECT <port>\n`, reads a
//! bounded `OK <n>\n` line, then speaks the protocol. The same server code serves a Unix socket
//! on the host (these hosts have no vsock loopback).
//!
//! Every write the agent makes on a connection is at most 16 KiB (the server's
//! `agent::bounded::BoundedWrites`): larger guest vsock TX buffers become multi-descriptor
//! packets that vhost-device-vsock 0.3.0 (the tcg driver's backend before `vm-vsock`) drops. A
//! Forward ends by closing the vsock stream in full when the guest TCP peer reaches EOF (that
//! backend ignores half closes); the host's EOF still only half-closes the guest TCP side.
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
//!    pinned by `guest-agent/tests/wire_golden.rs`.
//!
//!    Any step may instead get `Error{kind, message}`. Cancellation: the client sends `Cancel`
//!    or closes the connection; either kills the operation's whole process tree.

pub mod config;
pub mod container;
pub mod frame;
pub mod initramfs;
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

pub use config::{AgentConfig, DiskFs, DiskMount};
pub use protocol::{
    AgentInfo, Command, ErrorKind, ExecOutput, ExecRequest, ExitStatus, FileEntry,
    InteractiveRequest, ServeId, ServeRequest, ServeStatus, TtySize,
};
pub use token::AgentToken;
