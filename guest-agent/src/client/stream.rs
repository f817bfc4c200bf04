//! Streaming Exec on the client side.

use tokio::time::Instant;

use super::{ClientError, Conn, unexpected};
use crate::protocol::{AgentFrame, ClientFrame, ExitStatus};

/// One event of a streaming Exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// Always the last event.
    Exit(ExitStatus),
}

/// A running streaming Exec. Dropping it closes the connection, which kills the process tree.
#[derive(Debug)]
pub struct ExecStream {
    conn: Conn,
    deadline: Instant,
    done: bool,
}

impl ExecStream {
    pub(super) fn new(conn: Conn, deadline: Instant) -> Self {
        ExecStream {
            conn,
            deadline,
            done: false,
        }
    }

    /// The next event; `None` after `Exit` has been returned.
    pub async fn next(&mut self) -> Result<Option<ExecEvent>, ClientError> {
        if self.done {
            return Ok(None);
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        let ev = match self.conn.recv(Some(left), "exec_stream").await? {
            AgentFrame::Stdout(d) => ExecEvent::Stdout(d),
            AgentFrame::Stderr(d) => ExecEvent::Stderr(d),
            AgentFrame::Exit(s) => {
                self.done = true;
                ExecEvent::Exit(s)
            }
            f => return Err(unexpected("exec_stream", &f)),
        };
        Ok(Some(ev))
    }

    /// Kill the whole process tree and return its final status (remaining output is discarded).
    pub async fn cancel(mut self) -> Result<ExitStatus, ClientError> {
        self.conn.send(&ClientFrame::Cancel, "cancel").await?;
        let deadline = Instant::now() + self.conn.step;
        self.deadline = self.deadline.min(deadline);
        loop {
            match self.next().await? {
                Some(ExecEvent::Exit(s)) => return Ok(s),
                Some(_) => {}
                None => return Err(ClientError::InvalidRequest("exec stream already finished")),
            }
        }
    }
}
