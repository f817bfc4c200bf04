//! Test data: reproducible pseudo-random bytes, sparse files with data islands, their
//! digests and allocated size (the streaming-copy tests of guest-agent and the CLI).

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

pub const MIB: u64 = 1024 * 1024;

/// `n` pseudo-random bytes (xorshift64 from `seed`, which must not be 0), reproducible.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Creates a sparse file of `size` bytes (at least 2 MiB) with 1 MiB of [`noise`] at its
/// start, middle and end.
pub fn sparse_file(p: &Path, size: u64) -> std::io::Result<()> {
    let mut f = std::fs::File::create(p)?;
    f.set_len(size)?;
    for (i, at) in [0, size / 2, size - MIB].into_iter().enumerate() {
        f.seek(SeekFrom::Start(at))?;
        f.write_all(&noise(MIB as usize, i as u64 + 1))?;
    }
    Ok(())
}

/// The hex sha256 of a file, read in 1 MiB chunks.
pub fn sha256_file(p: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; MIB as usize];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Bytes the filesystem allocated for `p` (small for a sparse file).
pub fn allocated(p: &Path) -> std::io::Result<u64> {
    Ok(std::fs::metadata(p)?.blocks() * 512)
}
