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
    assert_eq!(e.agent_kind(), Some(guest_agent::ErrorKind::Io), "{e}");
    a.client().ping().await.unwrap();
}
