//! Serve: a guest HTTP server published on a host loopback port answers a plain host GET
//! with the file written into the guest; stop closes the port.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use vm_sandbox::{PublishSpec, ServeSpec, Serving};
use vm_tests::host::{HttpReply, http_get};
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure, exec_ok};

const GUEST_PORT: u16 = 8000;

fn page() -> String {
    format!(
        "<h1>served from the guest</h1><p>{}</p>\n",
        std::process::id()
    )
}

/// GET `path`, waiting at most `idle` for each read.
async fn get(addr: SocketAddr, path: &str, idle: Duration) -> Result<HttpReply, String> {
    let path = path.to_string();
    let r = tokio::task::spawn_blocking(move || http_get(addr, &path, idle))
        .await
        .map_err(|e| format!("join: {e}"))?;
    r.ctx(&format!("GET from {addr}"))
}

async fn start(vm: &MicroVm) -> Result<Serving, String> {
    vm.write_file("srv/index.html", page().as_bytes())
        .await
        .ctx("write index.html")?;
    let docroot = format!("{}/srv", vm.root());
    let argv = [
        "httpd",
        "-f",
        "-p",
        &format!("127.0.0.1:{GUEST_PORT}"),
        "-h",
        &docroot,
    ];
    let spec = ServeSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        publish: vec![PublishSpec::parse(&format!("0:{GUEST_PORT}")).ctx("publish spec")?],
    };
    vm.serve(spec).await.ctx("serve httpd")
}

async fn get_returns_the_guest_file(s: &Serving) -> Result<(), String> {
    let addr = s.addr();
    ensure!(
        addr.ip().is_loopback() && addr.port() != 0,
        "published on {addr}"
    );
    // httpd needs a moment to bind inside the guest.
    let deadline = Instant::now() + Duration::from_secs(30);
    let resp = loop {
        let r = get(addr, "/index.html", Duration::from_secs(2)).await;
        match r {
            Ok(r) if r.text().starts_with("HTTP/1.") => break r.text(),
            other => {
                ensure!(s.running(), "httpd exited: {:?}: {}", s.exit(), s.output());
                ensure!(
                    Instant::now() < deadline,
                    "no HTTP answer within 30 s: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    let status = resp.lines().next().unwrap_or_default();
    ensure!(status.contains(" 200"), "status line {status:?}");
    ensure!(
        resp.ends_with(&page()),
        "body is not the guest file: {resp:?}"
    );
    let missing = get(addr, "/nope.html", Duration::from_secs(2))
        .await?
        .text();
    ensure!(
        missing.lines().next().unwrap_or_default().contains(" 404"),
        "missing page: {missing:?}"
    );
    Ok(())
}

/// HTTP/1.0 ends the body by closing the connection: the guest server's close must reach
/// the host client as EOF.
async fn server_close_reaches_the_host(s: &Serving) -> Result<(), String> {
    let reply = get(s.addr(), "/index.html", Duration::from_secs(10)).await?;
    ensure!(
        reply.text().ends_with(&page()),
        "body is not the guest file: {:?}",
        reply.text()
    );
    ensure!(
        reply.eof,
        "the whole reply arrived but the connection was not closed within 10 s"
    );
    Ok(())
}

async fn stop_closes_the_port(vm: &MicroVm, s: &Serving) -> Result<(), String> {
    let addr = s.addr();
    s.stop().await.ctx("stop")?;
    ensure!(!s.running(), "still running after stop");
    match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Ok(_) => return Err(format!("{addr} still accepts connections after stop")),
        Err(e) => ensure!(
            e.kind() == std::io::ErrorKind::ConnectionRefused,
            "connect after stop: {e}"
        ),
    }
    let ps = exec_ok(vm, "ps").await?;
    ensure!(
        !ps.contains("httpd"),
        "httpd still runs in the guest:\n{ps}"
    );
    s.stop().await.ctx("second stop")?;
    Ok(())
}

#[test]
fn serve() {
    vm_tests::scenario("serve", |driver| async move {
        let vm = boot(driver, &GuestSpec::new("serve")).await?;
        let mut c = Cases::new("serve", driver);
        match start(&vm).await {
            Ok(s) => {
                c.run("get_returns_the_guest_file", get_returns_the_guest_file(&s))
                    .await;
                c.run(
                    "server_close_reaches_the_host",
                    server_close_reaches_the_host(&s),
                )
                .await;
                c.run("stop_closes_the_port", stop_closes_the_port(&vm, &s))
                    .await;
            }
            Err(e) => c.fail("start", e),
        }
        vm.close().await;
        c.finish()
    });
}
