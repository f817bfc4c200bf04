//! [`Serving::wait_ready`]: wait until a served process answers on its guest port.
//!
//! Each published guest port must accept a connection: an agent Forward succeeds only once
//! the guest's `connect(127.0.0.1:PORT)` does, so a Forward that opens is the proof, without
//! the host listener in between (which always accepts). With an HTTP path, a `GET` sent
//! over a Forward to the first published port must answer a `2xx` status line. The wait
//! ends early, with [`ServeError::ExitedEarly`], when the process exits; after the timeout it
//! is [`ServeError::NotReady`] with the last thing seen. Every step is bounded: one attempt
//! at most [`ATTEMPT_TIMEOUT`], a reply head at most [`MAX_HEAD`] bytes.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::serving::{ServeError, Serving};

/// Pause between two attempts.
pub const RETRY_INTERVAL: Duration = Duration::from_millis(250);
/// The longest one attempt (a Forward, a request and its status line) may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes of a reply read while looking for its status line.
pub const MAX_HEAD: usize = 4096;
/// The default readiness timeout (a TCG guest starting a Python runtime is slow).
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(300);

/// When a server counts as ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// An HTTP path (`/health`) that must answer 2xx on the first published port.
    pub http_path: Option<String>,
    /// How long to wait in all.
    pub timeout: Duration,
}

/// The longest `http_path` accepted.
pub const MAX_PATH: usize = 1024;

impl Readiness {
    /// An HTTP path goes into a request line as written: it must start with `/` and hold
    /// only visible ASCII (no spaces, CR or LF), at most [`MAX_PATH`] bytes.
    pub fn check_path(path: &str) -> Result<(), ServeError> {
        let ok = path.starts_with('/')
            && path.len() <= MAX_PATH
            && path.bytes().all(|b| b.is_ascii_graphic());
        match ok {
            true => Ok(()),
            false => Err(ServeError::ReadyPath { path: path.into() }),
        }
    }
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            http_path: None,
            timeout: DEFAULT_READY_TIMEOUT,
        }
    }
}

/// Why a readiness check failed; the text of [`ServeError::NotReady`]'s `last`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Probe {
    #[error("guest port {port} does not accept connections ({why})")]
    Closed { port: u16, why: String },
    #[error("GET {path} on guest port {port}: {why}")]
    Http {
        path: String,
        port: u16,
        why: String,
    },
    #[error("GET {path} on guest port {port} answered {status:?}")]
    Status {
        path: String,
        port: u16,
        status: String,
    },
}

impl Serving {
    /// Wait until every published guest port accepts connections and, with
    /// `ready.http_path`, until a GET of it answers 2xx (see the module docs).
    pub async fn wait_ready(&self, ready: &Readiness) -> Result<(), ServeError> {
        if let Some(p) = &ready.http_path {
            Readiness::check_path(p)?;
        }
        let start = Instant::now();
        let deadline = start + ready.timeout;
        let mut ports: Vec<u16> = self.published().iter().map(|p| p.guest_port).collect();
        ports.dedup();
        let first = ports[0]; // `start` refuses an empty publish list
        let mut next = 0;
        let mut last;
        loop {
            if !self.running() {
                // The monitor may see the end before the status: ask once more.
                return Err(ServeError::ExitedEarly {
                    status: self.exit_status().await,
                });
            }
            let port = ports[next];
            let path = ready.http_path.as_deref().filter(|_| port == first);
            let attempt = tokio::time::timeout(ATTEMPT_TIMEOUT, self.probe(port, path)).await;
            match attempt {
                Ok(Ok(())) => {
                    tracing::debug!(port, "guest port ready");
                    next += 1;
                    if next == ports.len() {
                        return Ok(());
                    }
                    continue;
                }
                Ok(Err(p)) => last = p.to_string(),
                Err(_) => last = format!("guest port {port}: no answer within {ATTEMPT_TIMEOUT:?}"),
            }
            if Instant::now() + RETRY_INTERVAL >= deadline {
                return Err(ServeError::NotReady {
                    waited: start.elapsed(),
                    last,
                });
            }
            tokio::time::sleep(RETRY_INTERVAL).await;
        }
    }

    /// One attempt on one guest port.
    async fn probe(&self, port: u16, http_path: Option<&str>) -> Result<(), Probe> {
        let mut s = self
            .machine
            .call(|c| c.forward(port))
            .await
            .map_err(|e| Probe::Closed {
                port,
                why: vm_error_chain::error_chain(&e),
            })?;
        let Some(path) = http_path else {
            return Ok(());
        };
        let http = |why: String| Probe::Http {
            path: path.into(),
            port,
            why,
        };
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: vm-ready\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| http(format!("sending: {e}")))?;
        let mut head = Vec::with_capacity(256);
        let mut chunk = [0u8; 512];
        while !head.contains(&b'\n') && head.len() < MAX_HEAD {
            let n = s
                .read(&mut chunk)
                .await
                .map_err(|e| http(format!("reading: {e}")))?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&chunk[..n]);
        }
        let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line).trim_end().to_string();
        if line.is_empty() {
            return Err(http("closed without a reply".into()));
        }
        if status_is_2xx(&line) {
            return Ok(());
        }
        let mut status = line;
        status.truncate(120);
        Err(Probe::Status {
            path: path.into(),
            port,
            status,
        })
    }
}

/// `HTTP/1.x 2NN ...`.
fn status_is_2xx(line: &str) -> bool {
    let mut words = line.split_ascii_whitespace();
    let proto_ok = words.next().is_some_and(|p| p.starts_with("HTTP/"));
    let code = words.next().unwrap_or_default();
    proto_ok && code.len() == 3 && code.starts_with('2') && code.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::{Readiness, status_is_2xx};

    #[test]
    fn ready_paths() {
        for ok in ["/", "/health", "/v1/models?x=1"] {
            assert!(Readiness::check_path(ok).is_ok(), "{ok}");
        }
        let long = format!("/{}", "a".repeat(1024));
        for bad in [
            "",
            "health",
            "/a b",
            "/a\r\nHost: x",
            "/\u{e9}",
            long.as_str(),
        ] {
            let err = Readiness::check_path(bad).expect_err(bad).to_string();
            assert!(err.contains("ready path"), "{bad}: {err}");
        }
    }

    #[test]
    fn status_lines() {
        for ok in ["HTTP/1.1 200 OK", "HTTP/1.0 204 No Content", "HTTP/2 299"] {
            assert!(status_is_2xx(ok), "{ok}");
        }
        for bad in [
            "HTTP/1.1 503 Service Unavailable",
            "HTTP/1.1 301 Moved",
            "HTTP/1.1 2000",
            "HTTP/1.1 2x0",
            "SSH-2.0-OpenSSH",
            "200 OK",
            "",
        ] {
            assert!(!status_is_2xx(bad), "{bad}");
        }
    }
}
