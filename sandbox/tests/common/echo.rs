//! A loopback echo server to serve from a host-agent "guest", and its client.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A free loopback port for the "guest" server (the host agent's guest is the host).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The argv of a server on `127.0.0.1:port` that answers each connection's first bytes
/// with `echo:` + those bytes, after printing `listening`.
pub fn server_argv(port: u16) -> Vec<String> {
    let code = format!(
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('127.0.0.1',{port}))\ns.listen()\nprint('listening',flush=True)\n\
         while True:\n c,_=s.accept()\n d=c.recv(100)\n c.sendall(b'echo:'+d)\n c.close()\n"
    );
    vec!["python3".into(), "-c".into(), code]
}

/// Sends `ping` to `addr` until the server behind it answers (it may still be starting);
/// returns the answer (empty if it never did).
pub async fn ping(addr: std::net::SocketAddr) -> Vec<u8> {
    let mut reply = Vec::new();
    for _ in 0..100 {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        reply.clear();
        let _ = c.read_to_end(&mut reply).await;
        if !reply.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reply
}

/// Serves the echo server from `guest` on a free loopback port; returns the handle and the
/// guest port.
pub async fn serve(guest: &vm_sandbox::Guest) -> (vm_sandbox::Serving, u16) {
    let guest_port = free_port();
    let serving = guest
        .serve(vm_sandbox::ServeSpec {
            argv: server_argv(guest_port),
            publish: vec![vm_sandbox::PublishSpec::loopback(0, guest_port)],
        })
        .await
        .unwrap();
    (serving, guest_port)
}

/// Whether `port` on loopback becomes free (its server gone) within 2.5 s.
pub async fn port_freed(port: u16) -> bool {
    for _ in 0..50 {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
