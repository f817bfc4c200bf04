//! Length-prefixed frame codec used by both sides.
//!
//! A frame is `u32` LE length + postcard body. [`read_frame`] refuses a length above the given
//! maximum before allocating, and bounds the wait for the first byte and for the rest of the
//! frame separately (a peer that trickles bytes cannot hold a reader forever).

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

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
/// `rest` bounds the time from the first byte to the end of the body. Reads exactly the
/// frame's bytes, nothing past it.
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
    FrameReader::new(max).read(r, first, rest).await
}

/// Most bytes requested from the stream by one read (and reserved ahead of it).
const READ_STEP: usize = 256 * 1024;

/// A cancel-safe frame reader: the bytes of a partly read frame live in the reader, not in
/// the future of [`FrameReader::read`], so dropping that future at any await point (a
/// `select!` branch that lost, a timeout) loses nothing and the next call resumes the frame.
///
/// Bounded: it reads only the bytes of the current frame (never past it), refuses a length
/// prefix above `max` before reserving anything, and grows its buffer at most 256 KiB at a
/// time as bytes actually arrive. The `rest` deadline is measured from the frame's first
/// byte across calls, so a peer that trickles a frame cannot stretch it by having the caller
/// retry. After an error the stream position is unknown: drop the reader and the stream.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    max: u32,
    started: Option<Instant>,
}

impl FrameReader {
    pub fn new(max: u32) -> Self {
        FrameReader {
            buf: Vec::new(),
            max,
            started: None,
        }
    }

    /// Bytes of the current frame still missing (0 = complete).
    fn missing(&self) -> Result<usize, FrameError> {
        match body_len(&self.buf, self.max)? {
            None => Ok(4 - self.buf.len()),
            Some(n) => Ok(4 + n - self.buf.len()),
        }
    }

    /// Read (the rest of) one frame; see [`read_frame`] for `first` and `rest`.
    pub async fn read<R, T>(
        &mut self,
        r: &mut R,
        first: Option<Duration>,
        rest: Duration,
    ) -> Result<T, FrameError>
    where
        R: AsyncRead + Unpin,
        T: DeserializeOwned,
    {
        loop {
            let want = self.missing()?;
            if want == 0 {
                let msg = postcard::from_bytes(&self.buf[4..]).map_err(FrameError::Decode);
                self.buf.clear();
                self.started = None;
                return msg;
            }
            let want = want.min(READ_STEP);
            self.buf.reserve(want);
            let limit = match self.started {
                Some(t0) => Some(t0 + rest),
                None => first.map(|d| Instant::now() + d),
            };
            // Cancel-safe: read_buf appends to `buf` only when bytes were read.
            let mut limited = (&mut *r).take(want as u64);
            let read = limited.read_buf(&mut self.buf);
            let n = match limit {
                Some(at) => tokio::time::timeout_at(at, read)
                    .await
                    .map_err(|_| FrameError::Timeout)?,
                None => read.await,
            }
            .map_err(FrameError::Io)?;
            if n == 0 {
                return Err(FrameError::Closed);
            }
            self.started.get_or_insert_with(Instant::now);
        }
    }
}

/// The body length announced by the length prefix at the start of `bytes`, refused above
/// `max`; `None` while fewer than 4 bytes are there.
fn body_len(bytes: &[u8], max: u32) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = bytes.get(..4) else {
        return Ok(None);
    };
    let mut b = [0u8; 4];
    b.copy_from_slice(prefix);
    let n = u32::from_le_bytes(b);
    if n > max {
        return Err(FrameError::TooLarge {
            len: u64::from(n),
            max,
        });
    }
    Ok(Some(n as usize))
}

/// Decode the frame at the start of `bytes` without I/O (what [`FrameReader`] does once a
/// frame is complete): the message and the bytes it used. `Closed` when `bytes` ends before
/// the frame does. Allocates nothing beyond what the decoded message holds. The fuzz targets
/// and property tests drive both sides' decoders through it.
pub fn decode_frame<T: DeserializeOwned>(bytes: &[u8], max: u32) -> Result<(T, usize), FrameError> {
    let n = body_len(bytes, max)?.ok_or(FrameError::Closed)?;
    let body = bytes.get(4..4 + n).ok_or(FrameError::Closed)?;
    let msg = postcard::from_bytes(body).map_err(FrameError::Decode)?;
    Ok((msg, 4 + n))
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;
    use tokio::net::UnixStream;

    use super::*;

    /// A peer that trickles a frame cannot outlast `rest` by making the caller retry: the
    /// deadline runs from the frame's first byte across dropped `read` futures.
    #[tokio::test]
    async fn rest_deadline_spans_cancelled_reads() {
        let (mut ours, mut peer) = UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let frame = encode_frame(&vec![7u8; 100], 1024).unwrap();
            for b in frame {
                if peer.write_all(&[b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let mut fr = FrameReader::new(1024);
        let t0 = Instant::now();
        let res = loop {
            tokio::select! {
                r = fr.read::<_, Vec<u8>>(&mut ours, None, Duration::from_millis(300)) => break r,
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        };
        assert!(matches!(res, Err(FrameError::Timeout)), "{res:?}");
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(1), "took {took:?}");
    }

    #[tokio::test]
    async fn oversized_prefix_is_refused_before_reading_the_body() {
        let (mut ours, mut peer) = UnixStream::pair().unwrap();
        peer.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
        let r = FrameReader::new(1024)
            .read::<_, Vec<u8>>(&mut ours, None, Duration::from_secs(1))
            .await;
        assert!(
            matches!(r, Err(FrameError::TooLarge { max: 1024, .. })),
            "{r:?}"
        );
    }
}
