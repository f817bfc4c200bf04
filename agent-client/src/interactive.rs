//! Interactive exec on the client side: [`AgentClient::exec_interactive`] returns the two
//! halves of one session, [`InteractiveInput`] (stdin, EOF, terminal size, cancel) and
//! [`InteractiveOutput`] (output events and the exit status), to be driven concurrently
//! (typically the input from its own task).
//!
//! Stdin is flow-controlled: the input half sends at most [`STDIN_WINDOW`] bytes the agent
//! has not acknowledged, and the output half turns the agent's `StdinAck` frames into new
//! credit. So writing stdin waits, without buffering, while the guest command does not read.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{AgentClient, ClientError, ExecEvent, frame_err, unexpected};
use vm_agent_protocol::container::{Confine, ContainerExec};
use vm_agent_protocol::frame::{FrameError, FrameReader, write_frame};
use vm_agent_protocol::protocol::{
    AgentFrame, ClientFrame, ErrorKind, InteractiveRequest, MAX_FRAME, MAX_SIGNAL, MAX_STDIN_CHUNK,
    Request, STDIN_WINDOW, TtySize,
};

/// One interactive exec: drive both halves; dropping both closes the connection, which kills
/// the guest command's whole tree.
#[derive(Debug)]
pub struct Interactive {
    pub input: InteractiveInput,
    pub output: InteractiveOutput,
}

/// The host-to-guest half of an interactive exec. Dropping it alone does not end the
/// session (the connection stays whole until the output half is dropped too).
#[derive(Debug)]
pub struct InteractiveInput {
    /// `None` only while being dropped.
    wr: Option<OwnedWriteHalf>,
    credit: Arc<Semaphore>,
    step: Duration,
    stdin_closed: bool,
}

/// The guest-to-host half of an interactive exec.
#[derive(Debug)]
pub struct InteractiveOutput {
    rd: OwnedReadHalf,
    frames: FrameReader,
    credit: Arc<Semaphore>,
    deadline: Instant,
    step: Duration,
    done: bool,
}

impl AgentClient {
    /// Start `req.exec` with stdin streamed from the host, on a pseudo-terminal when
    /// `req.tty` is given. An agent that predates interactive exec gives
    /// [`ClientError::Unsupported`].
    pub async fn exec_interactive(
        &self,
        req: InteractiveRequest,
    ) -> Result<Interactive, ClientError> {
        self.start_interactive(req, Request::ExecInteractive).await
    }

    /// As [`AgentClient::exec_interactive`], run with the guest directory `root` as `/` (a
    /// pod member's root: its `cwd` and program are resolved there). An agent that predates
    /// it gives [`ClientError::Unsupported`].
    pub async fn exec_interactive_in(
        &self,
        root: &str,
        req: InteractiveRequest,
    ) -> Result<Interactive, ClientError> {
        let root = root.to_string();
        self.start_interactive(req, |request| Request::ExecInteractiveIn { root, request })
            .await
    }

    /// As [`AgentClient::exec_interactive_in`] (the VM's own root with `root` `None`), the
    /// process confined as a container's ([`vm_agent_protocol::container`]). An agent that predates it, or
    /// one that is not PID 1, gives [`ClientError::Unsupported`].
    pub async fn exec_container(
        &self,
        root: Option<&str>,
        req: InteractiveRequest,
        confine: Confine,
    ) -> Result<Interactive, ClientError> {
        let root = root.map(str::to_string);
        self.start_interactive(req, |request| {
            Request::ExecContainer(Box::new(ContainerExec {
                root,
                request,
                confine,
            }))
        })
        .await
    }

    async fn start_interactive(
        &self,
        mut req: InteractiveRequest,
        request: impl FnOnce(InteractiveRequest) -> Request,
    ) -> Result<Interactive, ClientError> {
        if !req.exec.stdin.is_empty() {
            return Err(ClientError::InvalidRequest(
                "interactive exec: write stdin through the input half, not inline",
            ));
        }
        let (exec, deadline, _) = self.prepare_exec(req.exec)?;
        req.exec = exec;
        let (mut c, _) = self.connect().await?;
        let step = "exec_interactive";
        c.send(&ClientFrame::Request(request(req)), step).await?;
        match c.recv(None, step).await {
            Ok(AgentFrame::Started) => {}
            Ok(f) => return Err(unexpected(step, &f)),
            // An older agent cannot decode the request: it hangs up (or says so).
            Err(ClientError::Frame {
                source: FrameError::Closed,
                ..
            })
            | Err(ClientError::Agent {
                kind: ErrorKind::Unsupported,
                ..
            }) => {
                return Err(ClientError::Unsupported {
                    what: "interactive exec",
                });
            }
            Err(e) => return Err(e),
        }
        let (rd, wr) = c.s.into_split();
        let credit = Arc::new(Semaphore::new(STDIN_WINDOW as usize));
        Ok(Interactive {
            input: InteractiveInput {
                wr: Some(wr),
                credit: credit.clone(),
                step: c.step,
                stdin_closed: false,
            },
            output: InteractiveOutput {
                rd,
                frames: FrameReader::new(MAX_FRAME),
                credit,
                deadline,
                step: c.step,
                done: false,
            },
        })
    }
}

