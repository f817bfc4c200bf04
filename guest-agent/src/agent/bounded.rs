//! [`BoundedWrites`]: caps every write the agent makes on a connection at [`MAX_WRITE`] bytes.
//!
//! # Why
//! Debian's 6.12 guest kernel carries upstream Linux commit 6693731487a8 ("vsock/virtio:
//! Allocate nonlinear SKBs for handling large transmit buffers"). Since then
//! `virtio_vsock_alloc_skb()` (include/linux/virtio_vsock.h) keeps a TX packet's skb linear
//! only while header room + payload fit in `SKB_WITH_OVERHEAD(PAGE_SIZE <<
//! PAGE_ALLOC_COSTLY_ORDER)`, i.e. a little under 32 KiB; a larger payload (one `write(2)` is
//! cut into packets of up to 64 KiB, `VIRTIO_VSOCK_MAX_PKT_BUF_SIZE`) becomes a nonlinear skb,
//! and the driver queues it as a header descriptor followed by *several* data descriptors, one
//! per page fragment. The virtio spec allows that, but vhost-device-vsock 0.3.0 (the vsock
//! backend of the QEMU TCG driver before our `vm-vsock`, which reads chains of any shape) parses TX chains with virtio-vsock 0.10's
//! `VsockPacket::from_tx_virtq_chain`, which wants the whole payload in ONE data descriptor:
//! such a packet fails with `DescriptorLengthTooSmall` and is dropped silently, so the host
//! sees a gap in the byte stream (a corrupt frame, or a read that never completes).
//!
//! The agent is the only process in the guest that sends on vsock (Forward's splice
//! included), so instead of patching every guest kernel we keep every guest TX packet small:
//! each `poll_write` reaches the inner stream with at most [`MAX_WRITE`] (16 KiB) bytes, so
//! each `write(2)`, and therefore each packet, stays linear with a wide margin. A caller
//! that writes a larger buffer (`write_all` of a 256 KiB frame) simply sees short writes and
//! loops. On a Unix socket (host tests) this only costs a few more syscalls.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest number of bytes handed to the inner stream by one write.
pub const MAX_WRITE: usize = 16 * 1024;

/// A stream whose writes are each cut to at most [`MAX_WRITE`] bytes; reads pass through.
#[derive(Debug)]
pub struct BoundedWrites<S> {
    inner: S,
}

impl<S> BoundedWrites<S> {
    pub fn new(inner: S) -> Self {
        BoundedWrites { inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for BoundedWrites<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for BoundedWrites<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = buf.len().min(MAX_WRITE);
        Pin::new(&mut self.inner).poll_write(cx, &buf[..n])
    }

    /// Writes only the first non-empty slice, cut to [`MAX_WRITE`]: a vectored write to the
    /// inner stream would be one syscall, hence one packet, of their total size.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        self.poll_write(cx, first)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;

    use super::*;
    use vm_agent_protocol::frame::{encode_frame, write_frame};
    use vm_agent_protocol::protocol::{AgentFrame, MAX_CHUNK, MAX_FRAME};

    /// Records the size of every write it receives; accepts up to `accept` bytes per call.
    #[derive(Default)]
    struct Recorder {
        data: Vec<u8>,
        sizes: Vec<usize>,
        accept: usize,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.accept);
            self.sizes.push(buf.len());
            self.data.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn recorder(accept: usize) -> BoundedWrites<Recorder> {
        BoundedWrites::new(Recorder {
            accept,
            ..Recorder::default()
        })
    }

    #[tokio::test]
    async fn a_full_size_frame_reaches_the_stream_in_bounded_writes() {
        let payload: Vec<u8> = (0..MAX_CHUNK).map(|i| (i * 7 % 251) as u8).collect();
        let frame = AgentFrame::Data(payload);
        let want = encode_frame(&frame, MAX_FRAME).unwrap();
        assert!(want.len() > 8 * MAX_WRITE);
        // An inner stream that would take everything at once, and one taking odd short writes.
        for accept in [usize::MAX, 5000] {
            let mut w = recorder(accept);
            write_frame(&mut w, &frame, MAX_FRAME, Duration::from_secs(5))
                .await
                .unwrap();
            let r = w.inner;
            assert_eq!(r.data, want, "bytes changed (accept {accept})");
            assert!(
                r.sizes.iter().all(|&n| n <= MAX_WRITE),
                "a write above {MAX_WRITE}: {:?}",
                r.sizes.iter().max()
            );
            assert!(r.sizes.len() >= want.len().div_ceil(MAX_WRITE));
        }
    }

    #[tokio::test]
    async fn vectored_and_copy_writes_are_bounded_too() {
        let a = vec![1u8; 40_000];
        let b = vec![2u8; 40_000];
        let mut w = recorder(usize::MAX);
        let n = w
            .write_vectored(&[IoSlice::new(&[]), IoSlice::new(&a), IoSlice::new(&b)])
            .await
            .unwrap();
        assert_eq!(n, MAX_WRITE);
        assert_eq!(w.inner.sizes, [MAX_WRITE]);

        // What Forward's splice does: tokio::io::copy from a reader handing out big reads.
        let src: Vec<u8> = (0..300_000u32).map(|i| (i % 256) as u8).collect();
        let mut w = recorder(usize::MAX);
        let mut r = &src[..];
        let n = tokio::io::copy_buf(
            &mut tokio::io::BufReader::with_capacity(1 << 20, &mut r),
            &mut w,
        )
        .await
        .unwrap();
        assert_eq!(n, src.len() as u64);
        assert_eq!(w.inner.data, src);
        assert!(w.inner.sizes.iter().all(|&n| n <= MAX_WRITE));
    }
}
