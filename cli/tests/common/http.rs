//! A minimal blocking HTTP/1.1 client for the serve tests: one request per connection
//! (`Connection: close`), the reply read to EOF with a read timeout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A reply: status code and body.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("reply is not JSON ({e}): {:?}", self.body))
    }
}

/// `METHOD path` with `body` (JSON when non-empty), waiting at most `idle` per read.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    idle: Duration,
) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(idle))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("no reply head: {text:?}"),
        )
    })?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("status line: {head:?}"),
            )
        })?;
    Ok(Reply {
        status,
        body: body.to_string(),
    })
}

/// `GET path`.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<Reply> {
    request(addr, "GET", path, "", Duration::from_secs(60))
}

/// `POST path` with a JSON body.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> std::io::Result<Reply> {
    request(addr, "POST", path, body, Duration::from_secs(120))
}

/// The address of a `http://ADDR` URL line as `vm serve` prints it.
pub fn url_addr(line: &str) -> SocketAddr {
    line.trim()
        .strip_prefix("http://")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("not an http://ADDRESS URL: {line:?}"))
}
