//! Host-side client of the agent.
//!
//! The agent is treated as hostile: every step has a timeout, every frame is bounded by
//! [`MAX_FRAME`] (a larger length prefix is refused before allocating), output and file buffers
//! are bounded by [`ClientLimits`], and any malformed or unexpected reply is a typed
//! [`ClientError`], never a panic. One connection per request; [`AgentClient`] is cheap to clone.

use std::path::PathBuf;
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::time::Instant;

/// Expands the protocol's table of the requests one frame answers
/// ([`vm_agent_protocol::one_frame_requests`]) into client methods: each connects, shakes
/// hands, sends the request and matches the reply; any other frame is
/// [`ClientError::Unexpected`] naming the method, an agent error its [`ClientError::Agent`].
/// Requests that stream, or return the connection, are written out by hand.
macro_rules! one_frame_methods {
    ($(
        $(#[$meta:meta])*
        pub async fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $out:ty {
            $req:expr, $reply:pat $(if $guard:expr)? => $value:expr $(,)?
        }
    )*) => {
        impl AgentClient {
            $(
                $(#[$meta])*
                pub async fn $name(&self $(, $arg: $ty)*) -> Result<$out, ClientError> {
                    let (mut c, _) = self.connect().await?;
                    match c.request($req, stringify!($name)).await? {
                        $reply $(if $guard)? => Ok($value),
                        f => Err(unexpected(stringify!($name), &f)),
                    }
                }
            )*
        }
    };
}

mod files;
mod hybrid;
mod interactive;
mod ready;
mod resume;
mod stream;

/// The methods of the requests one frame answers, from the protocol's table.
mod declared {
    use super::{AgentClient, ClientError, unexpected};
    use vm_agent_protocol::protocol::*;

    vm_agent_protocol::one_frame_requests!(one_frame_methods);
}

pub use interactive::{Interactive, InteractiveInput, InteractiveOutput};
pub use ready::{READY_ATTEMPT, READY_RETRY_MAX};
pub use stream::{ExecEvent, ExecStream};

use vm_agent_protocol::PROTOCOL_VERSION;
use vm_agent_protocol::frame::{FrameError, encode_frame, read_frame, write_frame};
use vm_agent_protocol::protocol::{
    AgentFrame, AgentInfo, ClientFrame, ErrorKind, ExecOutput, ExecRequest, MAX_EXEC_OUTPUT,
    MAX_FRAME, MAX_LIST_ENTRIES, MAX_STDIN_BYTES, Request,
};
use vm_agent_protocol::token::{AgentToken, TOKEN_LEN};

/// The byte stream returned by [`AgentClient::forward`]: spliced to `127.0.0.1:<port>` in the guest.
pub type ForwardStream = UnixStream;

/// Default cap of a file held whole in host memory ([`AgentClient::read_file`]): files larger
/// than this are for the streaming calls.
pub const MAX_IN_MEMORY_FILE: u64 = 64 * 1024 * 1024;

/// Bounds and timeouts of a client.
#[derive(Debug, Clone)]
pub struct ClientLimits {
    /// Connecting to the socket (and the hybrid-vsock `CONNECT` exchange).
    pub connect_timeout: Duration,
    /// Each handshake step, each request/reply frame, each frame body.
    pub step_timeout: Duration,
    /// Cap on combined Exec output kept in host memory; past it output is dropped and
    /// `truncated` set.
    pub max_output_bytes: u64,
    /// Cap on the size of a file read into memory ([`AgentClient::read_file`]); the
    /// streaming calls take their cap as an argument.
    pub max_file_bytes: u64,
    /// Cap on List entries.
    pub max_list_entries: usize,
    /// Exec timeout when the request gives none.
    pub default_exec_timeout: Duration,
    /// Extra time past an Exec's timeout before the client gives up on the agent.
    pub exec_grace: Duration,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            connect_timeout: Duration::from_secs(5),
            step_timeout: Duration::from_secs(10),
            max_output_bytes: MAX_EXEC_OUTPUT,
            max_file_bytes: MAX_IN_MEMORY_FILE,
            max_list_entries: MAX_LIST_ENTRIES as usize,
            default_exec_timeout: Duration::from_secs(3600),
            exec_grace: Duration::from_secs(5),
        }
    }
}

