//! Length-prefixed frame codec used by both sides.
//!
//! A frame is `u32` LE length + postcard body. [`read_frame`] refuses a length above the given
//! maximum before allocating, and bounds the wait for the first byte and for the rest of the
//! frame separately (a peer that trickles bytes cannot hold a reader forever).

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Frame codec errors.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: u64, max: u32 },
    #[error("timed out waiting for a frame")]
    Timeout,
    #[error("malformed frame")]
    Decode(#[source] postcard::Error),
    #[error("cannot encode frame")]
    Encode(#[source] postcard::Error),
    #[error("i/o error")]
    Io(#[source] std::io::Error),
}

/// Read one frame. `first` bounds the wait for the length prefix (`None` = unbounded),
/// `rest` bounds the time from the first byte to the end of the body.
pub async fn read_frame<R, T>(
    r: &mut R,
    max: u32,
    first: Option<Duration>,
    rest: Duration,
) -> Result<T, FrameError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut len = [0u8; 4];
    let first_byte = async {
        match r.read(&mut len[..1]).await {
            Ok(0) => Err(FrameError::Closed),
            Ok(_) => Ok(()),
            Err(e) => Err(FrameError::Io(e)),
        }
    };
    match first {
        Some(t) => tokio::time::timeout(t, first_byte)
            .await
            .map_err(|_| FrameError::Timeout)??,
        None => first_byte.await?,
    }
    let body = async {
        r.read_exact(&mut len[1..]).await.map_err(map_eof)?;
        let n = u32::from_le_bytes(len);
        if n > max {
            return Err(FrameError::TooLarge {
                len: u64::from(n),
                max,
            });
        }
        let mut buf = vec![0u8; n as usize];
        r.read_exact(&mut buf).await.map_err(map_eof)?;
        postcard::from_bytes(&buf).map_err(FrameError::Decode)
    };
    tokio::time::timeout(rest, body)
        .await
        .map_err(|_| FrameError::Timeout)?
}

fn map_eof(e: std::io::Error) -> FrameError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        FrameError::Closed
    } else {
        FrameError::Io(e)
    }
}

/// Encode `msg` into one frame (length prefix included), refusing bodies above `max`.
pub fn encode_frame<T: Serialize>(msg: &T, max: u32) -> Result<Vec<u8>, FrameError> {
    let mut buf = postcard::to_extend(msg, vec![0u8; 4]).map_err(FrameError::Encode)?;
    let n = buf.len() - 4;
    if n as u64 > u64::from(max) {
        return Err(FrameError::TooLarge { len: n as u64, max });
    }
    buf[..4].copy_from_slice(&(n as u32).to_le_bytes());
    Ok(buf)
}

/// Write one frame within `timeout`.
pub async fn write_frame<W, T>(
    w: &mut W,
    msg: &T,
    max: u32,
    timeout: Duration,
) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let buf = encode_frame(msg, max)?;
    tokio::time::timeout(timeout, async {
        w.write_all(&buf).await?;
        w.flush().await
    })
    .await
    .map_err(|_| FrameError::Timeout)?
    .map_err(FrameError::Io)
}
