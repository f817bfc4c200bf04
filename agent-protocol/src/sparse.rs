//! Sparse-aware writing of streamed file data.
//!
//! A streamed file arrives as chunks; [`SparseWriter`] writes them to a fresh (empty) file and
//! seeks over every all-zero [`BLOCK`] instead of writing it, then sets the file's length at
//! the end, so the zeros of a sparse source stay holes at the destination (a 2 GiB sparse
//! file costs the guest's tmpfs only its data blocks). The bytes read back are the same
//! either way. Used by the agent (`WriteFile`) and by the host side of a copy out.

use std::io::SeekFrom;

use tokio::io::{AsyncSeekExt, AsyncWrite, AsyncWriteExt};

/// Granularity of hole detection (the page and filesystem block size).
pub const BLOCK: usize = 4096;

/// Splits `data` into maximal runs of whole-zero and not-zero [`BLOCK`]s (the last block may
/// be short); `true` marks a zero run. Concatenated, the runs are `data`.
pub fn runs(data: &[u8]) -> Vec<(bool, &[u8])> {
    static ZERO: [u8; BLOCK] = [0; BLOCK];
    let mut out: Vec<(bool, &[u8])> = Vec::new();
    let mut start = 0;
    let mut zero = None;
    for (i, block) in data.chunks(BLOCK).enumerate() {
        let z = block == &ZERO[..block.len()];
        match zero {
            Some(prev) if prev != z => {
                out.push((prev, &data[start..i * BLOCK]));
                start = i * BLOCK;
            }
            _ => {}
        }
        zero = Some(z);
    }
    if let Some(z) = zero {
        out.push((z, &data[start..]));
    }
    out
}

/// Writes chunks to an empty file, leaving holes for all-zero blocks (see the module docs).
#[derive(Debug)]
pub struct SparseWriter {
    file: tokio::fs::File,
    len: u64,
}

impl SparseWriter {
    /// `file` must be empty and positioned at 0 (a file just created).
    pub fn new(file: tokio::fs::File) -> Self {
        SparseWriter { file, len: 0 }
    }

    /// Bytes written (holes included) so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Nothing written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `data`.
    pub async fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        for (zero, run) in runs(data) {
            if zero {
                self.file.seek(SeekFrom::Current(run.len() as i64)).await?;
            } else {
                self.file.write_all(run).await?;
            }
        }
        self.len += data.len() as u64;
        Ok(())
    }

    /// Flushes and sets the length (a trailing hole counts); returns the file.
    pub async fn finish(mut self) -> std::io::Result<tokio::fs::File> {
        self.file.flush().await?;
        self.file.set_len(self.len).await?;
        Ok(self.file)
    }
}

/// Where the chunks of a streamed file go ([`crate::AgentClient::read_file_to`]).
pub trait ChunkSink {
    /// Appends `data`.
    fn put(&mut self, data: &[u8]) -> impl Future<Output = std::io::Result<()>> + Send;
}

impl ChunkSink for SparseWriter {
    async fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.write(data).await
    }
}

impl ChunkSink for Vec<u8> {
    async fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.extend_from_slice(data);
        Ok(())
    }
}

/// Any byte stream (stdout, a pipe) as a [`ChunkSink`], written as is.
#[derive(Debug)]
pub struct Plain<W>(pub W);

impl<W: AsyncWrite + Unpin + Send> ChunkSink for Plain<W> {
    async fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.0.write_all(data).await?;
        self.0.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_the_data_and_mark_zero_blocks() {
        let mut d = vec![0u8; BLOCK * 5 + 10];
        d[BLOCK * 2 + 7] = 1;
        d[BLOCK * 5 + 3] = 9;
        let r = runs(&d);
        let kinds: Vec<(bool, usize)> = r.iter().map(|(z, s)| (*z, s.len())).collect();
        assert_eq!(
            kinds,
            vec![
                (true, BLOCK * 2),
                (false, BLOCK),
                (true, BLOCK * 2),
                (false, 10)
            ]
        );
        assert!(runs(&[]).is_empty());
        assert_eq!(r.iter().map(|(_, s)| s.len()).sum::<usize>(), d.len());
    }

    #[tokio::test]
    async fn sparse_file_reads_back_identical_and_keeps_holes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = tokio::fs::File::create(&p).await.unwrap();
        let mut w = SparseWriter::new(f);
        let mut want = Vec::new();
        let zeros = vec![0u8; 1 << 20];
        for i in 0..8u8 {
            w.write(&zeros).await.unwrap();
            want.extend_from_slice(&zeros);
            let data = vec![i + 1; 5000];
            w.write(&data).await.unwrap();
            want.extend_from_slice(&data);
        }
        w.write(&zeros).await.unwrap();
        want.extend_from_slice(&zeros);
        assert_eq!(w.len(), want.len() as u64);
        drop(w.finish().await.unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), want);
        use std::os::unix::fs::MetadataExt;
        let blocks = std::fs::metadata(&p).unwrap().blocks() * 512;
        assert!(
            blocks < 1 << 20,
            "{blocks} bytes allocated for {} bytes with 40 KB of data",
            want.len()
        );
    }
}
