//! Host-side observations: processes, file hashes, the kernel banner, plain HTTP.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// True while a process with this pid exists (`kill(pid, 0)` is not `ESRCH`).
pub fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, None) != Err(nix::errno::Errno::ESRCH)
}

/// `(pid, comm)` of every process whose parent is this process and whose command name
/// starts with `prefix` (comm is at most 15 bytes: `qemu-system-x86`).
pub fn children_named(prefix: &str) -> Vec<(u32, String)> {
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces or parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(me) && comm.starts_with(prefix) {
            out.push((pid, comm.to_string()));
        }
    }
    out
}

/// Hex sha256 of a byte string.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Relative path -> sha256 of every regular file under `dir` (symlinks are not followed).
pub fn hash_tree(dir: &Path) -> std::io::Result<BTreeMap<PathBuf, String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let ft = entry.file_type()?;
            let path = entry.path();
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_file() {
                let rel = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
                out.insert(rel, sha256_hex(&std::fs::read(&path)?));
            }
        }
    }
    Ok(out)
}

/// sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf)? {
            0 => return Ok(hex::encode(h.finalize())),
            n => h.update(&buf[..n]),
        }
    }
}

/// What a file's content is, cheaply for a sparse one: sha256 over its size and the offset
/// and bytes of each 4 KiB block that is not all zeros, found through the data extents
/// (`SEEK_DATA`/`SEEK_HOLE`). Holes and zero blocks read the same, so the fingerprint is the
/// bytes', not the allocation's: a hole filled with zero pages (a read fault through a shared
/// mapping of a tmpfs file allocates one) leaves it unchanged; any byte that changes, changes it.
pub fn content_fingerprint(path: &Path) -> std::io::Result<String> {
    use nix::unistd::{Whence, lseek};
    use std::io::{Seek, SeekFrom};
    const BLOCK: usize = 4096;
    let mut f = std::fs::File::open(path)?;
    let size = f.metadata()?.len();
    let mut h = Sha256::new();
    h.update(size.to_le_bytes());
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < size {
        let data = match lseek(&f, at as i64, Whence::SeekData) {
            Ok(d) => d as u64,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        // Whole blocks: an extent starts and ends on a block boundary but for the file's end.
        let data = data - data % BLOCK as u64;
        let hole = lseek(&f, data as i64, Whence::SeekHole)? as u64;
        f.seek(SeekFrom::Start(data))?;
        let mut pos = data;
        while pos < hole {
            let want = (hole - pos).min(buf.len() as u64) as usize;
            let n = f.read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            for (i, block) in buf[..n].chunks(BLOCK).enumerate() {
                if block.iter().any(|&b| b != 0) {
                    h.update((pos + (i * BLOCK) as u64).to_le_bytes());
                    h.update(block);
                }
            }
            pos += n as u64;
        }
        at = hole.max(pos);
    }
    Ok(hex::encode(h.finalize()))
}

/// Relative path -> what it is, for every entry under `dir` (symlinks not followed): a file's
/// mode, size and [`content_fingerprint`], a directory's mode, a symlink's target. Equal
/// manifests: nothing in the tree changed.
pub fn manifest(dir: &Path) -> std::io::Result<BTreeMap<PathBuf, String>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            let meta = std::fs::symlink_metadata(&path)?;
            let rel = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
            let what = if meta.is_dir() {
                stack.push(path.clone());
                format!("d {:o}", meta.mode())
            } else if meta.file_type().is_symlink() {
                format!("l {}", std::fs::read_link(&path)?.display())
            } else {
                let fp = content_fingerprint(&path)?;
                format!("f {:o} {} {fp}", meta.mode(), meta.len())
            };
            out.insert(rel, what);
        }
    }
    Ok(out)
}

/// The kernel release in a kernel image's `Linux version <release> ...` banner (what
/// `strings vmlinux | grep 'Linux version'` shows).
pub fn kernel_release_in(image: &[u8]) -> Option<String> {
    const TAG: &[u8] = b"Linux version ";
    let mut from = 0;
    while let Some(pos) = find(&image[from..], TAG) {
        let start = from + pos + TAG.len();
        let rest = &image[start..image.len().min(start + 128)];
        let end = rest
            .iter()
            .position(|b| !b.is_ascii_graphic())
            .unwrap_or(rest.len());
        let release = &rest[..end];
        if release.first().is_some_and(u8::is_ascii_digit) {
            return Some(String::from_utf8_lossy(release).into_owned());
        }
        from = start;
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Deterministic pseudo-random bytes (xorshift64*), for payloads that must not compress or
/// repeat.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// What a plain HTTP GET got back.
#[derive(Debug, Clone)]
pub struct HttpReply {
    /// Everything read (at most 1 MiB).
    pub bytes: Vec<u8>,
    /// The server closed the connection (HTTP/1.0 ends the body that way); false when the
    /// read timed out first.
    pub eof: bool,
}

impl HttpReply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// A plain HTTP/1.0 GET over `std::net::TcpStream` (blocking): reads until the server closes
/// the connection or `timeout` passes without data.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<HttpReply> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())?;
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(HttpReply { bytes, eof: true }),
            Ok(n) if bytes.len() + n <= 1 << 20 => bytes.extend_from_slice(&buf[..n]),
            Ok(_) => return Err(std::io::Error::other("reply larger than 1 MiB")),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(HttpReply { bytes, eof: false });
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nested kvm run's case: a guest read of a sparse tmpfs file through DAX fills its
    /// holes with zero pages; its bytes, and so its fingerprint, are unchanged.
    #[test]
    fn a_fingerprint_follows_the_bytes_not_the_allocation() {
        use std::io::{Seek, SeekFrom, Write};
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sparse");
        let mut f = std::fs::File::create(&p).unwrap();
        f.set_len(64 << 20).unwrap();
        f.seek(SeekFrom::Start(8 << 20)).unwrap();
        f.write_all(b"weights").unwrap();
        let before = content_fingerprint(&p).unwrap();
        f.write_all_at(&vec![0u8; 1 << 20], 32 << 20).unwrap();
        assert_eq!(
            content_fingerprint(&p).unwrap(),
            before,
            "a hole filled with zeros"
        );
        f.write_all_at(b"W", 8 << 20).unwrap();
        assert_ne!(content_fingerprint(&p).unwrap(), before, "a byte changed");
        f.write_all_at(b"w", 8 << 20).unwrap();
        assert_eq!(content_fingerprint(&p).unwrap(), before);
        f.write_all_at(b"x", (64 << 20) - 1).unwrap();
        assert_ne!(content_fingerprint(&p).unwrap(), before, "the last byte");
    }

    #[test]
    fn banner_release_is_found() {
        let img = b"\0\0Linux version %s\0junk Linux version 6.12.48 (me@host) #1\0";
        assert_eq!(kernel_release_in(img).as_deref(), Some("6.12.48"));
        assert_eq!(kernel_release_in(b"no banner here"), None);
    }

    #[test]
    fn random_bytes_are_deterministic_and_varied() {
        let a = pseudo_random(1000, 7);
        assert_eq!(a, pseudo_random(1000, 7));
        assert_ne!(a, pseudo_random(1000, 8));
        assert!(a.iter().filter(|&&b| b == 0).count() < 50);
    }

    #[test]
    fn this_process_exists_and_a_reaped_child_does_not() {
        assert!(pid_exists(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!pid_exists(pid));
    }
}