impl InteractiveInput {
    async fn send(&mut self, f: &ClientFrame, step: &'static str) -> Result<(), ClientError> {
        let Some(wr) = self.wr.as_mut() else {
            return Err(ClientError::Ended);
        };
        write_frame(wr, f, MAX_FRAME, self.step)
            .await
            .map_err(|e| frame_err(step, e))
    }

    /// Send `data` to the command's stdin. Waits while the agent's window is full (the
    /// command is not reading); fails with [`ClientError::Ended`] once the command has ended
    /// (its [`InteractiveOutput`] returned the exit or an error, or was dropped).
    pub async fn write(&mut self, data: &[u8]) -> Result<(), ClientError> {
        if self.stdin_closed {
            return Err(ClientError::InvalidRequest("stdin already closed"));
        }
        for chunk in data.chunks(MAX_STDIN_CHUNK) {
            let permit = self
                .credit
                .acquire_many(chunk.len() as u32)
                .await
                .map_err(|_| ClientError::Ended)?;
            permit.forget();
            self.send(&ClientFrame::Data(chunk.to_vec()), "stdin")
                .await?;
        }
        Ok(())
    }

    /// Wait until `len` bytes (at most [`MAX_STDIN_CHUNK`]) can be written without waiting
    /// for the agent. Cancel-safe: use it in a `select!` beside other work, then
    /// [`InteractiveInput::write`] the chunk.
    pub async fn writable(&self, len: usize) -> Result<(), ClientError> {
        let len = len.min(MAX_STDIN_CHUNK) as u32;
        let permit = self
            .credit
            .acquire_many(len)
            .await
            .map_err(|_| ClientError::Ended)?;
        drop(permit); // returned: the write takes it
        Ok(())
    }

    /// End the command's stdin (it reads EOF once what was sent is written; with a
    /// terminal, the terminal's EOF character is written). Output continues.
    pub async fn close_stdin(&mut self) -> Result<(), ClientError> {
        if std::mem::replace(&mut self.stdin_closed, true) {
            return Ok(());
        }
        self.send(&ClientFrame::DataEnd, "stdin close").await
    }

    /// Set the terminal's window size (no effect without a terminal).
    pub async fn resize(&mut self, size: TtySize) -> Result<(), ClientError> {
        self.send(&ClientFrame::Resize(size), "resize").await
    }

    /// Deliver `signal` to the command (`all`: its whole process group); its exit, if it
    /// ends, comes through the output half as usual. An agent older than this request ends
    /// the session (the output half reports the error).
    pub async fn signal(&mut self, signal: i32, all: bool) -> Result<(), ClientError> {
        if !(1..=MAX_SIGNAL).contains(&signal) {
            return Err(ClientError::InvalidRequest("signal number out of range"));
        }
        self.send(&ClientFrame::Signal { signal, all }, "signal")
            .await
    }

    /// Ask the agent to kill the command's whole tree; the output half then ends with the
    /// exit status.
    pub async fn cancel(&mut self) -> Result<(), ClientError> {
        self.send(&ClientFrame::Cancel, "cancel").await
    }
}

impl Drop for InteractiveInput {
    /// No `shutdown(SHUT_WR)`: the agent (and a vsock backend that turns a half-close into
    /// a full one) would take it for a cancel. The socket closes with the output half.
    fn drop(&mut self) {
        if let Some(wr) = self.wr.take() {
            wr.forget();
        }
    }
}

impl InteractiveOutput {
    /// The next output event; `None` after `Exit` has been returned or after an error.
    ///
    /// Cancel-safe (a partly received frame is kept). The wait is bounded by the exec's
    /// deadline (its timeout plus grace); a frame, once begun, must complete within the
    /// step timeout.
    pub async fn next(&mut self) -> Result<Option<ExecEvent>, ClientError> {
        let r = self.next_inner().await;
        if !matches!(r, Ok(Some(ExecEvent::Stdout(_) | ExecEvent::Stderr(_)))) {
            self.done = true;
            self.credit.close(); // the input half stops waiting for credit
        }
        r
    }

    async fn next_inner(&mut self) -> Result<Option<ExecEvent>, ClientError> {
        if self.done {
            return Ok(None);
        }
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            let f = self
                .frames
                .read(&mut self.rd, Some(left), self.step)
                .await
                .map_err(|e| frame_err("exec_interactive", e))?;
            return Ok(Some(match f {
                AgentFrame::Stdout(d) => ExecEvent::Stdout(d),
                AgentFrame::Stderr(d) => ExecEvent::Stderr(d),
                AgentFrame::Exit(s) => ExecEvent::Exit(s),
                AgentFrame::StdinAck(n) => {
                    // Never more credit than the window: a confused agent cannot make us
                    // send past it (nor overflow the semaphore).
                    let n = n as usize;
                    if self.credit.available_permits() + n > STDIN_WINDOW as usize {
                        return Err(unexpected("exec_interactive (excess StdinAck)", &f));
                    }
                    self.credit.add_permits(n);
                    continue;
                }
                AgentFrame::Error(e) => {
                    return Err(ClientError::Agent {
                        kind: e.kind,
                        message: e.message,
                    });
                }
                f => return Err(unexpected("exec_interactive", &f)),
            }));
        }
    }
}
