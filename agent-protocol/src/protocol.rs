//! Wire protocol shared by the agent and the host client.
//!
//! Every message is one frame: a `u32` little-endian length followed by that many bytes of a
//! postcard-encoded [`ClientFrame`] (host -> agent) or [`AgentFrame`] (agent -> host). Byte
//! payloads use `serde_bytes`. Both sides refuse a length prefix above [`MAX_FRAME`] before
//! allocating anything.
//!
//! A connection carries exactly one operation:
//! `Hello -> HelloOk | Error(VersionMismatch)`, then one [`Request`] and that request's stream
//! (see the crate docs for each operation's frame sequence).

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::container::ContainerExec;

/// Hard maximum size of one frame body, both directions.
pub const MAX_FRAME: u32 = 1024 * 1024;
/// Largest byte chunk carried in one `Data`/`Stdout`/`Stderr` frame.
pub const MAX_CHUNK: usize = 256 * 1024;
/// Hard ceiling of one ReadFile/WriteFile transfer, whatever the request asks: files are
/// streamed in [`MAX_CHUNK`] chunks, so this bounds time and guest disk, not memory.
pub const MAX_FILE_BYTES: u64 = 1 << 40;
/// The default cap of one file transfer (the host client's and `vm cp`'s; configurable).
pub const DEFAULT_FILE_CAP: u64 = 1 << 30;
/// Largest stdin carried inline in an [`ExecRequest`].
pub const MAX_STDIN_BYTES: usize = 512 * 1024;
/// Hard maximum of combined output the agent retains for a non-streaming Exec.
pub const MAX_EXEC_OUTPUT: u64 = 16 * 1024 * 1024;
/// Default combined-output cap when the request does not give one.
pub const DEFAULT_EXEC_OUTPUT: u64 = 4 * 1024 * 1024;
/// Retained output tail of a Serve process.
pub const SERVE_TAIL_BYTES: usize = 64 * 1024;
/// Largest number of entries a List returns.
pub const MAX_LIST_ENTRIES: u32 = 100_000;
/// Largest tmpfs a `MountTmpfs` mounts (the guest's memory bounds it further: a tmpfs holds
/// only what is written to it).
pub const MAX_TMPFS_BYTES: u64 = 1 << 30;
/// Most ports a `Ports` reply lists.
pub const MAX_LISTENING_PORTS: usize = 1024;
/// Bytes of host entropy a `Resume` carries (256 bits: a CRNG key's worth).
pub const RESUME_ENTROPY_LEN: usize = 32;
/// Largest path (bytes) accepted anywhere in the protocol.
pub const MAX_PATH_BYTES: usize = 4096;
/// Interactive exec: stdin bytes the host may have sent and the agent not yet acknowledged
/// (`StdinAck`). The agent queues at most this much, so it can always read the next frame
/// (a `Cancel`, a `Resize`) whatever the command does with its stdin.
pub const STDIN_WINDOW: u32 = 1024 * 1024;
/// Largest stdin chunk in one `Data` frame of an interactive exec.
pub const MAX_STDIN_CHUNK: usize = 64 * 1024;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A shell line run as `/bin/sh -c <line>`.
    Shell(String),
    /// An argv run directly (`argv[0]` is looked up in `PATH` only if the env gives one).
    Argv(Vec<String>),
}

impl Default for Command {
    fn default() -> Self {
        Command::Argv(Vec::new())
    }
}

/// One command execution.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub command: Command,
    /// Bytes written to the command's stdin (then closed); at most [`MAX_STDIN_BYTES`].
    #[serde(with = "serde_bytes")]
    pub stdin: Vec<u8>,
    /// The command's whole environment: nothing is inherited.
    pub env: Vec<(String, String)>,
    /// Working directory (a guest path); `None` = the agent's root.
    pub cwd: Option<String>,
    /// Kill the whole process tree after this long; `None` = the client's default.
    pub timeout: Option<Duration>,
    /// Combined-output cap for `vm_agent_client::AgentClient::exec`; `None` = default,
    /// clamped to [`MAX_EXEC_OUTPUT`] by the agent and to the client's own cap.
    pub max_output: Option<u64>,
    /// Run as this user (`NAME`, `UID`, `NAME:GROUP` or `UID:GID`, resolved in the guest's
    /// `/etc/passwd` and `/etc/group`); `None` = root.
    pub user: Option<String>,
}