/// Client errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out during {step}")]
    Timeout { step: &'static str },
    /// The VM's vsock device did not answer `CONNECT <port>` with `OK`: `reply` is what it
    /// sent instead (empty: it closed the connection without a word).
    #[error("hybrid vsock handshake failed: {}", hybrid::describe_handshake(*.port, .reply))]
    VsockHandshake { port: u32, reply: String },
    #[error("protocol error during {step}")]
    Frame {
        step: &'static str,
        #[source]
        source: FrameError,
    },
    #[error("agent speaks protocol {agent:?}, we speak {ours}")]
    VersionMismatch { agent: Option<u32>, ours: u32 },
    #[error("agent error ({kind:?}): {message}")]
    Agent { kind: ErrorKind, message: String },
    #[error("unexpected {got} frame during {step}")]
    Unexpected {
        step: &'static str,
        got: &'static str,
    },
    #[error("{what} exceeds the limit of {max} bytes")]
    TooLarge { what: &'static str, max: u64 },
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    #[error(
        "the agent does not support {what} (it is older than this client: rebuild the guest image)"
    )]
    Unsupported { what: &'static str },
    #[error("the interactive command has ended")]
    Ended,
    #[error("i/o error during {step}")]
    Io {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    /// The agent's error kind, when this is an agent-reported error.
    pub fn agent_kind(&self) -> Option<ErrorKind> {
        match self {
            ClientError::Agent { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Transport {
    Unix(PathBuf),
    HybridVsock { path: PathBuf, port: u32 },
}

/// Async client; one connection per request.
#[derive(Debug, Clone)]
pub struct AgentClient {
    transport: Transport,
    limits: ClientLimits,
    /// Presented in every `Hello`; `None` sends zeros, which an agent with a token refuses.
    token: Option<AgentToken>,
}

#[derive(Debug)]
struct Conn {
    s: UnixStream,
    step: Duration,
}

impl Conn {
    async fn send(&mut self, f: &ClientFrame, step: &'static str) -> Result<(), ClientError> {
        write_frame(&mut self.s, f, MAX_FRAME, self.step)
            .await
            .map_err(|e| frame_err(step, e))
    }
    /// Receive a frame; `first` bounds the wait for it (default: the step timeout).
    async fn recv(
        &mut self,
        first: Option<Duration>,
        step: &'static str,
    ) -> Result<AgentFrame, ClientError> {
        let f = read_frame(
            &mut self.s,
            MAX_FRAME,
            Some(first.unwrap_or(self.step)),
            self.step,
        )
        .await
        .map_err(|e| frame_err(step, e))?;
        match f {
            AgentFrame::Error(e) => Err(ClientError::Agent {
                kind: e.kind,
                message: e.message,
            }),
            f => Ok(f),
        }
    }
    async fn request(&mut self, r: Request, step: &'static str) -> Result<AgentFrame, ClientError> {
        self.send_or_reason(&ClientFrame::Request(r), step).await?;
        self.recv(None, step).await
    }
    /// Send; if the agent already closed the connection, prefer the error frame it left
    /// behind (e.g. `Busy`) over the bare write error.
    async fn send_or_reason(
        &mut self,
        f: &ClientFrame,
        step: &'static str,
    ) -> Result<(), ClientError> {
        match self.send(f, step).await {
            Err(
                e @ ClientError::Frame {
                    source: FrameError::Io(_),
                    ..
                },
            ) => match self.recv(Some(Duration::from_millis(100)), step).await {
                Err(agent @ ClientError::Agent { .. }) => Err(agent),
                _ => Err(e),
            },
            r => r,
        }
    }
}

fn frame_err(step: &'static str, e: FrameError) -> ClientError {
    match e {
        FrameError::Timeout => ClientError::Timeout { step },
        source => ClientError::Frame { step, source },
    }
}

fn unexpected(step: &'static str, f: &AgentFrame) -> ClientError {
    ClientError::Unexpected {
        step,
        got: f.name(),
    }
}

impl AgentClient {
    /// Talk to an agent listening directly on a Unix socket (host tests).
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        AgentClient {
            transport: Transport::Unix(path.into()),
            limits: ClientLimits::default(),
            token: None,
        }
    }

    /// Talk to a guest agent through a hybrid-vsock Unix socket (`CONNECT <port>\n` -> `OK <n>\n`).
    pub fn hybrid_vsock(uds_path: impl Into<PathBuf>, port: u32) -> Self {
        AgentClient {
            transport: Transport::HybridVsock {
                path: uds_path.into(),
                port,
            },
            limits: ClientLimits::default(),
            token: None,
        }
    }

    pub fn with_limits(mut self, limits: ClientLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Present `token` (the agent's per-boot secret) in every connection's `Hello`.
    pub fn with_token(mut self, token: AgentToken) -> Self {
        self.token = Some(token);
        self
    }

    pub fn limits(&self) -> &ClientLimits {
        &self.limits
    }

    /// The token this client presents, if any.
    pub fn token(&self) -> Option<&AgentToken> {
        self.token.as_ref()
    }

    /// Connects and shakes hands. A connection the agent drops before its handshake answers
    /// (closed or reset while `Hello` goes out or `HelloOk` is awaited) carried no request, so
    /// it is retried, a bounded number of times: under load the agent's pool of connections in
    /// their handshake can be full for a moment (a connection the host abandoned mid-`CONNECT`
    /// is accepted late and held until the host side closes), and the agent refuses the
    /// excess without a word.
    async fn connect(&self) -> Result<(Conn, AgentInfo), ClientError> {
        let mut delay = HANDSHAKE_RETRY_DELAY;
        for _ in 1..HANDSHAKE_ATTEMPTS {
            match self.connect_once().await {
                Err(e) if dropped_in_handshake(&e) => {
                    tracing::debug!(error = %e, "the agent dropped the connection in its handshake; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(HANDSHAKE_RETRY_MAX);
                }
                r => return r,
            }
        }
        self.connect_once().await
    }

    async fn connect_once(&self) -> Result<(Conn, AgentInfo), ClientError> {
        let path = match &self.transport {
            Transport::Unix(p) | Transport::HybridVsock { path: p, .. } => p,
        };
        let ct = self.limits.connect_timeout;
        let connect_err = |source| ClientError::Connect {
            path: path.clone(),
            source,
        };
        let hello = ClientFrame::Hello {
            version: PROTOCOL_VERSION,
            token: self.token.as_ref().map_or([0; TOKEN_LEN], |t| *t.bytes()),
        };
        // Through hybrid vsock the `Hello` goes out with the `CONNECT` line, in one write made
        // as the connection is made: the vsock device then sees a client that speaks at once,
        // which a flood of silent connections never pushes out or queues ahead of
        // (`vmm::virtio::vsock::muxer`).
        let (s, pipelined) = match &self.transport {
            Transport::HybridVsock { port, .. } => {
                let first =
                    encode_frame(&hello, MAX_FRAME).map_err(|e| frame_err("handshake", e))?;
                let out = hybrid::connect_line(*port, &first);
                let (s, sent) = tokio::time::timeout(ct, hybrid::connect_sending(path, &out))
                    .await
                    .map_err(|_| ClientError::Timeout { step: "connect" })?
                    .map_err(connect_err)?;
                let rest = out[sent..].to_vec();
                (hybrid::vsock_handshake(s, *port, rest, ct).await?, true)
            }
            Transport::Unix(_) => {
                let s = tokio::time::timeout(ct, hybrid::connect_retrying(path))
                    .await
                    .map_err(|_| ClientError::Timeout { step: "connect" })?
                    .map_err(connect_err)?;
                (s, false)
            }
        };
        let mut conn = Conn {
            s,
            step: self.limits.step_timeout,
        };
        if !pipelined {
            conn.send_or_reason(&hello, "handshake").await?;
        }
        match conn.recv(None, "handshake").await {
            Ok(AgentFrame::HelloOk { version, info }) if version == PROTOCOL_VERSION => {
                Ok((conn, info))
            }
            Ok(AgentFrame::HelloOk { version, .. }) => Err(ClientError::VersionMismatch {
                agent: Some(version),
                ours: PROTOCOL_VERSION,
            }),
            Ok(f) => Err(unexpected("handshake", &f)),
            Err(ClientError::Agent {
                kind: ErrorKind::VersionMismatch,
                ..
            }) => Err(ClientError::VersionMismatch {
                agent: None,
                ours: PROTOCOL_VERSION,
            }),
            Err(e) => Err(e),
        }
    }

    /// Handshake and a `Ping`; returns what the agent says about itself.
    pub async fn ping(&self) -> Result<AgentInfo, ClientError> {
        let (mut c, info) = self.connect().await?;
        match c.request(Request::Ping, "ping").await? {
            AgentFrame::Pong => Ok(info),
            f => Err(unexpected("ping", &f)),
        }
    }

    fn prepare_exec(
        &self,
        mut req: ExecRequest,
    ) -> Result<(ExecRequest, Instant, u64), ClientError> {
        if req.stdin.len() > MAX_STDIN_BYTES {
            return Err(ClientError::TooLarge {
                what: "exec stdin",
                max: MAX_STDIN_BYTES as u64,
            });
        }
        let timeout = req.timeout.unwrap_or(self.limits.default_exec_timeout);
        req.timeout = Some(timeout);
        let cap = req
            .max_output
            .unwrap_or(vm_agent_protocol::protocol::DEFAULT_EXEC_OUTPUT)
            .min(self.limits.max_output_bytes)
            .min(MAX_EXEC_OUTPUT);
        req.max_output = Some(cap);
        let deadline = Instant::now() + timeout + self.limits.exec_grace + self.limits.step_timeout;
        Ok((req, deadline, cap))
    }

    /// Run a command to completion; combined output bounded by the request's and the client's caps.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, ClientError> {
        let (req, deadline, cap) = self.prepare_exec(req)?;
        let (mut c, _) = self.connect().await?;
        c.send(&ClientFrame::Request(Request::Exec(req)), "exec")
            .await?;
        let mut out = ExecOutput::default();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match c.recv(Some(left), "exec").await? {
                AgentFrame::Data(d) => {
                    let room = cap.saturating_sub(out.output.len() as u64) as usize;
                    if d.len() > room {
                        out.truncated = true;
                    }
                    out.output.extend_from_slice(&d[..d.len().min(room)]);
                }
                AgentFrame::ExecDone { status, truncated } => {
                    out.status = status;
                    out.truncated |= truncated;
                    return Ok(out);
                }
                f => return Err(unexpected("exec", &f)),
            }
        }
    }

    /// Start a command whose stdout/stderr arrive as they are produced.
    pub async fn exec_stream(&self, req: ExecRequest) -> Result<ExecStream, ClientError> {
        let (req, deadline, _) = self.prepare_exec(req)?;
        let (mut c, _) = self.connect().await?;
        c.send(
            &ClientFrame::Request(Request::ExecStream(req)),
            "exec_stream",
        )
        .await?;
        Ok(ExecStream::new(c, deadline))
    }

    /// A byte stream spliced to `127.0.0.1:port` inside the guest.
    pub async fn forward(&self, port: u16) -> Result<ForwardStream, ClientError> {
        let (mut c, _) = self.connect().await?;
        match c.request(Request::Forward { port }, "forward").await? {
            AgentFrame::ForwardOk => Ok(c.s),
            f => Err(unexpected("forward", &f)),
        }
    }

    /// Ask the agent to sync and power the guest off.
    pub async fn shutdown(&self) -> Result<(), ClientError> {
        let (mut c, _) = self.connect().await?;
        match c.request(Request::Shutdown, "shutdown").await {
            Ok(AgentFrame::Ok)
            | Err(ClientError::Frame {
                source: FrameError::Closed,
                ..
            }) => Ok(()),
            Ok(f) => Err(unexpected("shutdown", &f)),
            Err(e) => Err(e),
        }
    }
}

/// Connection attempts when the agent drops a connection in its handshake (see `connect`).
const HANDSHAKE_ATTEMPTS: u32 = 8;

/// The wait before the first such retry; doubled each time up to [`HANDSHAKE_RETRY_MAX`]
/// (25 + 50 + 100 × 5 = 575 ms in all: more tries, sooner, than the 750 ms of five did, for
/// a refusal is a moment's congestion more often than a lasting one).
const HANDSHAKE_RETRY_DELAY: Duration = Duration::from_millis(25);

/// The longest wait between two attempts.
const HANDSHAKE_RETRY_MAX: Duration = Duration::from_millis(100);

/// True for a handshake that failed because the connection went away (no agent reply).
fn dropped_in_handshake(e: &ClientError) -> bool {
    match e {
        ClientError::Frame {
            step: "handshake",
            source: FrameError::Closed | FrameError::Io(_),
        } => true,
        // The vsock backend closed before its `OK` (or before the `CONNECT` line went out: a
        // client starved past the backend's 2 s `CONNECT` deadline on a loaded host): a flood
        // of other host clients made it give this one's slot away, or the guest refused the
        // port or had no room in its accept backlog. No request reached the agent.
        ClientError::VsockHandshake { reply, .. } => reply.is_empty(),
        _ => false,
    }
}
