//! Serve: start, status, output tail, stop (whole tree), caps.
mod common;

use std::time::Duration;

use common::{TestAgent, wait_gone};
use vm_agent_protocol::{Command, ErrorKind, ServeId, ServeRequest};

fn shell(line: &str) -> ServeRequest {
    ServeRequest {
        command: Command::Shell(line.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn start_status_output_stop() {
    let a = TestAgent::start();
    let c = a.client();
    let mut req = shell("echo started $X; sleep 300 & echo $!; while true; do sleep 0.05; done");
    req.env = vec![("X".into(), "yes".into())];
    let id = c.serve_start(req).await.unwrap();
    let mut st = c.serve_status(id).await.unwrap();
    for _ in 0..100 {
        if st.output_tail.iter().filter(|&&b| b == b'\n').count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        st = c.serve_status(id).await.unwrap();
    }
    assert!(st.running);
    assert_eq!(st.exit, None);
    let text = String::from_utf8_lossy(&st.output_tail).into_owned();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("started yes"));
    let pid: i32 = lines.next().unwrap().parse().unwrap();
    assert!(!common::pid_gone(pid));
    let fin = c.serve_stop(id).await.unwrap();
    assert!(!fin.running);
    assert_eq!(fin.exit.unwrap().signal, Some(libc::SIGKILL));
    assert!(
        wait_gone(pid, 3000).await,
        "serve grandchild {pid} survived stop"
    );
    let e = c.serve_status(id).await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::NotFound));
    assert!(c.serve_stop(ServeId(9999)).await.is_err());
}

#[tokio::test]
async fn exit_is_recorded_and_tail_is_bounded() {
    let a = TestAgent::start();
    let c = a.client();
    let id = c
        .serve_start(shell(
            "head -c 200000 /dev/zero | tr '\\0' x; echo END; exit 7",
        ))
        .await
        .unwrap();
    let mut st = c.serve_status(id).await.unwrap();
    for _ in 0..200 {
        if !st.running && st.output_tail.ends_with(b"END\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        st = c.serve_status(id).await.unwrap();
    }
    assert!(!st.running);
    assert_eq!(st.exit.unwrap().code, Some(7));
    assert_eq!(
        st.output_tail.len(),
        vm_agent_protocol::protocol::SERVE_TAIL_BYTES
    );
    assert!(st.output_tail.ends_with(b"xxxEND\n"));
    c.serve_stop(id).await.unwrap();
}

#[tokio::test]
async fn serve_count_is_capped() {
    let a = TestAgent::start();
    let c = a.client();
    let mut ids = Vec::new();
    for _ in 0..16 {
        ids.push(c.serve_start(shell("sleep 300")).await.unwrap());
    }
    let e = c.serve_start(shell("sleep 300")).await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::Busy), "{e}");
    for id in ids {
        c.serve_stop(id).await.unwrap();
    }
    let id = c.serve_start(shell("sleep 300")).await.unwrap();
    c.serve_stop(id).await.unwrap();
}