impl ExecRequest {
    /// `/bin/sh -c line`, everything else default.
    pub fn shell(line: impl Into<String>) -> Self {
        ExecRequest {
            command: Command::Shell(line.into()),
            ..Default::default()
        }
    }
    /// Run `argv` directly, everything else default.
    pub fn argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> Self {
        ExecRequest {
            command: Command::Argv(argv.into_iter().map(Into::into).collect()),
            ..Default::default()
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// Exit code when it exited normally.
    pub code: Option<i32>,
    /// Signal number when it was killed by a signal.
    pub signal: Option<i32>,
    /// The agent killed it because its timeout expired.
    pub timed_out: bool,
}

impl ExitStatus {
    /// Exited normally with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Result of a non-streaming Exec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutput {
    pub status: ExitStatus,
    /// Combined stdout+stderr in the order written (one shared pipe).
    #[serde(with = "serde_bytes")]
    pub output: Vec<u8>,
    /// Output went past the cap; the bytes past it were discarded.
    pub truncated: bool,
}

/// A regular file under a List root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to the listed directory, `/`-separated.
    pub path: String,
    pub size: u64,
}

/// The size of a terminal, in character cells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtySize {
    pub rows: u16,
    pub cols: u16,
}

/// An interactive exec: stdin streamed from the host, optionally on a pseudo-terminal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InteractiveRequest {
    /// What to run, its environment, directory and timeout; `stdin` must be empty (stdin
    /// comes as `Data` frames) and `max_output` does not apply (output is streamed).
    pub exec: ExecRequest,
    /// Allocate a pseudo-terminal of this size: the command becomes a session leader with
    /// the terminal as its controlling tty and as stdin, stdout and stderr. `None` = pipes.
    pub tty: Option<TtySize>,
}

/// A long-lived process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeRequest {
    pub command: Command,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    /// As [`ExecRequest::user`].
    pub user: Option<String>,
}

/// Identifier of a Serve process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServeId(pub u64);

/// State of a Serve process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeStatus {
    pub running: bool,
    pub exit: Option<ExitStatus>,
    /// The last [`SERVE_TAIL_BYTES`] of its combined output.
    #[serde(with = "serde_bytes")]
    pub output_tail: Vec<u8>,
}

/// What the agent says about itself in `HelloOk`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Crate version of the agent.
    pub agent_version: String,
    pub hostname: String,
    /// Running as PID 1 (in a guest).
    pub pid1: bool,
    /// Per-exec cgroup2 containment active.
    pub cgroups: bool,
}

