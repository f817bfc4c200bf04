//! Connection slots by class: forwards and file streams cannot starve control requests or
//! execs (issue 25: 64 idle forwarded connections once took every slot, the serve monitor's
//! status poll got `Busy` and `vm serve` tore the VM down).
mod common;

use std::time::Duration;

use common::TestAgent;
use guest_agent::agent::slots::SlotLimits;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixStream};
use vm_agent_client::ExecEvent;
use vm_agent_protocol::frame::{read_frame, write_frame};
use vm_agent_protocol::protocol::{AgentFrame, ClientFrame, MAX_FRAME, Request};
use vm_agent_protocol::{Command, ErrorKind, ExecRequest, ServeRequest};

const T: Duration = Duration::from_secs(5);

/// A loopback TCP server that accepts and holds every connection (an idle guest server).
async fn holding_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    port
}

/// A WriteFile whose data never comes: a file stream holding its slot.
async fn stalled_upload(a: &TestAgent, name: &str) -> UnixStream {
    let mut s = UnixStream::connect(&a.sock).await.unwrap();
    write_frame(&mut s, &a.hello(), MAX_FRAME, T).await.unwrap();
    let f: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    assert!(matches!(f, AgentFrame::HelloOk { .. }), "{f:?}");
    let req = Request::WriteFile {
        root: "/".into(),
        path: name.into(),
        max: 1 << 20,
    };
    write_frame(&mut s, &ClientFrame::Request(req), MAX_FRAME, T)
        .await
        .unwrap();
    let f: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    assert_eq!(f, AgentFrame::Ok);
    s
}

#[tokio::test]
async fn control_and_exec_get_through_when_every_data_slot_is_taken() {
    common::raise_nofile();
    let a = TestAgent::start();
    let c = a.client();
    let limits = SlotLimits::default();
    let port = holding_server().await;
    let id = c
        .serve_start(ServeRequest {
            command: Command::Shell("sleep 300".into()),
            ..Default::default()
        })
        .await
        .unwrap();

    // Every data slot: two stalled uploads and forwards for the rest.
    let mut uploads = Vec::new();
    for i in 0..2 {
        uploads.push(stalled_upload(&a, &format!("up{i}")).await);
    }
    let mut forwards = Vec::new();
    for _ in 2..limits.max_data_conns {
        forwards.push(c.forward(port).await.unwrap());
    }
    let e = c.forward(port).await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::Busy), "{e}");
    let e = c.read_file("/", "missing").await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::Busy), "{e}");

    // Control requests and execs still get through, again and again.
    for _ in 0..5 {
        let st = c.serve_status(id).await.unwrap();
        assert!(st.running);
        c.ping().await.unwrap();
    }
    let out = c.exec(ExecRequest::shell("echo through")).await.unwrap();
    assert_eq!(out.output, b"through\n");

    // Long-running execs fill the slots left for commands; control still has its reserve.
    let mut execs = Vec::new();
    let room = limits.max_conns - limits.control_reserve - limits.max_data_conns;
    for _ in 0..room {
        let mut x = c
            .exec_stream(ExecRequest::shell("echo up; sleep 30"))
            .await
            .unwrap();
        // Its first output: the agent has taken its slot.
        let first = x.next().await.unwrap();
        assert!(matches!(first, Some(ExecEvent::Stdout(_))), "{first:?}");
        execs.push(x);
    }
    let e = c.exec(ExecRequest::shell("true")).await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::Busy), "{e}");
    for _ in 0..3 {
        assert!(c.serve_status(id).await.unwrap().running);
    }

    // Freed slots are taken again.
    drop(forwards);
    for mut u in uploads {
        let _ = u.shutdown().await;
    }
    for x in execs {
        let _ = x.cancel().await;
    }
    let mut again = None;
    for _ in 0..50 {
        match c.forward(port).await {
            Ok(s) => {
                again = Some(s);
                break;
            }
            Err(e) => {
                assert_eq!(e.agent_kind(), Some(ErrorKind::Busy), "{e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert!(again.is_some(), "no data slot came back");
    c.serve_stop(id).await.unwrap();
}
