//! `Resume` against the real agent: the new token replaces the old one for every later
//! connection (a connection with the snapshot's token gets no reply), an open connection is
//! not cut, and a hostile resume (a zero token, a clock before 2020) is refused with
//! `BadRequest`, leaving the old token in force. The agent here is not PID 1, so it never
//! touches the host's clock (the guest half, the clock step, is the e2e `snapshot` scenario).
mod common;

use std::time::Duration;

use common::TestAgent;
use guest_agent::frame::{read_frame, write_frame};
use guest_agent::protocol::{AgentFrame, ClientFrame, ErrorKind, MAX_FRAME, Request};
use guest_agent::{AgentClient, AgentToken, ExecRequest};
use tokio::net::UnixStream;

const T: Duration = Duration::from_secs(5);

/// An authenticated raw connection to `a`, past its `HelloOk`.
async fn authenticated(a: &TestAgent) -> UnixStream {
    let mut s = UnixStream::connect(&a.sock).await.unwrap();
    write_frame(&mut s, &a.hello(), MAX_FRAME, T).await.unwrap();
    let ok: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    assert!(matches!(ok, AgentFrame::HelloOk { .. }), "{ok:?}");
    s
}

async fn raw_resume(a: &TestAgent, token: [u8; 32], unix_nanos: u64) -> AgentFrame {
    let mut s = authenticated(a).await;
    let req = ClientFrame::Request(Request::Resume { token, unix_nanos });
    write_frame(&mut s, &req, MAX_FRAME, T).await.unwrap();
    read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap()
}

#[tokio::test]
async fn resume_replaces_the_token_for_every_later_connection() {
    let a = TestAgent::start();
    let old = a.client();
    // A connection opened before the resume is served to its end.
    let mut open = authenticated(&a).await;
    let new_token = AgentToken::generate().unwrap();
    let new = old.resume(new_token.clone()).await.unwrap();
    new.ping().await.unwrap();
    let out = new.exec(ExecRequest::shell("echo resumed")).await.unwrap();
    assert_eq!(out.output, b"resumed\n");
    // The snapshot's token: closed without a reply, nothing runs.
    let e = old
        .exec(ExecRequest::shell("touch pwned"))
        .await
        .unwrap_err();
    assert!(e.agent_kind().is_none(), "the old token got a reply: {e}");
    assert!(!a.root().join("pwned").exists());
    write_frame(
        &mut open,
        &ClientFrame::Request(Request::Ping),
        MAX_FRAME,
        T,
    )
    .await
    .unwrap();
    let pong: AgentFrame = read_frame(&mut open, MAX_FRAME, Some(T), T).await.unwrap();
    assert_eq!(pong, AgentFrame::Pong);
    // A second resume needs the new token, and moves on again.
    let third = AgentClient::unix(&a.sock).with_token(AgentToken::generate().unwrap());
    let e = third
        .resume(AgentToken::generate().unwrap())
        .await
        .unwrap_err();
    assert!(e.agent_kind().is_none(), "{e}");
    let newer = new.resume(AgentToken::generate().unwrap()).await.unwrap();
    newer.ping().await.unwrap();
    assert!(new.ping().await.is_err());
}

#[tokio::test]
async fn hostile_resumes_are_refused_and_change_nothing() {
    let a = TestAgent::start();
    for (token, nanos, what) in [
        ([0u8; 32], 1_800_000_000_000_000_000, "token"),
        ([7u8; 32], 5, "2020"),
    ] {
        match raw_resume(&a, token, nanos).await {
            AgentFrame::Error(e) => {
                assert_eq!(e.kind, ErrorKind::BadRequest, "{e:?}");
                assert!(e.message.contains(what), "{e:?}");
            }
            f => panic!("a hostile resume got {f:?}"),
        }
        a.client().ping().await.unwrap();
        let other = AgentClient::unix(&a.sock).with_token(AgentToken::from_bytes(token));
        assert!(other.ping().await.is_err(), "token {token:?} took effect");
    }
}