/// One request; the first frame after the handshake. Each variant's docs give its frame
/// sequence (the protocol's reference); any step may instead get `Error{kind, message}`.
/// Variants are appended last: postcard encodes a variant by its index
/// (`tests/wire_golden.rs` pins every one's bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Reply: `Pong`.
    Ping,
    /// Reply: `Data` chunks of combined stdout+stderr as produced (through one shared pipe, so
    /// the order is kept), up to the request's cap (at most [`MAX_EXEC_OUTPUT`]; the rest is
    /// drained and dropped), then `ExecDone{status, truncated}`.
    Exec(ExecRequest),
    /// Reply: `Stdout`/`Stderr` chunks, then `Exit`. Back-pressure: the agent reads the
    /// child's pipes only as fast as it can write frames to the client.
    ExecStream(ExecRequest),
    /// Reply: `FileStart{size}` (its size when opened; a file larger than `max` is refused
    /// before any data with `TooLarge`), `Data` chunks up to EOF, `DataEnd`. A file that grows
    /// past `max` while being read ends the stream with `Error{TooLarge}`. Chunks are at most
    /// [`MAX_CHUNK`], so memory stays flat on both sides whatever the file size.
    ReadFile {
        root: String,
        path: String,
        /// The caller's cap in bytes (clamped to [`MAX_FILE_BYTES`]).
        max: u64,
    },
    /// Reply `Ok` (a temporary file beside the destination was created); the client then
    /// sends `Data` chunks totalling at most `max` bytes and `DataEnd`; the temporary file is
    /// renamed over the destination and the final reply is `Ok`. Any failure or a connection
    /// that ends before `DataEnd` removes the temporary file: no half file is left. All-zero
    /// 4 KiB blocks are written as holes (sparse).
    WriteFile {
        root: String,
        path: String,
        /// The most bytes that follow (clamped to [`MAX_FILE_BYTES`]); more is `TooLarge`.
        max: u64,
    },
    /// Reply: `ListBatch`* then `ListEnd` (regular files under `path`, recursive, with sizes).
    List { root: String, path: String },
    /// Reply: `ServeStarted{id}`; the process runs until `ServeStop` or the VM ends.
    ServeStart(ServeRequest),
    /// Reply: `ServeState`.
    ServeStatus(ServeId),
    /// Reply: `ServeState` with the final status.
    ServeStop(ServeId),
    /// Reply: `ForwardOk`, then raw bytes both ways to `127.0.0.1:port` in the guest; host EOF
    /// half-closes the guest TCP connection, guest EOF closes the whole connection. The host
    /// sends nothing before `ForwardOk`: a close (or a byte) before it abandons the connect.
    Forward { port: u16 },
    /// Reply: `Ok`, then the agent syncs and reboots (`RB_AUTOBOOT`, which ends the VM) when
    /// PID 1.
    Shutdown,
    /// Reply: `Started`, then `Stdout`/`Stderr`/`StdinAck`* and `Exit`; meanwhile the client
    /// sends `Data` (stdin, within [`STDIN_WINDOW`]), `DataEnd` (stdin EOF), `Resize`, `Cancel`,
    /// `Signal`. With `tty` the command is a session leader with the pseudo-terminal as its
    /// controlling terminal and stdin/stdout/stderr (see `agent::interactive`). An agent older
    /// than this request closes the connection without a reply, which the client reports as
    /// `ClientError::Unsupported`.
    ExecInteractive(InteractiveRequest),
    /// Reply `Ok`: creates the guest directory `path` (absolute; missing parents too, mode
    /// 0755) and, with `owner` (a user as `--user` takes it, resolved in the guest's /etc),
    /// hands the last directory to that user and its group. The runtime's own setup, with no
    /// binary from the guest root (a minimal image has no `mkdir`). An older agent answers
    /// `Unsupported`.
    MakeDirs { path: String, owner: Option<String> },
    /// Reply `Ok`: the host restored this VM from a snapshot. When the agent is PID 1, the
    /// guest's `CLOCK_REALTIME` is stepped to `unix_nanos` (the host's wall clock; the
    /// guest's clock stood still while the snapshot lay on disk), `entropy` (bytes of the
    /// host's CRNG, never all zeros) goes into the kernel's pool (`RNDADDENTROPY`) and the
    /// kernel's CRNG is reseeded at once (`RNDRESEEDCRNG`): every VM restored from one
    /// snapshot starts from the same pool, and from here on they differ. Then `generation`
    /// (the VM's, at least 1: how many restores lie behind it) is written to
    /// `/run/vm/generation` (a file replaced whole, so a process watching `/run/vm` sees one
    /// change, after the reseed), the guest's signal that whatever a process seeded before
    /// the snapshot must be seeded again. Finally every `Hello` must carry `token` from now
    /// on (the old one, which the snapshot holds, is refused: two VMs restored from one
    /// snapshot end with different tokens). Any step failing fails the request with nothing
    /// after it done (the token stays). Connections already open keep running. Protocol 4
    /// (version 3's `Resume` had neither `entropy` nor `generation`).
    Resume {
        token: [u8; crate::token::TOKEN_LEN],
        unix_nanos: u64,
        entropy: [u8; crate::protocol::RESUME_ENTROPY_LEN],
        generation: u64,
    },
    /// Reply `Ok`: mounts a fresh tmpfs of `size_bytes` (4 KiB to [`MAX_TMPFS_BYTES`]; mode
    /// 1777, `nosuid`, `nodev`) at the absolute guest directory `path` (created with its
    /// missing parents, confined like `MakeDirs`). The runtime's own setup (a container's
    /// `emptyDir` or `tmpfs` mount), with no `mount` from the guest root; only an agent that
    /// is PID 1 mounts (`Unsupported` otherwise). An older agent answers `Unsupported`.
    MountTmpfs { path: String, size_bytes: u64 },
    /// Reply `Ok`: sets the permission bits (`mode & 0o777`: never a set-id bit) of the
    /// regular file at the absolute guest path `path` (confined like `ReadFile`). The
    /// runtime's own setup: a file it copied in gets the mode of its host original (kubelet's
    /// `/dev/termination-log` is 0666, for a container that is not root). An older agent
    /// answers `Unsupported`.
    SetMode { path: String, mode: u32 },
    /// As `ExecInteractive`, with the command run with the guest directory `root` (a pod
    /// member's root, set up by [`PodMount::Root`]) as `/`, in a mount namespace of its own:
    /// its `cwd` is inside that root and its program is found on its `PATH` there. An older
    /// agent closes the connection.
    ExecInteractiveIn {
        root: String,
        request: InteractiveRequest,
    },
    /// Reply `Ok`: one step of a pod member's filesystem, done by the agent itself (only when
    /// it is PID 1; `Unsupported` otherwise, and from an older agent).
    PodMount(PodMount),
    /// As `ExecInteractiveIn` (or `ExecInteractive` without a root), with the process
    /// confined as a container's: its capabilities, `no_new_privs`, groups and seccomp filter,
    /// in the container's mount and PID namespaces (made by its first process, joined by the
    /// others; see [`crate::container`]). Only an agent that is PID 1 runs it (`Unsupported`
    /// otherwise); an older agent answers `Unsupported`.
    /// (Boxed: the confinement is by far the largest request.)
    ExecContainer(Box<ContainerExec>),
    /// Reply: `Ports` (sorted, at most [`MAX_LISTENING_PORTS`]): the TCP ports something in the guest listens
    /// on at every address (`0.0.0.0`; a loopback-only listener is not one), from the guest
    /// kernel's `/proc/net/tcp`. An older agent answers `Unsupported`.
    ListeningPorts,
    /// Reply `Ok`: removes what is at `path` below `root` (confined like `WriteFile`): a
    /// file, or a symlink itself (never what it points to). A directory is refused
    /// (`BadRequest`), nothing there is `NotFound`. An older agent answers `Unsupported`.
    Remove { root: String, path: String },
}

