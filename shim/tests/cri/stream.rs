//! The CRI streaming server's `Exec`, opened as `kubectl exec` opens it through the API
//! server: a websocket with the `v4.channel.k8s.io` subprotocol to the URL `Exec` returned,
//! each binary message prefixed by its channel (1 stdout, 2 stderr, 3 the final status as a
//! JSON `Status`). The server listens on 127.0.0.1 in containerd's network namespace, so the
//! socket is made on a thread that entered it.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::Duration;

use tungstenite::client::IntoClientRequest;
use tungstenite::{Error, Message};

/// What one streamed exec gave.
#[derive(Debug, Default)]
pub struct Streamed {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The error channel: a `Status` (`"status":"Success"`, or a failure with the exit code).
    pub status: String,
}

/// A TCP connection to `host:port`, made inside the network namespace of process `pid`.
fn connect_in_netns_of(pid: u32, addr: String) -> TcpStream {
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("containerd's netns");
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"))
    })
    .join()
    .expect("the connecting thread")
}

/// Opens `url` (from `Exec`) in the network namespace of process `pid` and reads every
/// channel until the server closes the stream.
pub fn exec(pid: u32, url: &str) -> Streamed {
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("not an http URL: {url}"));
    let addr = rest.split('/').next().unwrap_or_default().to_string();
    let tcp = connect_in_netns_of(pid, addr);
    tcp.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("a read timeout");
    let mut req = format!("ws://{rest}")
        .into_client_request()
        .expect("a websocket request");
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v4.channel.k8s.io".parse().expect("a header value"),
    );
    let (mut ws, resp) = tungstenite::client::client(req, tcp)
        .unwrap_or_else(|e| panic!("websocket handshake with {url}: {e}"));
    assert_eq!(
        resp.headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok()),
        Some("v4.channel.k8s.io"),
        "{resp:?}"
    );
    let mut out = Streamed::default();
    loop {
        match ws.read() {
            Ok(Message::Binary(b)) => match b.split_first() {
                Some((1, data)) => out.stdout.extend_from_slice(data),
                Some((2, data)) => out.stderr.extend_from_slice(data),
                Some((3, data)) => out.status.push_str(&String::from_utf8_lossy(data)),
                _ => {}
            },
            Ok(Message::Close(_)) => break,
            Ok(_) => {}
            Err(Error::ConnectionClosed | Error::AlreadyClosed) => break,
            Err(Error::Io(e)) if e.kind() == ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("reading the exec stream: {e}; so far {out:?}"),
        }
    }
    out
}
