//! A guest command run for a tool call: its stdout and stderr kept apart, each bounded
//! (the first `--max-output` bytes kept, the rest counted), and a cancelled call turned into
//! a cancel of the guest command's whole process tree, as Ctrl-C is for `vm exec`.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use vm_sandbox::agent::{ExecEvent, ExitStatus};
use vm_sandbox::{Guest, Run};

use super::fault::Fault;
use crate::stream;

/// How long the cancel exchange may take before the stream is dropped (which also kills the
/// guest process tree, from the agent's side): `vm exec`'s grace.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// One output stream: its first `cap` bytes and how many there were.
#[derive(Debug, Default)]
pub struct Bounded {
    kept: Vec<u8>,
    total: u64,
    cap: usize,
}

impl Bounded {
    pub fn new(cap: usize) -> Bounded {
        Bounded {
            kept: Vec::new(),
            total: 0,
            cap,
        }
    }

    /// Keeps what fits of `data`, counts all of it.
    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// The kept bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.kept
    }

    /// How many bytes there were.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The kept bytes up to `end` as text.
    pub fn text_up_to(&self, end: usize) -> String {
        String::from_utf8_lossy(&self.kept[..end.min(self.kept.len())]).into_owned()
    }

    pub fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }

    /// The kept bytes as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }

    /// The note a truncated stream's text ends with.
    pub fn note(&self, what: &str) -> Option<String> {
        self.truncated().then(|| {
            format!(
                "[{what} truncated: {} bytes, the first {} shown (vm mcp --max-output); write large output to a file and read what you need]",
                self.total,
                self.kept.len()
            )
        })
    }
}

/// A finished guest command.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Bounded,
    pub stderr: Bounded,
}

impl Finished {
    /// `vm exec`'s exit code for it: the command's, 128+N for signal N, 124 for its timeout.
    pub fn exit_code(&self) -> u8 {
        stream::status_code(&self.status)
    }

    /// The text an agent reads.
    pub fn text(&self) -> String {
        let mut out = format!("exit code {}", self.exit_code());
        if self.status.timed_out {
            out.push_str(" (its timeout killed it)");
        } else if let Some(sig) = self.status.signal {
            out.push_str(&format!(" (killed by signal {sig})"));
        }
        for (name, s) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            match s.total {
                0 => out.push_str(&format!("\n{name}: (empty)")),
                _ => out.push_str(&format!("\n{name}:\n{}", s.text())),
            }
            if let Some(note) = s.note(name) {
                out.push_str(&format!("\n{note}"));
            }
        }
        out
    }

    /// The structured result.
    pub fn json(&self) -> Value {
        json!({
            "exit_code": self.exit_code(),
            "signal": self.status.signal,
            "timed_out": self.status.timed_out,
            "stdout": self.stdout.text(),
            "stderr": self.stderr.text(),
            "stdout_bytes": self.stdout.total,
            "stderr_bytes": self.stderr.total,
            "stdout_truncated": self.stdout.truncated(),
            "stderr_truncated": self.stderr.truncated(),
        })
    }
}

/// Runs `run` in `guest` to its end, each output stream bounded to `cap` bytes. When `ct`
/// is cancelled the guest command tree is cancelled and the call ends with
/// [`Fault::Cancelled`].
pub async fn capture(
    guest: &Guest,
    run: Run,
    cap: usize,
    ct: &CancellationToken,
) -> Result<Finished, Fault> {
    let mut stream = tokio::select! {
        s = guest.exec_stream(run) => s.map_err(|e| Fault::from_error(&e, 0))?,
        () = ct.cancelled() => return Err(cancelled()),
    };
    let mut stdout = Bounded::new(cap);
    let mut stderr = Bounded::new(cap);
    loop {
        tokio::select! {
            ev = stream.next() => match ev {
                Ok(Some(ExecEvent::Stdout(d))) => stdout.push(&d),
                Ok(Some(ExecEvent::Stderr(d))) => stderr.push(&d),
                Ok(Some(ExecEvent::Exit(status))) => {
                    return Ok(Finished { status, stdout, stderr });
                }
                Ok(None) => {
                    return Err(Fault::failed(
                        "the guest closed the command's stream without an exit status",
                    ));
                }
                Err(e) => return Err(Fault::failed(vm_error_chain::error_chain(&e))),
            },
            () = ct.cancelled() => {
                // As `vm exec` on Ctrl-C: ask the agent to kill the tree; if that exchange
                // fails the dropped stream closes the connection, and the agent kills it then.
                match tokio::time::timeout(CANCEL_GRACE, stream.cancel()).await {
                    Ok(Ok(status)) => tracing::debug!(?status, "guest command cancelled"),
                    Ok(Err(e)) => tracing::debug!("cancel exchange failed ({e}); stream dropped"),
                    Err(_) => tracing::debug!("cancel timed out; stream dropped"),
                }
                return Err(cancelled());
            }
        }
    }
}

fn cancelled() -> Fault {
    Fault::Cancelled("the call was cancelled; the guest command tree was killed".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_keeps_its_head_and_counts_the_rest() {
        let mut b = Bounded::new(4);
        b.push(b"ab");
        assert!(!b.truncated());
        b.push(b"cdef");
        b.push(b"gh");
        assert_eq!(b.text(), "abcd");
        assert_eq!(b.total, 8);
        assert!(b.truncated());
        let note = b.note("stdout").unwrap();
        assert!(note.contains("8 bytes, the first 4 shown"), "{note}");
    }
}