/// What a request holds its connection for: the agent gives each class its own connection
/// slots (`guest-agent`'s `agent::slots`), so data traffic cannot starve control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// Answered at once.
    Control,
    /// Held while a command runs.
    Exec,
    /// Held while a peer keeps a byte stream open.
    Data,
}

impl Request {
    /// This request's class, declared here with the request (no wildcard: a new variant
    /// does not compile until it has one).
    pub fn class(&self) -> RequestClass {
        match self {
            Request::Ping
            | Request::List { .. }
            | Request::ServeStart(_)
            | Request::ServeStatus(_)
            | Request::ServeStop(_)
            | Request::Shutdown
            | Request::MakeDirs { .. }
            | Request::MountTmpfs { .. }
            | Request::SetMode { .. }
            | Request::PodMount(_)
            | Request::ListeningPorts
            | Request::Remove { .. }
            | Request::Resume { .. } => RequestClass::Control,
            Request::Exec(_)
            | Request::ExecStream(_)
            | Request::ExecInteractive(_)
            | Request::ExecInteractiveIn { .. }
            | Request::ExecContainer(_) => RequestClass::Exec,
            Request::Forward { .. } | Request::ReadFile { .. } | Request::WriteFile { .. } => {
                RequestClass::Data
            }
        }
    }
}

