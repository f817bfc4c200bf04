//! ReadFile and WriteFile: files streamed in [`MAX_CHUNK`] chunks whatever their size.
//!
//! A read refuses a file over the caller's cap before any data and ends with `TooLarge` if
//! the file grows past the cap while it is read (it is read to EOF, never more than one chunk
//! ahead of the connection). Its data frames are back-pressured, not timed out: a host that
//! reads slowly (`vm cp box:/f - | less`) only makes the agent wait; a host that hangs up (its
//! side reaches EOF or sends anything: it is silent during a read) ends the read. A write goes to a temporary file beside the destination
//! ([`files::Part`]) with holes for all-zero blocks ([`SparseWriter`]), renamed over the
//! destination after `DataEnd`; anything else (an error, a cap overrun, a connection that
//! ends) removes the temporary file.

use std::os::fd::AsFd;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::conn::{file_error, recv, send, send_error};
use super::files::{self, FileError};
use super::{Agent, Stream};
use vm_agent_protocol::frame::{FrameError, encode_frame};
use vm_agent_protocol::protocol::{
    AgentFrame, ClientFrame, ErrorKind, MAX_CHUNK, MAX_FILE_BYTES, MAX_FRAME,
};
use vm_agent_protocol::sparse::SparseWriter;

/// `ReadFile{root, path, max}`: `FileStart{size}`, `Data`* to EOF, `DataEnd`.
pub(super) async fn read_file<S: Stream>(
    agent: &Agent,
    s: &mut S,
    root: &str,
    path: &str,
    max: u64,
) -> Result<(), FrameError> {
    let t = agent.io_timeout();
    let max = max.min(MAX_FILE_BYTES);
    let opened = files::open_root(agent.base_fd(), root)
        .and_then(|r| files::open_read(r.as_fd(), path, max));
    let (f, size) = match opened {
        Ok(x) => x,
        Err(e) => return file_error(s, e, t).await,
    };
    send(s, &AgentFrame::FileStart { size }, t).await?;
    let (mut host_rd, mut host_wr) = tokio::io::split(&mut *s);
    let mut f = tokio::fs::File::from_std(f);
    let mut total = 0u64;
    let mut buf = vec![0u8; MAX_CHUNK];
    loop {
        // At most one byte past the cap, so a file that grew past it is caught.
        let want = (max - total).saturating_add(1).min(MAX_CHUNK as u64) as usize;
        let n = match f.read(&mut buf[..want]).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                let msg = format!("read failed: {e}");
                return send_error(&mut host_wr, ErrorKind::Io, &msg, t).await;
            }
        };
        total += n as u64;
        if total > max {
            let e = FileError::Grew {
                path: path.into(),
                max,
            };
            return file_error(&mut host_wr, e, t).await;
        }
        send_paced(
            &mut host_rd,
            &mut host_wr,
            &AgentFrame::Data(buf[..n].to_vec()),
        )
        .await?;
    }
    send_paced(&mut host_rd, &mut host_wr, &AgentFrame::DataEnd).await
}

/// Writes `f` with no timeout, racing the host's side of the connection: the host says
/// nothing during a read, so EOF, an error or any byte from it means it is gone.
async fn send_paced<R, W>(
    host_rd: &mut R,
    host_wr: &mut W,
    f: &AgentFrame,
) -> Result<(), FrameError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let buf = encode_frame(f, MAX_FRAME)?;
    let mut probe = [0u8; 1];
    tokio::select! {
        r = async {
            host_wr.write_all(&buf).await?;
            host_wr.flush().await
        } => r.map_err(FrameError::Io),
        _ = host_rd.read(&mut probe) => Err(FrameError::Closed),
    }
}

/// Why a write failed: the connection itself, or an error to report to the client.
enum Failed {
    Frame(FrameError),
    Reply(ErrorKind, String),
}

impl From<FileError> for Failed {
    fn from(e: FileError) -> Self {
        Failed::Reply(e.kind(), vm_error_chain::error_chain(&e))
    }
}

fn io_failed(e: std::io::Error) -> Failed {
    Failed::Reply(ErrorKind::Io, format!("write failed: {e}"))
}

/// `WriteFile{root, path, max}`: `Ok`, then `Data`* `DataEnd` from the client, then `Ok`
/// once the file is in place.
pub(super) async fn write_file<S: Stream>(
    agent: &Agent,
    s: &mut S,
    root: &str,
    path: &str,
    max: u64,
) -> Result<(), FrameError> {
    let t = agent.io_timeout();
    let max = max.min(MAX_FILE_BYTES);
    let opened =
        files::open_root(agent.base_fd(), root).and_then(|r| files::create_part(r.as_fd(), path));
    let (part, f) = match opened {
        Ok(x) => x,
        Err(e) => return file_error(s, e, t).await,
    };
    send(s, &AgentFrame::Ok, t).await?;
    let w = SparseWriter::new(tokio::fs::File::from_std(f));
    let outcome = match receive(s, t, w, path, max).await {
        Ok(()) => part.commit().map_err(Failed::from),
        Err(e) => {
            drop(part); // the temporary file is gone before the client hears of the failure
            Err(e)
        }
    };
    match outcome {
        Ok(()) => send(s, &AgentFrame::Ok, t).await,
        Err(Failed::Frame(e)) => Err(e),
        Err(Failed::Reply(kind, msg)) => send_error(s, kind, &msg, t).await,
    }
}

/// The client's `Data`* `DataEnd`, written through `w` (at most `max` bytes) and flushed.
async fn receive<S: Stream>(
    s: &mut S,
    t: std::time::Duration,
    mut w: SparseWriter,
    path: &str,
    max: u64,
) -> Result<(), Failed> {
    loop {
        match recv(s, t).await.map_err(Failed::Frame)? {
            ClientFrame::Data(d) => {
                if w.len() + d.len() as u64 > max {
                    let path = path.into();
                    return Err(FileError::Grew { path, max }.into());
                }
                w.write(&d).await.map_err(io_failed)?;
            }
            ClientFrame::DataEnd => break,
            _ => {
                let msg = "expected Data or DataEnd".to_string();
                return Err(Failed::Reply(ErrorKind::BadRequest, msg));
            }
        }
    }
    w.finish().await.map(drop).map_err(io_failed)
}
