//! `Resume` against the real agent: the new token replaces the old one for every later
//! connection (a connection with the snapshot's token gets no reply), an open connection is
//! not cut, the VM's generation is published (`--run-dir`, `/run/vm` in a guest) as a file
//! replaced whole, and a hostile resume (a zero token, a clock before 2020, zero entropy,
//! generation 0) is refused with `BadRequest`, leaving the old token and the generation as
//! they were. The agent here is not PID 1, so it never touches the host's clock or its random
//! pool (the guest half, the clock step and the CRNG reseed, is `tests/guest.rs` in a TCG
//! guest and the e2e `snapshot` scenario on kvm).
mod common;

use std::time::Duration;

use common::{Opts, TestAgent};
use tokio::net::UnixStream;
use vm_agent_client::AgentClient;
use vm_agent_protocol::frame::{read_frame, write_frame};
use vm_agent_protocol::protocol::{AgentFrame, ClientFrame, ErrorKind, MAX_FRAME, Request};
use vm_agent_protocol::{AgentToken, ExecRequest};

const T: Duration = Duration::from_secs(5);

/// An authenticated raw connection to `a`, past its `HelloOk`.
async fn authenticated(a: &TestAgent) -> UnixStream {
    let mut s = UnixStream::connect(&a.sock).await.unwrap();
    write_frame(&mut s, &a.hello(), MAX_FRAME, T).await.unwrap();
    let ok: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    assert!(matches!(ok, AgentFrame::HelloOk { .. }), "{ok:?}");
    s
}

async fn raw_resume(
    a: &TestAgent,
    token: [u8; 32],
    unix_nanos: u64,
    entropy: [u8; 32],
    generation: u64,
) -> AgentFrame {
    let mut s = authenticated(a).await;
    let req = ClientFrame::Request(Request::Resume {
        token,
        unix_nanos,
        entropy,
        generation,
    });
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
    let new = old.resume(new_token.clone(), 1).await.unwrap();
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
        .resume(AgentToken::generate().unwrap(), 2)
        .await
        .unwrap_err();
    assert!(e.agent_kind().is_none(), "{e}");
    let newer = new
        .resume(AgentToken::generate().unwrap(), 2)
        .await
        .unwrap();
    newer.ping().await.unwrap();
    assert!(new.ping().await.is_err());
}

/// The agent started with `--run-dir DIR`, as PID 1 keeps `/run/vm`.
fn agent_with_run_dir() -> (TestAgent, tempfile::TempDir) {
    let run = tempfile::tempdir().unwrap();
    let dir = run.path().join("vm");
    let a = TestAgent::start_with(Opts {
        extra_args: &["--run-dir", dir.to_str().unwrap()],
        env: &[],
    });
    (a, run)
}

fn generation(run: &tempfile::TempDir) -> Option<String> {
    std::fs::read_to_string(run.path().join("vm/generation")).ok()
}

#[tokio::test]
async fn resume_publishes_the_generation_as_one_file_replaced_whole() {
    let (a, run) = agent_with_run_dir();
    assert_eq!(generation(&run), None, "a booted agent wrote a generation");
    let first = a
        .client()
        .resume(AgentToken::generate().unwrap(), 1)
        .await
        .unwrap();
    assert_eq!(generation(&run).as_deref(), Some("1\n"));
    let meta = std::fs::metadata(run.path().join("vm/generation")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o444);
    // A VM restored from a snapshot of a restored one: the next number, the same file name,
    // nothing else left in the directory (the temporary file was renamed over it).
    first
        .resume(AgentToken::generate().unwrap(), 7)
        .await
        .unwrap();
    assert_eq!(generation(&run).as_deref(), Some("7\n"));
    let names: Vec<_> = std::fs::read_dir(run.path().join("vm"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("generation")]);
}

#[tokio::test]
async fn hostile_resumes_are_refused_and_change_nothing() {
    let (a, run) = agent_with_run_dir();
    let late = 1_800_000_000_000_000_000;
    let entropy = [9u8; 32];
    for (token, nanos, entropy, generation_no, what) in [
        ([0u8; 32], late, entropy, 1, "token"),
        ([7u8; 32], 5, entropy, 1, "2020"),
        ([7u8; 32], late, [0u8; 32], 1, "entropy"),
        ([7u8; 32], late, entropy, 0, "generation 0"),
    ] {
        match raw_resume(&a, token, nanos, entropy, generation_no).await {
            AgentFrame::Error(e) => {
                assert_eq!(e.kind, ErrorKind::BadRequest, "{e:?}");
                assert!(e.message.contains(what), "{e:?}");
            }
            f => panic!("a hostile resume got {f:?}"),
        }
        a.client().ping().await.unwrap();
        let other = AgentClient::unix(&a.sock).with_token(AgentToken::from_bytes(token));
        assert!(other.ping().await.is_err(), "token {token:?} took effect");
        assert_eq!(
            generation(&run),
            None,
            "a refused resume wrote a generation"
        );
    }
}