/// The requests one frame answers, each declared once beside its variant: the host's call (its
/// docs, name and arguments), the request it sends, and the reply it takes (a pattern, an
/// optional guard, the value). A host client expands the table into its methods by naming its
/// own macro, which gets every entry in the form written here; names resolve where that macro
/// is invoked (the client imports this module's items). Requests that stream, or that return
/// the connection, are not here: their clients are written out. The runtime's own set-up in
/// the guest (directories, a tmpfs, a mode, a pod member's filesystems) is done by the agent
/// itself rather than by a `mkdir`, `mount` or `chmod` from the guest root.
#[macro_export]
macro_rules! one_frame_requests {
    ($expand:ident) => {
        $expand! {
            /// Start a long-lived process.
            pub async fn serve_start(&self, req: ServeRequest) -> ServeId {
                Request::ServeStart(req), AgentFrame::ServeStarted(id) => id
            }

            /// Running/exit state and the retained output tail of a Serve process.
            pub async fn serve_status(&self, id: ServeId) -> ServeStatus {
                Request::ServeStatus(id), AgentFrame::ServeState(s) => s
            }

            /// Kill a Serve process's whole tree and forget it; returns its final status.
            pub async fn serve_stop(&self, id: ServeId) -> ServeStatus {
                Request::ServeStop(id), AgentFrame::ServeState(s) => s
            }

            /// Creates the absolute guest directory `path` with its missing parents and, with
            /// an `owner` (a user as `--user` takes it), gives it to that user. An agent older
            /// than this request answers an error of kind `Unsupported`.
            pub async fn make_dirs(&self, path: &str, owner: Option<&str>) -> () {
                Request::MakeDirs {
                    path: path.into(),
                    owner: owner.map(str::to_string),
                },
                AgentFrame::Ok => ()
            }

            /// Mounts a fresh tmpfs of `size_bytes` at the absolute guest directory `path`
            /// (created if missing). Only an agent that is PID 1 mounts; it and an agent older
            /// than this request answer an error of kind `Unsupported`.
            pub async fn mount_tmpfs(&self, path: &str, size_bytes: u64) -> () {
                Request::MountTmpfs {
                    path: path.into(),
                    size_bytes,
                },
                AgentFrame::Ok => ()
            }

            /// Sets the permission bits (`mode & 0o777`) of the regular file at the absolute
            /// guest path `path`. An agent older than this request answers an error of kind
            /// `Unsupported`.
            pub async fn set_mode(&self, path: &str, mode: u32) -> () {
                Request::SetMode {
                    path: path.into(),
                    mode,
                },
                AgentFrame::Ok => ()
            }

            /// The TCP ports something in the guest listens on at every address (sorted, at
            /// most `MAX_LISTENING_PORTS`). An agent older than this request answers an error
            /// of kind `Unsupported`.
            pub async fn listening_ports(&self) -> Vec<u16> {
                Request::ListeningPorts,
                AgentFrame::Ports(p) if p.len() <= MAX_LISTENING_PORTS => p
            }

            /// One step of a pod member's filesystems (`PodMount`). Only an agent that is PID 1
            /// mounts; it and an agent older than this request answer an error of kind
            /// `Unsupported`.
            pub async fn pod_mount(&self, m: PodMount) -> () {
                Request::PodMount(m), AgentFrame::Ok => ()
            }

            /// Removes the file at `path` below `root` (a symlink itself, never its target;
            /// a directory is refused). An agent older than this request answers an error of
            /// kind `Unsupported`.
            pub async fn remove(&self, root: &str, path: &str) -> () {
                Request::Remove {
                    root: root.into(),
                    path: path.into(),
                },
                AgentFrame::Ok => ()
            }
        }
    };
}

/// Largest tmpfs upper of a pod member's root: 64 GiB (the guest's memory bounds it anyway).
pub const MAX_POD_UPPER_BYTES: u64 = 64 << 30;
/// Where the cgroup of the pod member assembled in `dir` is in a PID-1 agent's guest (its
/// `memory.current`, `pids.current` and `cpu.stat` are the member's usage).
pub fn pod_member_cgroup(dir: &str) -> String {
    format!(
        "/sys/fs/cgroup/work/pod-{}",
        dir.rsplit('/').next().unwrap_or_default()
    )
}

/// The range of a pod member's CPU period, microseconds (the kernel's: 1 ms to 1 s).
pub const POD_CPU_PERIOD_MICROS: std::ops::RangeInclusive<u64> = 1_000..=1_000_000;
/// The range of a pod member's CPU quota, microseconds per period (1 ms to 64 CPUs' worth of
/// the longest period).
pub const POD_CPU_QUOTA_MICROS: std::ops::RangeInclusive<u64> = 1_000..=64_000_000;

/// Smallest memory limit of a pod member: 4 MiB.
pub const MIN_POD_MEMORY_BYTES: u64 = 4 << 20;

/// A pod member's filesystem (see [`Request::PodMount`]). Every `device` is the guest path
/// of a raw disk (the link the agent made at boot for a `vm.disk=…:raw`) that the host has
/// since filled with an erofs image: the agent drops the device's cached blocks before it
/// mounts, so what it mounts is what the host wrote, not what the kernel read at boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodMount {
    /// The container's root at `dir/root`: the erofs on `device` read-only at `dir/lower`
    /// under a tmpfs overlay of `upper_bytes` (at most [`MAX_POD_UPPER_BYTES`]), with the
    /// guest's own `/proc`, a read-only `/sys` (with the pod's cgroup2 tree at
    /// `/sys/fs/cgroup`) and a `/dev` of its own (the standard nodes, the guest's `/dev/pts`,
    /// and the pod's shared `/dev/shm`). Every process later run in
    /// that root ([`Request::ExecInteractiveIn`]) is in one cgroup of the container's with
    /// `memory_bytes` (at least [`MIN_POD_MEMORY_BYTES`]), `pids` and `cpu_max` (CFS quota in
    /// [`POD_CPU_QUOTA_MICROS`] per period in [`POD_CPU_PERIOD_MICROS`]) as its limits (`None`:
    /// the VM's).
    Root {
        device: String,
        dir: String,
        upper_bytes: u64,
        memory_bytes: Option<u64>,
        pids: Option<u64>,
        cpu_max: Option<(u64, u64)>,
    },
    /// The read-only erofs volume on `device` at `path`.
    Volume { device: String, path: String },
    /// The guest directory `source` bound at `path` (a pod's shared `emptyDir`).
    Bind { source: String, path: String },
    /// Unmount everything at and below `path`, deepest first, without detaching a busy mount:
    /// an error means something is still mounted (and its disk is not free).
    Unmount { path: String },
}

