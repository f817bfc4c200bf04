//! `AgentClient::wait_ready` against a socket whose first connection is accepted and never
//! answered (as one accepted just before a restored guest's vsock transport reset): the
//! client gives that attempt up and its next connection reaches the agent, even with step and
//! connect timeouts longer than the whole wait, which that one attempt would otherwise use up.

mod common;

use std::time::Duration;

use common::TestAgent;
use vm_agent_client::{AgentClient, ClientLimits};

#[tokio::test]
async fn an_unanswered_attempt_is_retried_within_the_wait() {
    let a = TestAgent::start();
    let front = a.dir.path().join("front.sock");
    let listener = tokio::net::UnixListener::bind(&front).unwrap();
    let agent = a.sock.clone();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        // The first connection is held open and never read: a silent peer.
        let _silent = listener.accept().await.unwrap();
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        loop {
            let (mut c, _) = listener.accept().await.unwrap();
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut up = tokio::net::UnixStream::connect(&agent).await.unwrap();
            tokio::spawn(async move {
                let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
            });
        }
    });
    let limits = ClientLimits {
        connect_timeout: Duration::from_secs(120),
        step_timeout: Duration::from_secs(120),
        ..ClientLimits::default()
    };
    let client = AgentClient::unix(&front)
        .with_token(a.token.clone())
        .with_limits(limits);
    let info = client
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("ready after the unanswered attempt");
    assert_eq!(info.hostname, "vm");
    assert!(
        accepted.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "the answer came over a second connection"
    );
}
