//! The per-boot agent token: a 32-byte secret every connection presents in its `Hello`.
//!
//! # Where it lives
//! - **Host**: the driver makes one with [`AgentToken::generate`] for each boot, writes it to
//!   `agent.token` (mode 0600) in the VM's private run directory (so `vm exec NAME` can attach
//!   to a named VM), and hands it to the guest out of band: [`AgentToken::initrd_archive`] is a
//!   one-file newc cpio appended to a per-boot copy of the initramfs. The kernel unpacks
//!   concatenated archives into the rootfs, so the token appears as [`GUEST_TOKEN_PATH`].
//!   Not the kernel command line: `/proc/cmdline` is world-readable.
//! - **Guest**: PID 1 reads it with [`AgentToken::take_guest_file`] (bounded read, then unlink)
//!   before it binds its listener, so before any command can run; from then on it exists only
//!   in the agent's memory. The agent makes itself non-dumpable, and commands run without
//!   `CAP_SYS_PTRACE` and `CAP_SYS_RAWIO` (dropped from their bounding set), so guest root cannot
//!   read `/proc/1/mem`, `/proc/1/environ` or the agent's fds; the guest kernel has no
//!   `/dev/mem` or `/proc/kcore`, and the initrd pages are freed by the kernel after unpacking.
//!
//! The comparison is constant-time ([`AgentToken::matches`]); `Debug` never prints the secret.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Token length in bytes.
pub const TOKEN_LEN: usize = 32;

/// Where the token appears in the guest's rootfs (unlinked by the agent once read).
pub const GUEST_TOKEN_PATH: &str = "/vm-agent.token";

/// Token errors.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot get random bytes")]
    Random(#[source] std::io::Error),
    #[error("cannot read token file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write token file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("token file {path} is malformed: expected {} hex digits", TOKEN_LEN * 2)]
    Malformed { path: PathBuf },
    #[error("cannot remove token file {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A per-boot secret shared by the host and the agent.
#[derive(Clone, PartialEq, Eq)]
pub struct AgentToken([u8; TOKEN_LEN]);

impl std::fmt::Debug for AgentToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentToken(<redacted>)")
    }
}

/// Constant-time equality of two tokens' bytes (no early exit on the first difference).
fn ct_eq(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b.iter()) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// `N` bytes from the kernel's CRNG (`/dev/urandom`): tokens, and the entropy a `Resume`
/// hands a restored guest.
pub fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

impl AgentToken {
    /// 32 bytes from the kernel's CSPRNG (`/dev/urandom`).
    pub fn generate() -> Result<AgentToken, TokenError> {
        random_bytes().map(AgentToken).map_err(TokenError::Random)
    }

    /// A token from raw bytes (tests, and the agent's view of a `Hello`).
    pub fn from_bytes(b: [u8; TOKEN_LEN]) -> AgentToken {
        AgentToken(b)
    }

    /// The raw bytes, as sent in `Hello`.
    pub fn bytes(&self) -> &[u8; TOKEN_LEN] {
        &self.0
    }

    /// Constant-time check of presented bytes against this token.
    pub fn matches(&self, presented: &[u8; TOKEN_LEN]) -> bool {
        ct_eq(&self.0, presented)
    }

    fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn parse_hex(text: &[u8], path: &Path) -> Result<AgentToken, TokenError> {
        let malformed = || TokenError::Malformed {
            path: path.to_path_buf(),
        };
        let text = text.trim_ascii();
        if text.len() != TOKEN_LEN * 2 {
            return Err(malformed());
        }
        let mut b = [0u8; TOKEN_LEN];
        for (i, pair) in text.chunks_exact(2).enumerate() {
            let s = std::str::from_utf8(pair).map_err(|_| malformed())?;
            b[i] = u8::from_str_radix(s, 16).map_err(|_| malformed())?;
        }
        Ok(AgentToken(b))
    }