/// Host -> agent frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientFrame {
    /// The first frame of every connection. `token` is the per-boot secret
    /// ([`crate::token::AgentToken`]); a wrong one closes the connection without a reply.
    Hello {
        version: u32,
        token: [u8; crate::token::TOKEN_LEN],
    },
    Request(Request),
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    DataEnd,
    /// Cancel the running operation (Exec: kill its whole tree).
    Cancel,
    /// Interactive exec with a terminal: the new window size (the command gets `SIGWINCH`).
    Resize(TtySize),
    /// Interactive exec: deliver `signal` (1..=[`MAX_SIGNAL`]) to the command (`all`: to its
    /// whole process group). The command's exit is reported as usual. An agent older than
    /// this frame ends the session. (Appended last: earlier variants keep their encoding.)
    Signal {
        signal: i32,
        all: bool,
    },
}

/// The highest signal number a [`ClientFrame::Signal`] may carry (`SIGRTMAX` on Linux x86-64).
pub const MAX_SIGNAL: i32 = 64;

/// Error categories the agent reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    VersionMismatch,
    BadRequest,
    NotFound,
    /// A path that would leave its root (`..`, absolute, symlink out).
    Escape,
    TooLarge,
    Busy,
    Io,
    Spawn,
    Unsupported,
    Cancelled,
    /// Exec/Serve: the program does not exist (on the `PATH` of the request's environment,
    /// or at the path given). The message reads like a shell's: `NAME: command not found`.
    CommandNotFound,
    /// Exec/Serve: the program exists but cannot be executed (no execute permission, not
    /// an executable format, a directory). The message: `NAME: cannot execute: REASON`.
    NotExecutable,
}

/// An error reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    pub kind: ErrorKind,
    pub message: String,
}

/// Agent -> host frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentFrame {
    HelloOk {
        version: u32,
        info: AgentInfo,
    },
    Error(WireError),
    Pong,
    Ok,
    ExecDone {
        status: ExitStatus,
        truncated: bool,
    },
    Stdout(#[serde(with = "serde_bytes")] Vec<u8>),
    Stderr(#[serde(with = "serde_bytes")] Vec<u8>),
    Exit(ExitStatus),
    FileStart {
        size: u64,
    },
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    DataEnd,
    ListBatch(Vec<FileEntry>),
    ListEnd,
    ServeStarted(ServeId),
    ServeState(ServeStatus),
    ForwardOk,
    /// Interactive exec: the command was started.
    Started,
    /// Interactive exec: this many more stdin bytes were written to the command (the
    /// client may send that much more).
    StdinAck(u32),
    /// `ListeningPorts`: the ports.
    Ports(Vec<u16>),
}

impl AgentFrame {
    /// Variant name, for error messages (never the payload).
    pub fn name(&self) -> &'static str {
        match self {
            AgentFrame::HelloOk { .. } => "HelloOk",
            AgentFrame::Error(_) => "Error",
            AgentFrame::Pong => "Pong",
            AgentFrame::Ok => "Ok",
            AgentFrame::ExecDone { .. } => "ExecDone",
            AgentFrame::Stdout(_) => "Stdout",
            AgentFrame::Stderr(_) => "Stderr",
            AgentFrame::Exit(_) => "Exit",
            AgentFrame::FileStart { .. } => "FileStart",
            AgentFrame::Data(_) => "Data",
            AgentFrame::DataEnd => "DataEnd",
            AgentFrame::ListBatch(_) => "ListBatch",
            AgentFrame::ListEnd => "ListEnd",
            AgentFrame::ServeStarted(_) => "ServeStarted",
            AgentFrame::ServeState(_) => "ServeState",
            AgentFrame::ForwardOk => "ForwardOk",
            AgentFrame::Started => "Started",
            AgentFrame::StdinAck(_) => "StdinAck",
            AgentFrame::Ports(_) => "Ports",
        }
    }
}
