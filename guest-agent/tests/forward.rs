//! Forward to a TCP echo server on 127.0.0.1 (the host's loopback in this test).
mod common;

use common::TestAgent;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn forward_to_echo_server() {
    let a = TestAgent::start();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let c = a.client();
    let mut s = c.forward(port).await.unwrap();
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 256) as u8).collect();
    let (mut r, mut w) = s.split();
    let send = async {
        w.write_all(&payload).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let mut back = Vec::new();
    let recv = r.read_to_end(&mut back);
    let (_, n) = tokio::join!(send, recv);
    n.unwrap();
    assert_eq!(back, payload);
    // Two forwards at once are independent.
    let mut s1 = c.forward(port).await.unwrap();
    let mut s2 = c.forward(port).await.unwrap();
    s1.write_all(b"one").await.unwrap();
    s2.write_all(b"two").await.unwrap();
    let mut b = [0u8; 3];
    s2.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"two");
    s1.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"one");
}

#[tokio::test]
async fn forward_to_closed_port_is_an_error() {
    let a = TestAgent::start();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let e = a.client().forward(port).await.unwrap_err();
    assert_eq!(
        e.agent_kind(),
        Some(vm_agent_protocol::ErrorKind::Io),
        "{e}"
    );
    a.client().ping().await.unwrap();
}

/// poll(2) reports POLLHUP: the peer closed the connection in full (a half close by the peer
/// only gives POLLIN/POLLRDHUP).
fn hung_up(s: &vm_agent_client::ForwardStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLHUP != 0
}

/// A guest-side server that answers and closes (HTTP/1.0 style): the host gets the whole
/// answer, then EOF, and the agent closes the connection in full rather than half-closing it
/// (vhost-device-vsock 0.3.0 ignores a half close, so only a full close reaches the host).
#[tokio::test]
async fn guest_side_close_ends_the_host_stream() {
    let a = TestAgent::start();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let body: Vec<u8> = (0..150_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut answer =
        format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    answer.extend(&body);
    let sent = answer.clone();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut req = Vec::new();
        let mut b = [0u8; 256];
        while !req.ends_with(b"\r\n\r\n") && req.len() < 4096 {
            let n = s.read(&mut b).await.unwrap();
            assert!(n > 0, "request cut short");
            req.extend(&b[..n]);
        }
        s.write_all(&sent).await.unwrap();
        // Dropping `s` closes it.
    });
    let mut s = a.client().forward(port).await.unwrap();
    // The client does not shut down its own write side: only the guest's close can end this.
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .expect("no EOF after the guest server closed")
        .unwrap();
    assert_eq!(got, answer);
    let closed = async {
        while !hung_up(&s) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), closed)
        .await
        .expect("agent half-closed the stream instead of closing it");
}

/// Sockets of this network namespace in `SYN_SENT` to 127.0.0.1:`port` (`/proc/net/tcp`).
fn syn_sent_to(port: u16) -> usize {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let remote = format!("0100007F:{port:04X}");
    tcp.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&remote.as_str()) && f.get(3) == Some(&"02")
        })
        .count()
}

/// A guest server whose accept queue is full (Python's `http.server` listens with a backlog of
/// 5): the agent's connect for a Forward hangs in `SYN_SENT`, retransmitting. A host client that
/// gives up meanwhile (`vm serve`'s client went away) closes its stream: the agent abandons the
/// connect then, instead of holding it, its slot and the host's stream until its 30 s I/O
/// timeout (before: after the 100 abandoning clients of cli/tests/model_server.rs, the tcg
/// backend still held their streams 30 s later).
#[tokio::test]
async fn a_host_that_gives_up_during_the_connect_ends_it() {
    let a = TestAgent::start();
    let listener = tokio::net::TcpSocket::new_v4().unwrap();
    listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = listener.local_addr().unwrap().port();
    let _listener = listener.listen(0).unwrap();
    // Fill the accept queue: connects complete until one hangs (never accepted).
    let mut queued = Vec::new();
    loop {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(300)) {
            Ok(s) => queued.push(s),
            Err(_) => break,
        }
        assert!(queued.len() < 64, "the accept queue never filled");
    }
    assert_eq!(syn_sent_to(port), 0);
    let c = a.client();
    let gave_up = tokio::time::timeout(std::time::Duration::from_secs(1), c.forward(port)).await;
    assert!(gave_up.is_err(), "the forward did not hang: {gave_up:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while syn_sent_to(port) > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        syn_sent_to(port),
        0,
        "the agent still connects for a host that is gone"
    );
    a.client().ping().await.unwrap();
}
