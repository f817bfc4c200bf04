//! A hybrid-vsock front for tests: the `CONNECT <port>\n` → `OK <port>\n` handshake a
//! VM's vsock socket speaks (Firecracker's, ours in `vm-vmm` and `vm-vsock`), on a plain Unix
//! listener, handing each connected stream to the test's server (e.g. the real guest agent
//! running on the host). Lets a test reach a "VM" through exactly the path a host client
//! uses for a real one.

use std::future::Future;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// Accepts connections on `listener` forever: reads the `CONNECT <port>` line (at most 64
/// bytes), answers `OK <port>` when the port matches, and passes the stream to `serve`.
/// Any other line closes the connection.
pub async fn front<F, Fut>(listener: UnixListener, port: u32, serve: F)
where
    F: Fn(UnixStream) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let want = format!("CONNECT {port}");
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let (serve, want) = (serve.clone(), want.clone());
        tokio::spawn(async move {
            let mut line = Vec::new();
            let mut b = [0u8; 1];
            while s.read_exact(&mut b).await.is_ok() && b[0] != b'\n' && line.len() < 64 {
                line.push(b[0]);
            }
            if line != want.as_bytes() {
                return;
            }
            if s.write_all(format!("OK {port}\n").as_bytes()).await.is_ok() {
                serve(s).await;
            }
        });
    }
}
