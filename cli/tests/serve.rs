//! `vm serve` as the front door of a server in a real guest (tcg): it prints one URL per
//! published port only once the server answers (`--ready PATH`), a range publishes several
//! ports, `vm logs NAME` shows the server's output, `vm stop NAME` stops it and closes every
//! port; a server that exits before it is ready, or never answers 2xx, makes `vm serve` exit
//! non-zero with the console and server-output tails. Fails (naming why) when no guest can
//! be booted, unless `VM_TEST_ALLOW_NO_DRIVER=1`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::http::url_addr;
use common::{ChildGuard, Env, VmGuard, guest_unavailable};
use vm_test_support::no_guest_driver;

/// The status line of `GET path` on `addr`, in one attempt (no retry).
fn status_line(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n")?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while !buf.contains(&b'\n') {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(text.lines().next().unwrap_or_default().to_string())
}

/// `vm serve --allow-emulation -p 0:8000 FLAGS -- SERVER`, run to its end.
fn serve_once(env: &Env, flags: &[&str], server: &[&str]) -> common::Out {
    let mut args = vec!["serve", "--allow-emulation", "-p", "0:8000"];
    args.extend(flags);
    args.push("--");
    args.extend(server);
    env.run(&args)
}

#[test]
fn ready_urls_range_logs_and_stop() {
    let env = Env::new();
    if let Some(why) = guest_unavailable(&env) {
        return no_guest_driver("ready_urls_range_logs_and_stop", &why);
    }
    let _cleanup = VmGuard {
        env: &env,
        name: "web",
    };
    // httpd on 8001 daemonizes; the one on 8000 only starts after a 3 s sleep, so a
    // `vm serve` that printed before the guest port answers would be caught below.
    let server = "echo serve-marker; httpd -p 8001 -h /proc; sleep 3; \
                  exec httpd -f -vv -p 8000 -h /proc";
    let mut child = ChildGuard(
        env.cmd()
            .args(["serve", "--name", "web", "--allow-emulation"])
            .args(["-p", "0:8000-8001", "--ready", "/version"])
            .args(["--", "sh", "-c", server])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut urls = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        urls.push(url_addr(&line));
    }
    assert!(urls.iter().all(|a| a.ip().is_loopback() && a.port() != 0));
    assert_ne!(urls[0].port(), urls[1].port());
    // Ready means answering: the first request to each port succeeds, no retry.
    for (addr, path) in [(urls[0], "/version"), (urls[1], "/uptime")] {
        let status = status_line(addr, path).unwrap();
        assert!(
            status.starts_with("HTTP/1.") && status.contains(" 200"),
            "{addr}: {status:?}"
        );
    }
    let ps = env.run(&["ps", "--json"]).json();
    assert_eq!(ps[0]["state"], "running", "{ps}");
    let label = ps[0]["labels"]["vm.serve"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for a in &urls {
        assert!(label.contains(&format!("http://{a}")), "{label}");
    }
    // The server's output (refreshed every second): its echo and httpd's request log.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let logs = loop {
        let out = env.run(&["logs", "web"]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        if out.stdout.contains("response:200") || std::time::Instant::now() > deadline {
            break out.stdout;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(logs.contains("serve-marker"), "{logs}");
    assert!(
        logs.contains("url:/version") && logs.contains("response:200"),
        "{logs}"
    );
    let console = env.run(&["logs", "--console", "web"]).stdout;
    assert!(
        !console.contains("serve-marker"),
        "console is not the server output"
    );
    assert!(console.contains("Linux version"), "{console}");

    let stop = env.run(&["stop", "web"]);
    assert_eq!(
        (stop.code, stop.stdout.trim()),
        (0, "web"),
        "{}",
        stop.stderr
    );
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(130), "vm serve after vm stop");
    for a in &urls {
        let e = TcpStream::connect_timeout(a, Duration::from_secs(2)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{a}");
    }
    let ps = env.run(&["ps", "--json"]).json();
    assert_eq!(ps[0]["state"], "exited", "{ps}");
    assert_eq!(ps[0]["exit_reason"], "stopped (SIGTERM)", "{ps}");
    // The record stays (named) until rm, and the logs with it.
    assert!(env.run(&["logs", "web"]).stdout.contains("serve-marker"));
    assert_eq!(env.run(&["rm", "web"]).code, 0);
    assert!(common::files_under(&env.runtime()).is_empty());
}

#[test]
fn a_server_that_exits_before_ready_is_reported_with_tails() {
    let env = Env::new();
    if let Some(why) = guest_unavailable(&env) {
        return no_guest_driver(
            "a_server_that_exits_before_ready_is_reported_with_tails",
            &why,
        );
    }
    let out = serve_once(
        &env,
        &["--ready", "/health"],
        &["sh", "-c", "echo early-marker; exit 3"],
    );
    assert_eq!(out.code, 3, "stdout {:?} stderr {}", out.stdout, out.stderr);
    assert!(
        out.stdout.is_empty(),
        "no URL for a server never ready: {}",
        out.stdout
    );
    let err = &out.stderr;
    assert!(
        err.contains("exited before it was ready (exit code 3)"),
        "{err}"
    );
    let (console, server) = err
        .split_once("--- server output")
        .unwrap_or_else(|| panic!("no server-output tail: {err}"));
    assert!(server.contains("early-marker"), "{err}");
    assert!(
        console.contains("--- console") && console.contains("vm-agent"),
        "{err}"
    );
    // Without --name the record goes with the VM.
    assert_eq!(env.run(&["ps", "--json"]).json(), serde_json::json!([]));
}

#[test]
fn a_server_that_never_answers_2xx_times_out() {
    let env = Env::new();
    if let Some(why) = guest_unavailable(&env) {
        return no_guest_driver("a_server_that_never_answers_2xx_times_out", &why);
    }
    let flags = ["--ready", "/missing", "--ready-timeout", "8s"];
    let out = serve_once(&env, &flags, &["httpd", "-f", "-p", "8000", "-h", "/proc"]);
    assert_eq!(
        out.code, 125,
        "stdout {:?} stderr {}",
        out.stdout, out.stderr
    );
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(out.stderr.contains("not ready after"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("GET /missing on guest port 8000 answered")
            && out.stderr.contains("404"),
        "{}",
        out.stderr
    );
}
