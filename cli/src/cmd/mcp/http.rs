//! `vm mcp --http IP:PORT`: the tools over MCP's streamable HTTP transport, on a loopback
//! address only, every request carrying a bearer token.
//!
//! Anyone who can reach the port could run code in this user's VMs, so a non-loopback
//! address is refused (there is no flag to allow one), and a request without
//! `Authorization: Bearer TOKEN` is answered 401 before it reaches the MCP service. The token
//! is `$VM_MCP_TOKEN` (at least 32 characters) or 32 random bytes made at start, printed
//! with the URL. rmcp itself checks the `Host` header against loopback names (DNS rebinding).
//!
//! Each MCP session (`Mcp-Session-Id`) gets its own [`Session`]; it ends when the client
//! deletes it, when it idles past `--session-idle`, or when the server stops, and its
//! sandboxes are removed then.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::host::Host;
use super::server::{Transport, VmMcp};
use super::session::Session;
use crate::exit;
use crate::output::outln;
use crate::stream::Signals;

/// The environment variable a fixed token comes from.
pub const TOKEN_ENV: &str = "VM_MCP_TOKEN";
/// The shortest token accepted from [`TOKEN_ENV`].
const MIN_TOKEN: usize = 32;
/// How long in-flight requests get once the server is told to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves until SIGINT or SIGTERM.
pub async fn serve(
    host: Host,
    addr: SocketAddr,
    idle: Duration,
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    if !addr.ip().is_loopback() {
        return Err(exit::Coded {
            code: exit::REFUSED,
            message: format!(
                "--http {addr}: refused; vm mcp serves only a loopback address (127.0.0.1, ::1): whoever reaches it runs code in this user's VMs"
            ),
        }
        .into());
    }
    let token: Arc<str> = token()?.into();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| exit::failed(format!("--http {addr}: cannot listen: {e}")))?;
    let local = listener.local_addr()?;
    let ct = CancellationToken::new();

    let host = Arc::new(host);
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(idle);
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(ct.child_token());
    config.allowed_hosts = vec![
        "localhost".into(),
        "127.0.0.1".into(),
        "::1".into(),
        "[::1]".into(),
        local.ip().to_string(),
    ];
    let service: StreamableHttpService<VmMcp, LocalSessionManager> = StreamableHttpService::new(
        move || {
            Ok(VmMcp::new(
                host.clone(),
                Session::new(host.clone()),
                Transport::Http,
            ))
        },
        Arc::new(sessions),
        config,
    );
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(token.clone(), bearer));

    let url = match local {
        SocketAddr::V4(a) => format!("http://{a}/mcp"),
        SocketAddr::V6(a) => format!("http://[{}]:{}/mcp", a.ip(), a.port()),
    };
    outln!("{url}");
    outln!("Authorization: Bearer {token}");
    tracing::info!("mcp: serving streamable HTTP at {url}");

    let mut server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(ct.clone().cancelled_owned())
            .into_future(),
    );
    tokio::select! {
        r = &mut server => {
            r.map_err(|e| exit::failed(format!("mcp: the HTTP server failed: {e}")))??;
        }
        sig = signals.recv() => {
            tracing::info!("{sig}: stopping the MCP server; its sessions' sandboxes go with it");
            ct.cancel();
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await.is_err() {
                server.abort();
            }
        }
    }
    Ok(exit::OK)
}

/// Answers 401 unless the request carries `Authorization: Bearer TOKEN`.
async fn bearer(State(token): State<Arc<str>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if same(g.as_bytes(), token.as_bytes()) => next.run(req).await,
        _ => {
            let mut r = (
                StatusCode::UNAUTHORIZED,
                "unauthorized: send the header Authorization: Bearer TOKEN (vm mcp printed it)\n",
            )
                .into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        }
    }
}

/// Compares in time that depends on the lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `$VM_MCP_TOKEN`, or 32 random bytes as hex.
fn token() -> anyhow::Result<String> {
    if let Ok(t) = std::env::var(TOKEN_ENV) {
        if t.len() < MIN_TOKEN || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(exit::usage(format!(
                "${TOKEN_ENV}: refused; give at least {MIN_TOKEN} visible ASCII characters"
            )));
        }
        return Ok(t);
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| exit::failed(format!("mcp: cannot read /dev/urandom for a token: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"a"));
    }
}
