//! Streaming Exec on the client side.

use tokio::time::Instant;

use super::{ClientError, Conn, frame_err, unexpected};
use vm_agent_protocol::frame::FrameReader;
use vm_agent_protocol::protocol::{AgentFrame, ClientFrame, ExitStatus, MAX_FRAME};

/// One event of a streaming Exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// Always the last event.
    Exit(ExitStatus),
}

/// A running streaming Exec. Dropping it closes the connection, which kills the process tree.
///
/// [`next`](ExecStream::next) is cancel-safe: a partly received frame is kept in the stream,
/// so its future may be dropped at any point (e.g. by `tokio::select!` with a Ctrl-C branch)
/// and the following call carries on where it stopped, losing no output.
#[derive(Debug)]
pub struct ExecStream {
    conn: Conn,
    frames: FrameReader,
    deadline: Instant,
    done: bool,
}

impl ExecStream {
    pub(super) fn new(conn: Conn, deadline: Instant) -> Self {
        ExecStream {
            conn,
            frames: FrameReader::new(MAX_FRAME),
            deadline,
            done: false,
        }
    }

    /// The next event; `None` after `Exit` has been returned or after an error.
    ///
    /// Cancel-safe (see the type's docs). The wait for each event is bounded by the Exec's
    /// deadline (its timeout plus grace); a frame, once begun, must complete within the step
    /// timeout, counted across cancelled calls.
    pub async fn next(&mut self) -> Result<Option<ExecEvent>, ClientError> {
        if self.done {
            return Ok(None);
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        let got = self
            .frames
            .read(&mut self.conn.s, Some(left), self.conn.step)
            .await;
        let ev = match got {
            Ok(AgentFrame::Stdout(d)) => ExecEvent::Stdout(d),
            Ok(AgentFrame::Stderr(d)) => ExecEvent::Stderr(d),
            Ok(AgentFrame::Exit(s)) => {
                self.done = true;
                ExecEvent::Exit(s)
            }
            Ok(f) => {
                self.done = true;
                return Err(match f {
                    AgentFrame::Error(e) => ClientError::Agent {
                        kind: e.kind,
                        message: e.message,
                    },
                    f => unexpected("exec_stream", &f),
                });
            }
            Err(e) => {
                self.done = true;
                return Err(frame_err("exec_stream", e));
            }
        };
        Ok(Some(ev))
    }

    /// Kill the whole process tree and return its final status (remaining output is discarded).
    pub async fn cancel(mut self) -> Result<ExitStatus, ClientError> {
        if self.done {
            return Err(ClientError::InvalidRequest("exec stream already finished"));
        }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;
    use tokio::net::UnixStream;

    use super::*;
    use vm_agent_protocol::frame::encode_frame;

    /// The agent's frames arrive in small pieces; `next()` is abandoned whenever a short timer
    /// wins, i.e. many times in the middle of a frame. Every byte and the exit still arrive.
    #[tokio::test]
    async fn next_survives_being_dropped_mid_frame() {
        let (ours, mut agent) = UnixStream::pair().unwrap();
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let exit = ExitStatus {
            code: Some(5),
            signal: None,
            timed_out: false,
        };
        let frames = [
            AgentFrame::Stdout(big.clone()),
            AgentFrame::Stderr(b"warn\n".to_vec()),
            AgentFrame::Stdout(big.clone()),
            AgentFrame::Exit(exit),
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(encode_frame(f, MAX_FRAME).unwrap());
        }
        tokio::spawn(async move {
            for piece in wire.chunks(3001) {
                agent.write_all(piece).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // Keep the socket open: EOF must not be what ends the stream.
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let conn = Conn {
            s: ours,
            step: Duration::from_secs(10),
        };
        let mut s = ExecStream::new(conn, Instant::now() + Duration::from_secs(30));
        let (mut got, mut cancelled) = (Vec::new(), 0u32);
        let run = async {
            loop {
                tokio::select! {
                    ev = s.next() => match ev.unwrap() {
                        Some(ev) => got.push(ev),
                        None => break,
                    },
                    _ = tokio::time::sleep(Duration::from_micros(200)) => cancelled += 1,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .expect("stream did not finish");
        assert!(
            cancelled > 10,
            "next() was interrupted only {cancelled} times"
        );
        assert_eq!(
            got,
            [
                ExecEvent::Stdout(big.clone()),
                ExecEvent::Stderr(b"warn\n".to_vec()),
                ExecEvent::Stdout(big),
                ExecEvent::Exit(exit),
            ]
        );
    }
}
