//! Hostile peers: a hostile client against the agent, and a hostile agent against the client.
//! In each case the victim refuses the bad input with a typed error and keeps serving.
mod common;

use std::time::Duration;

use common::TestAgent;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use vm_agent_client::ClientError;
use vm_agent_client::{AgentClient, ClientLimits};
use vm_agent_protocol::frame::{FrameError, read_frame, write_frame};
use vm_agent_protocol::protocol::{
    AgentFrame, AgentInfo, ClientFrame, ErrorKind, MAX_FRAME, Request,
};
use vm_agent_protocol::{AgentToken, ExecRequest, PROTOCOL_VERSION};

const T: Duration = Duration::from_secs(5);

/// Read until EOF (or error) within `within`; true if the peer closed.
async fn closed_within(s: &mut UnixStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn agent_survives_hostile_clients() {
    let mut a = TestAgent::start_with(common::Opts {
        extra_args: &["--io-timeout-ms", "300"],
        env: &[],
    });
    // Oversized length prefix: refused without allocating, connection closed.
    let mut s = UnixStream::connect(&a.sock).await.unwrap();
    s.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
    assert!(closed_within(&mut s, T).await);
    a.client().ping().await.unwrap();
    // Garbage body.
    let mut s = UnixStream::connect(&a.sock).await.unwrap();
    s.write_all(&[8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    assert!(closed_within(&mut s, T).await);
    a.client().ping().await.unwrap();
    // Request before Hello: closed without a reply (nothing is said to an unauthenticated peer).
    let mut s = UnixStream::connect(&a.sock).await.unwrap();
    write_frame(&mut s, &ClientFrame::Request(Request::Ping), MAX_FRAME, T)
        .await
        .unwrap();
    let r: Result<AgentFrame, _> = read_frame(&mut s, MAX_FRAME, Some(T), T).await;
    assert!(r.is_err(), "unauthenticated peer got {r:?}");
    // Wrong protocol version (with the right token).
    let mut s = UnixStream::connect(&a.sock).await.unwrap();
    write_frame(
        &mut s,
        &ClientFrame::Hello {
            version: PROTOCOL_VERSION + 1,
            token: *a.token.bytes(),
        },
        MAX_FRAME,
        T,
    )
    .await
    .unwrap();
    let f: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    assert!(matches!(f, AgentFrame::Error(e) if e.kind == ErrorKind::VersionMismatch));
    // Slowloris: two bytes of a length prefix, then nothing; closed after the io timeout,
    // and others are served meanwhile.
    let mut slow = UnixStream::connect(&a.sock).await.unwrap();
    slow.write_all(&[4, 0]).await.unwrap();
    let out = a
        .client()
        .exec(ExecRequest::shell("echo still-serving"))
        .await
        .unwrap();
    assert_eq!(out.output, b"still-serving\n");
    assert!(
        closed_within(&mut slow, Duration::from_secs(3)).await,
        "slowloris connection held open"
    );
    // Idle connection that never says Hello: same.
    let mut idle = UnixStream::connect(&a.sock).await.unwrap();
    assert!(closed_within(&mut idle, Duration::from_secs(3)).await);
    // WriteFile sending more data than its cap: refused, and no file (not even a temporary
    // one) is left.
    let mut s = UnixStream::connect(&a.sock).await.unwrap();
    write_frame(&mut s, &a.hello(), MAX_FRAME, T).await.unwrap();
    let _: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    let req = Request::WriteFile {
        root: "/".into(),
        path: "w".into(),
        max: 2,
    };
    write_frame(&mut s, &ClientFrame::Request(req), MAX_FRAME, T)
        .await
        .unwrap();
    let f: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    assert_eq!(f, AgentFrame::Ok);
    write_frame(&mut s, &ClientFrame::Data(vec![1, 2, 3]), MAX_FRAME, T)
        .await
        .unwrap();
    let f: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    assert!(matches!(f, AgentFrame::Error(e) if e.kind == ErrorKind::TooLarge));
    let left: Vec<_> = std::fs::read_dir(a.root()).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    assert!(a.alive());
    a.client().ping().await.unwrap();
}

#[tokio::test]
async fn agent_caps_concurrent_connections() {
    common::raise_nofile();
    let a = TestAgent::start();
    // Authenticated connections that never send their request take every slot.
    let mut held = Vec::new();
    for _ in 0..guest_agent::agent::slots::SlotLimits::default().max_conns {
        let mut s = UnixStream::connect(&a.sock).await.unwrap();
        write_frame(&mut s, &a.hello(), MAX_FRAME, T).await.unwrap();
        let f: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
        assert!(matches!(f, AgentFrame::HelloOk { .. }), "{f:?}");
        held.push(s);
    }
    let e = a.client().ping().await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::Busy), "{e}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    a.client().ping().await.unwrap();
}

#[tokio::test]
async fn unauthenticated_peers_get_nothing_and_take_no_host_slot() {
    let a = TestAgent::start_with(common::Opts {
        extra_args: &["--io-timeout-ms", "500"],
        env: &[],
    });
    // A wrong token, no token (a client without one sends zeros): closed, no reply, no request.
    let wrong = AgentClient::unix(&a.sock).with_token(AgentToken::generate().unwrap());
    let tokenless = AgentClient::unix(&a.sock);
    for c in [wrong, tokenless] {
        let e = c.exec(ExecRequest::shell("touch pwned")).await.unwrap_err();
        assert!(e.agent_kind().is_none(), "got an agent reply: {e}");
    }
    assert!(!a.root().join("pwned").exists());
    // An oversized first frame is not read (a Hello is tiny): the agent may close as soon as
    // it has read the length, so writing the rest may fail (broken pipe) — that is the point.
    let mut s = UnixStream::connect(&a.sock).await.unwrap();
    let _ = s.write_all(&4096u32.to_le_bytes()).await;
    let _ = s.write_all(&[0u8; 4096]).await;
    assert!(closed_within(&mut s, T).await);
    // 40 idle unauthenticated connections: they wait in the handshake pool, never in the host's
    // slots, each only until the auth deadline; authenticated work then runs.
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(UnixStream::connect(&a.sock).await.unwrap());
    }
    for s in &mut idle {
        assert!(
            closed_within(s, T).await,
            "idle peer held past the deadline"
        );
    }
    let t0 = std::time::Instant::now();
    let out = a
        .client()
        .exec(ExecRequest::shell("echo hi"))
        .await
        .unwrap();
    assert_eq!(out.output, b"hi\n");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
}

/// A full handshake pool drops its **oldest** connection for a newcomer (issue 39): the
/// newcomer stays, and a client gets through at once, with no retry.
#[tokio::test]
async fn a_full_handshake_pool_drops_its_oldest_for_a_newcomer() {
    let a = TestAgent::start();
    let pool = guest_agent::agent::AgentOptions::default().max_pending;
    let mut idle = Vec::new();
    for _ in 0..pool {
        idle.push(UnixStream::connect(&a.sock).await.unwrap());
    }
    // Let the agent take all of them in (it accepts in order), then one more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut newcomer = UnixStream::connect(&a.sock).await.unwrap();
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(2)).await,
        "the oldest silent connection stays"
    );
    assert!(
        !closed_within(&mut newcomer, Duration::from_millis(300)).await,
        "the newcomer was closed"
    );
    assert!(!closed_within(&mut idle[pool - 1], Duration::from_millis(50)).await);
    let t0 = std::time::Instant::now();
    let out = a
        .client()
        .exec(ExecRequest::shell("echo through"))
        .await
        .unwrap();
    assert_eq!(out.output, b"through\n");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    drop(idle);
}