    /// Read a token file (hex), at most a few bytes more than a token: a bigger file is malformed.
    pub fn read_file(path: &Path) -> Result<AgentToken, TokenError> {
        let f = std::fs::File::open(path).map_err(|source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::read_from(f, path)
    }

    /// Read a token (hex) from `f`, the file at `path` already open (bounded read).
    pub fn read_from(f: std::fs::File, path: &Path) -> Result<AgentToken, TokenError> {
        let read_err = |source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut buf = Vec::with_capacity(TOKEN_LEN * 2 + 2);
        f.take((TOKEN_LEN * 2 + 2) as u64)
            .read_to_end(&mut buf)
            .map_err(read_err)?;
        Self::parse_hex(&buf, path)
    }

    /// Write the token (hex) to a new file readable only by its owner.
    pub fn write_file(&self, path: &Path) -> Result<(), TokenError> {
        use std::os::unix::fs::OpenOptionsExt;
        let write_err = |source| TokenError::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(write_err)?;
        f.write_all(self.to_hex().as_bytes()).map_err(write_err)
    }

    /// Read the token the host put in the rootfs, then unlink it (PID 1, before listening).
    pub fn take_guest_file(path: &Path) -> Result<AgentToken, TokenError> {
        let t = Self::read_file(path)?;
        std::fs::remove_file(path).map_err(|source| TokenError::Remove {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(t)
    }

    /// A newc cpio archive holding only [`GUEST_TOKEN_PATH`] (mode 0400, root) with this token,
    /// to append to an initramfs. Starts 4-byte aligned and ends with the `TRAILER!!!` entry.
    pub fn initrd_archive(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        let name = GUEST_TOKEN_PATH.trim_start_matches('/');
        crate::initramfs::push_entry(&mut out, name, 0o100400, self.to_hex().as_bytes());
        crate::initramfs::push_entry(&mut out, "TRAILER!!!", 0, &[]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_round_trip_is_private_and_hex() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("agent.token");
        let t = AgentToken::generate().unwrap();
        t.write_file(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(std::fs::read(&p).unwrap().len(), 64);
        assert_eq!(AgentToken::read_file(&p).unwrap(), t);
        // create_new: never overwrites a file that is already there.
        assert!(t.write_file(&p).is_err());
        let taken = AgentToken::take_guest_file(&p).unwrap();
        assert_eq!(taken, t);
        assert!(!p.exists(), "take_guest_file unlinks");
    }

    #[test]
    fn malformed_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        for bad in [&b""[..], b"abcd", &[b'z'; 64], &[b'a'; 200]] {
            std::fs::write(&p, bad).unwrap();
            let e = AgentToken::read_file(&p).unwrap_err();
            assert!(matches!(e, TokenError::Malformed { .. }), "{bad:?}: {e}");
        }
    }

    #[test]
    fn matches_only_the_same_bytes_and_debug_hides_them() {
        let a = AgentToken::from_bytes([7; TOKEN_LEN]);
        assert!(a.matches(&[7; TOKEN_LEN]));
        let mut b = [7; TOKEN_LEN];
        b[31] = 8;
        assert!(!a.matches(&b));
        assert!(!a.matches(&[0; TOKEN_LEN]));
        assert_eq!(format!("{a:?}"), "AgentToken(<redacted>)");
        assert_ne!(
            AgentToken::generate().unwrap(),
            AgentToken::generate().unwrap()
        );
    }

    #[test]
    fn initrd_archive_is_newc_with_the_token_and_a_trailer() {
        let t = AgentToken::from_bytes([0xab; TOKEN_LEN]);
        let a = t.initrd_archive();
        assert_eq!(a.len() % 4, 0);
        assert!(a.starts_with(b"070701"));
        let name_at = 110;
        assert_eq!(&a[name_at..name_at + 14], b"vm-agent.token");
        // header + "vm-agent.token\0" (15) padded to 128, then 64 hex bytes.
        assert_eq!(&a[128..192], "ab".repeat(32).as_bytes());
        let filesize = std::str::from_utf8(&a[6 + 6 * 8..6 + 7 * 8]).unwrap();
        assert_eq!(u32::from_str_radix(filesize, 16).unwrap(), 64);
        let mode = std::str::from_utf8(&a[6 + 8..6 + 16]).unwrap();
        assert_eq!(u32::from_str_radix(mode, 16).unwrap(), 0o100400);
        let tail = &a[192..];
        assert!(tail.starts_with(b"070701"));
        assert_eq!(&tail[110..120], b"TRAILER!!!");
    }
}
