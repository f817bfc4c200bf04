//! File calls of [`AgentClient`]: streamed reads and writes, in-memory conveniences, List.
//!
//! [`AgentClient::read_file_to`] and [`AgentClient::write_file_from`] move a file of any size
//! up to the caller's cap in [`MAX_CHUNK`] chunks, so the host's memory stays flat: one chunk
//! buffer and one frame. The agent is hostile: a stream past the cap or past `DataEnd` is an
//! error, never a larger buffer.

use tokio::io::{AsyncRead, AsyncReadExt};

use super::{AgentClient, ClientError, unexpected};
use vm_agent_protocol::protocol::{
    AgentFrame, ClientFrame, FileEntry, MAX_CHUNK, MAX_FILE_BYTES, Request,
};
use vm_agent_protocol::sparse::ChunkSink;

impl AgentClient {
    /// Streams the file at `path` relative to `root` (confined to `root`) into `out`; returns
    /// the bytes written. A file over `max` bytes is refused before any data is sent; one
    /// that grows past `max` while streaming ends with an error (`out` then holds a prefix:
    /// the caller discards it).
    pub async fn read_file_to<S: ChunkSink>(
        &self,
        root: &str,
        path: &str,
        max: u64,
        out: &mut S,
    ) -> Result<u64, ClientError> {
        let max = max.min(MAX_FILE_BYTES);
        let (mut c, _) = self.connect().await?;
        let req = Request::ReadFile {
            root: root.into(),
            path: path.into(),
            max,
        };
        match c.request(req, "read_file").await? {
            AgentFrame::FileStart { size } if size <= max => {}
            AgentFrame::FileStart { .. } => {
                return Err(ClientError::TooLarge { what: "file", max });
            }
            f => return Err(unexpected("read_file", &f)),
        }
        let mut total = 0u64;
        loop {
            match c.recv(None, "read_file").await? {
                AgentFrame::Data(d) => {
                    total += d.len() as u64;
                    if total > max {
                        return Err(ClientError::TooLarge { what: "file", max });
                    }
                    out.put(&d).await.map_err(|source| ClientError::Io {
                        step: "read_file: writing the copy",
                        source,
                    })?;
                }
                AgentFrame::DataEnd => break,
                f => return Err(unexpected("read_file", &f)),
            }
        }
        Ok(total)
    }

    /// Streams `src` to its end into the file at `path` relative to `root` (parents are
    /// created); returns the bytes sent. More than `max` bytes is an error before the chunk
    /// that would pass it is sent. The destination is replaced only when every byte arrived:
    /// on any error the agent removes its temporary file.
    pub async fn write_file_from<R: AsyncRead + Unpin>(
        &self,
        root: &str,
        path: &str,
        max: u64,
        src: &mut R,
    ) -> Result<u64, ClientError> {
        let max = max.min(MAX_FILE_BYTES);
        let (mut c, _) = self.connect().await?;
        let req = Request::WriteFile {
            root: root.into(),
            path: path.into(),
            max,
        };
        match c.request(req, "write_file").await? {
            AgentFrame::Ok => {}
            f => return Err(unexpected("write_file", &f)),
        }
        let mut buf = vec![0u8; MAX_CHUNK];
        let mut total = 0u64;
        loop {
            let n = fill(src, &mut buf).await?;
            if n == 0 {
                break;
            }
            total += n as u64;
            if total > max {
                return Err(ClientError::TooLarge { what: "file", max });
            }
            c.send(&ClientFrame::Data(buf[..n].to_vec()), "write_file")
                .await?;
        }
        c.send(&ClientFrame::DataEnd, "write_file").await?;
        match c.recv(None, "write_file").await? {
            AgentFrame::Ok => Ok(total),
            f => Err(unexpected("write_file", &f)),
        }
    }

    /// Reads a whole file into memory, at most [`super::ClientLimits::max_file_bytes`].
    pub async fn read_file(&self, root: &str, path: &str) -> Result<Vec<u8>, ClientError> {
        let mut buf = Vec::new();
        self.read_file_to(root, path, self.limits.max_file_bytes, &mut buf)
            .await?;
        Ok(buf)
    }

    /// Creates or replaces the file at `path` relative to `root` with `data`.
    pub async fn write_file(&self, root: &str, path: &str, data: &[u8]) -> Result<(), ClientError> {
        let max = data.len() as u64;
        if max > self.limits.max_file_bytes {
            return Err(ClientError::TooLarge {
                what: "file",
                max: self.limits.max_file_bytes,
            });
        }
        self.write_file_from(root, path, max, &mut &data[..])
            .await
            .map(drop)
    }

    /// Regular files under `root/path`, recursively, with sizes (symlinks are not followed).
    pub async fn list(&self, root: &str, path: &str) -> Result<Vec<FileEntry>, ClientError> {
        let (mut c, _) = self.connect().await?;
        c.send(
            &ClientFrame::Request(Request::List {
                root: root.into(),
                path: path.into(),
            }),
            "list",
        )
        .await?;
        let mut out = Vec::new();
        loop {
            match c.recv(None, "list").await? {
                AgentFrame::ListBatch(b) => {
                    if out.len() + b.len() > self.limits.max_list_entries {
                        return Err(ClientError::TooLarge {
                            what: "list entry count",
                            max: self.limits.max_list_entries as u64,
                        });
                    }
                    out.extend(b);
                }
                AgentFrame::ListEnd => return Ok(out),
                f => return Err(unexpected("list", &f)),
            }
        }
    }
}

/// Reads until `buf` is full or `src` ends (whole chunks keep the agent's holes aligned).
async fn fill<R: AsyncRead + Unpin>(src: &mut R, buf: &mut [u8]) -> Result<usize, ClientError> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]).await {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(ClientError::Io {
                    step: "write_file: reading the source",
                    source,
                });
            }
        }
    }
    Ok(n)
}