/// Issue 39's flood, against the agent alone: 300 connections that stay silent, each reopened
/// as soon as it is closed, held while a client runs commands. Each gets through within 1 s
/// (refusing the newest connection, the agent kept every one of them out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_reopened_as_they_close_never_lock_a_client_out() {
    const N: usize = 300;
    let a = TestAgent::start();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reopened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood: Vec<_> = (0..N)
        .map(|_| {
            let (sock, stop, reopened) = (a.sock.clone(), stop.clone(), reopened.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut s) = UnixStream::connect(&sock).await else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    };
                    closed_within(&mut s, Duration::from_secs(30)).await;
                    reopened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    while reopened.load(std::sync::atomic::Ordering::Relaxed) < N {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..10 {
        let t0 = std::time::Instant::now();
        let out = a.client().exec(ExecRequest::shell("true")).await;
        let took = t0.elapsed();
        assert!(out.is_ok(), "run {i}: {:?} after {took:?}", out.err());
        assert!(took < Duration::from_secs(1), "run {i}: {took:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in flood {
        let _ = f.await;
    }
}

/// A fake agent: each accepted connection is handled by the next behaviour in `script`.
type Behaviour = Box<dyn FnOnce(UnixStream) -> futures_like::BoxFut + Send>;

mod futures_like {
    pub type BoxFut = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

fn fake_agent(path: &std::path::Path, script: Vec<Behaviour>) {
    let l = UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        for b in script {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(b(s));
        }
    });
}

async fn hello(s: &mut UnixStream) {
    let _: ClientFrame = read_frame(s, MAX_FRAME, Some(T), T).await.unwrap();
    let ok = AgentFrame::HelloOk {
        version: PROTOCOL_VERSION,
        info: AgentInfo::default(),
    };
    write_frame(s, &ok, MAX_FRAME, T).await.unwrap();
}

fn behave<F, Fut>(f: F) -> Behaviour
where
    F: FnOnce(UnixStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    Box::new(move |s| Box::pin(f(s)))
}

fn good_ping() -> Behaviour {
    behave(|mut s| async move {
        hello(&mut s).await;
        let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
        write_frame(&mut s, &AgentFrame::Pong, MAX_FRAME, T)
            .await
            .unwrap();
    })
}

#[tokio::test]
async fn client_survives_a_hostile_agent() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("fake.sock");
    let script = vec![
        // 1: oversized length prefix in place of HelloOk
        behave(|mut s| async move {
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            s.write_all(&0xfff0_0000u32.to_le_bytes()).await.unwrap();
            tokio::time::sleep(T).await;
        }),
        // 2: garbage
        behave(|mut s| async move {
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            s.write_all(&[6, 0, 0, 0, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa])
                .await
                .unwrap();
            tokio::time::sleep(T).await;
        }),
        // 3: slowloris: one byte, then silence
        behave(|mut s| async move {
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            s.write_all(&[9]).await.unwrap();
            tokio::time::sleep(T).await;
        }),
        // 4: wrong version
        behave(|mut s| async move {
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            let f = AgentFrame::HelloOk {
                version: 77,
                info: AgentInfo::default(),
            };
            write_frame(&mut s, &f, MAX_FRAME, T).await.unwrap();
        }),
        // 5: unexpected reply type
        behave(|mut s| async move {
            hello(&mut s).await;
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            write_frame(&mut s, &AgentFrame::ListEnd, MAX_FRAME, T)
                .await
                .unwrap();
        }),
        // 6: exec output flood far past the client's cap
        behave(|mut s| async move {
            hello(&mut s).await;
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            for _ in 0..40 {
                if write_frame(
                    &mut s,
                    &AgentFrame::Data(vec![b'x'; 512 * 1024]),
                    MAX_FRAME,
                    T,
                )
                .await
                .is_err()
                {
                    return;
                }
            }
            let done = AgentFrame::ExecDone {
                status: Default::default(),
                truncated: false,
            };
            let _ = write_frame(&mut s, &done, MAX_FRAME, T).await;
        }),
        // 7: a small file announced, then data streaming on past the client's cap (2 MiB)
        behave(|mut s| async move {
            hello(&mut s).await;
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            write_frame(&mut s, &AgentFrame::FileStart { size: 4 }, MAX_FRAME, T)
                .await
                .unwrap();
            for _ in 0..64 {
                let chunk = AgentFrame::Data(vec![0; 256 * 1024]);
                if write_frame(&mut s, &chunk, MAX_FRAME, T).await.is_err() {
                    return;
                }
            }
        }),
        // 8: file announced above the client's maximum
        behave(|mut s| async move {
            hello(&mut s).await;
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            write_frame(
                &mut s,
                &AgentFrame::FileStart { size: u64::MAX },
                MAX_FRAME,
                T,
            )
            .await
            .unwrap();
        }),
        // 9: finally a well-behaved agent
        good_ping(),
    ];
    fake_agent(&sock, script);
    let limits = ClientLimits {
        step_timeout: Duration::from_millis(300),
        max_output_bytes: 1024 * 1024,
        max_file_bytes: 2 * 1024 * 1024,
        ..Default::default()
    };
    let c = AgentClient::unix(&sock).with_limits(limits);
    let e = c.ping().await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Frame {
                source: FrameError::TooLarge { .. },
                ..
            }
        ),
        "{e:?}"
    );
    let e = c.ping().await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Frame {
                source: FrameError::Decode(_),
                ..
            }
        ),
        "{e:?}"
    );
    let e = c.ping().await.unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e:?}");
    let e = c.ping().await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::VersionMismatch {
                agent: Some(77),
                ..
            }
        ),
        "{e:?}"
    );
    let e = c.ping().await.unwrap_err();
    assert!(
        matches!(e, ClientError::Unexpected { got: "ListEnd", .. }),
        "{e:?}"
    );
    let out = c.exec(ExecRequest::shell("x")).await.unwrap();
    assert_eq!(out.output.len(), 1024 * 1024);
    assert!(out.truncated);
    let e = c.read_file("/", "f").await.unwrap_err();
    assert!(matches!(e, ClientError::TooLarge { .. }), "{e:?}");
    let e = c.read_file("/", "f").await.unwrap_err();
    assert!(matches!(e, ClientError::TooLarge { .. }), "{e:?}");
    c.ping().await.unwrap();
}

