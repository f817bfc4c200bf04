//! The host side of hybrid vsock: the listening Unix socket and the `CONNECT <port>\n`
//! handshake of host clients (bounded in length, [`MAX_LINE`], and time, [`CONNECT_TIMEOUT`]). Guest-initiated connections are
//! never connected anywhere (see the muxer); [`peer_path`] only names where a hybrid-vsock VMM
//! would have connected them, so tests can listen there and prove nothing arrives.

use std::io::{ErrorKind, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::virtio::VirtioError;

/// Longest accepted handshake line, newline included.
pub const MAX_LINE: usize = 32;
/// How long a host client may take to send its `CONNECT` line: a client that connects and
/// stays silent holds a descriptor and a connection slot only this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the guest may take to answer a host-initiated connection (its `RESPONSE`): longer
/// than [`CONNECT_TIMEOUT`], as an emulated guest under load can be slow to run its listener.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);

/// Parse a `CONNECT <port>` line (without the newline).
pub fn parse_connect_line(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    let port = s.strip_prefix("CONNECT ")?.trim_end_matches('\r');
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

/// Bind the listening socket at `path` (non-blocking). A stale socket file nobody listens on is
/// replaced; a live one is an error.
pub fn bind(path: &Path) -> Result<UnixListener, VirtioError> {
    let err = |source| VirtioError::Bind {
        path: path.to_path_buf(),
        source,
    };
    let listener = match UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) if e.kind() == ErrorKind::AddrInUse && UnixStream::connect(path).is_err() => {
            std::fs::remove_file(path).map_err(err)?;
            UnixListener::bind(path).map_err(err)?
        }
        Err(e) => return Err(err(e)),
    };
    listener.set_nonblocking(true).map_err(err)?;
    Ok(listener)
}

/// `<uds_path>_<port>`: where hybrid-vsock VMMs connect a guest connection to host `port`.
/// Ours never does.
pub fn peer_path(uds_path: &Path, port: u32) -> PathBuf {
    let mut s = uds_path.as_os_str().to_os_string();
    s.push(format!("_{port}"));
    PathBuf::from(s)
}

/// A host client that has not finished its `CONNECT` line.
pub struct PendingClient {
    /// The accepted stream (non-blocking).
    pub stream: UnixStream,
    line: [u8; MAX_LINE],
    len: usize,
    /// When the client is dropped if still incomplete.
    pub deadline: Instant,
}

impl PendingClient {
    /// Whether any byte of its line has been read.
    pub fn heard(&self) -> bool {
        self.len > 0
    }
}

/// Progress of a handshake.
#[derive(Debug, PartialEq, Eq)]
pub enum Handshake {
    /// Need more bytes.
    Incomplete,
    /// A complete, valid line naming this guest port.
    Connect(u32),
    /// Over-long or invalid line, EOF or error: drop the client.
    Drop,
}

impl PendingClient {
    /// Track a freshly accepted client.
    pub fn new(stream: UnixStream, now: Instant) -> std::io::Result<Self> {
        stream.set_nonblocking(true)?;
        Ok(PendingClient {
            stream,
            line: [0; MAX_LINE],
            len: 0,
            deadline: now + CONNECT_TIMEOUT,
        })
    }

    /// Read what is available, one byte at a time so nothing after the newline is consumed.
    pub fn advance(&mut self) -> Handshake {
        loop {
            let mut b = [0u8; 1];
            match self.stream.read(&mut b) {
                Ok(0) => return Handshake::Drop,
                Ok(_) => {
                    if b[0] == b'\n' {
                        return parse_connect_line(&self.line[..self.len])
                            .map_or(Handshake::Drop, Handshake::Connect);
                    }
                    if self.len + 1 >= MAX_LINE {
                        return Handshake::Drop;
                    }
                    self.line[self.len] = b[0];
                    self.len += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Handshake::Incomplete,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Handshake::Drop,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_lines() {
        assert_eq!(parse_connect_line(b"CONNECT 1024"), Some(1024));
        assert_eq!(parse_connect_line(b"CONNECT 1024\r"), Some(1024));
        assert_eq!(parse_connect_line(b"CONNECT "), None);
        assert_eq!(parse_connect_line(b"CONNECT -1"), None);
        assert_eq!(parse_connect_line(b"CONNECT 99999999999"), None);
        assert_eq!(parse_connect_line(b"connect 1"), None);
    }

    #[test]
    fn peer_paths() {
        assert_eq!(
            peer_path(Path::new("/run/v.sock"), 52),
            PathBuf::from("/run/v.sock_52")
        );
    }
}