#[tokio::test]
async fn hybrid_vsock_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vsock.sock");
    async fn expect_connect(s: &mut UnixStream) -> String {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while s.read(&mut b).await.unwrap() == 1 && b[0] != b'\n' {
            line.push(b[0]);
        }
        String::from_utf8(line).unwrap()
    }
    let script = vec![
        behave(|mut s| async move {
            assert_eq!(expect_connect(&mut s).await, "CONNECT 1024");
            // The OK line and the HelloOk arrive in one write: nothing past the line may be lost.
            let mut buf = b"OK 1024\n".to_vec();
            let ok = AgentFrame::HelloOk {
                version: PROTOCOL_VERSION,
                info: AgentInfo::default(),
            };
            buf.extend(vm_agent_protocol::frame::encode_frame(&ok, MAX_FRAME).unwrap());
            s.write_all(&buf).await.unwrap();
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
            write_frame(&mut s, &AgentFrame::Pong, MAX_FRAME, T)
                .await
                .unwrap();
        }),
        behave(|mut s| async move {
            expect_connect(&mut s).await;
            s.write_all(b"NOPE\n").await.unwrap();
        }),
        behave(|mut s| async move {
            expect_connect(&mut s).await;
            let _ = s.write_all(&[b'O'; 10_000]).await;
        }),
        behave(|mut s| async move {
            expect_connect(&mut s).await;
            tokio::time::sleep(T).await;
        }),
    ];
    fake_agent(&sock, script);
    let limits = ClientLimits {
        connect_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let c = AgentClient::hybrid_vsock(&sock, 1024).with_limits(limits);
    c.ping().await.unwrap();
    let e = c.ping().await.unwrap_err();
    assert!(matches!(e, ClientError::VsockHandshake { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains(r#"answered CONNECT 1024 with "NOPE""#),
        "{e}"
    );
    let e = c.ping().await.unwrap_err();
    assert!(matches!(e, ClientError::VsockHandshake { .. }), "{e:?}");
    let e = c.ping().await.unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e:?}");
}

/// A backend that closes every connection after its `CONNECT` line, without a word (a guest
/// that refuses the port, a device at its cap): the client retries, bounded, and then says
/// what happened. The reason was once empty (`hybrid vsock handshake failed: `).
#[tokio::test]
async fn hybrid_vsock_handshake_closed_without_a_reply_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vsock.sock");
    let l = UnixListener::bind(&sock).unwrap();
    let connects = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = connects.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut line = [0u8; 13];
            if s.read_exact(&mut line).await.is_ok() && &line == b"CONNECT 1024\n" {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let e = AgentClient::hybrid_vsock(&sock, 1024)
        .ping()
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("vsock device closed the connection without answering CONNECT 1024"),
        "{msg}"
    );
    assert!(
        connects.load(std::sync::atomic::Ordering::SeqCst) > 1,
        "retried"
    );
}

/// vhost-device-vsock 0.3.0 panics its vring worker when the host closes between `CONNECT`
/// and `OK`, after which the VM's vsock is dead. A client that times out, or is cancelled,
/// mid-handshake must therefore keep the connection until the reply is written.
#[tokio::test]
async fn hybrid_vsock_handshake_is_never_closed_before_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vsock.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let limits = ClientLimits {
        connect_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let c = AgentClient::hybrid_vsock(&sock, 1024).with_limits(limits);

    // 1. The client's handshake times out; a slow backend answers afterwards.
    let (timed_out, accepted) = tokio::join!(c.ping(), listener.accept());
    let e = timed_out.unwrap_err();
    assert!(matches!(e, ClientError::Timeout { .. }), "{e:?}");
    let (mut s, _) = accepted.unwrap();
    let mut line = [0u8; 13];
    s.read_exact(&mut line).await.unwrap();
    assert_eq!(&line, b"CONNECT 1024\n");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !closed_within(&mut s, Duration::from_millis(50)).await,
        "the client closed the connection before the backend's reply"
    );
    s.write_all(b"OK 1024\n")
        .await
        .expect("the reply could not be written: the client had closed");
    assert!(
        closed_within(&mut s, Duration::from_secs(5)).await,
        "the client kept the connection after the reply"
    );

    // 2. The caller drops the future mid-handshake (a select! losing to Ctrl-C).
    let cancelled = tokio::time::timeout(Duration::from_millis(50), c.ping());
    let (cancelled, accepted) = tokio::join!(cancelled, listener.accept());
    assert!(cancelled.is_err(), "the ping was not cancelled");
    let (mut s, _) = accepted.unwrap();
    s.read_exact(&mut line).await.unwrap();
    assert_eq!(&line, b"CONNECT 1024\n");
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(b"OK 1024\n")
        .await
        .expect("the reply could not be written: the cancelled client had closed");
}
