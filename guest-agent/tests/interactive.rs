//! Interactive exec over the real agent binary (Unix socket): stdin streaming with
//! back-pressure and half-close, the pseudo-terminal (tty name, window size, Ctrl-C), and
//! an agent that does not know the request.
mod common;

use std::time::Duration;

use common::TestAgent;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use vm_agent_client::{ClientError, ExecEvent, Interactive, InteractiveInput, InteractiveOutput};
use vm_agent_protocol::frame::{encode_frame, read_frame, write_frame};
use vm_agent_protocol::protocol::{AgentFrame, ClientFrame, ErrorKind, MAX_FRAME, Request};
use vm_agent_protocol::{
    AgentInfo, ExecRequest, ExitStatus, InteractiveRequest, PROTOCOL_VERSION, TtySize,
};

const T: Duration = Duration::from_secs(5);

fn shell(line: &str, tty: Option<TtySize>) -> InteractiveRequest {
    let mut exec = ExecRequest::shell(line);
    exec.env = vec![("PATH".into(), "/usr/bin:/bin".into())];
    exec.timeout = Some(Duration::from_secs(120));
    InteractiveRequest { exec, tty }
}

/// Start `line` in the agent; the input and output halves.
async fn open(
    a: &TestAgent,
    line: &str,
    tty: Option<TtySize>,
) -> (InteractiveInput, InteractiveOutput) {
    let Interactive { input, output } =
        a.client().exec_interactive(shell(line, tty)).await.unwrap();
    (input, output)
}

/// All output until the exit (stdout and stderr together).
async fn collect(out: &mut InteractiveOutput) -> (Vec<u8>, ExitStatus) {
    let mut all = Vec::new();
    loop {
        match out.next().await.unwrap() {
            Some(ExecEvent::Stdout(d) | ExecEvent::Stderr(d)) => all.extend(d),
            Some(ExecEvent::Exit(s)) => return (all, s),
            None => panic!("stream ended without an exit"),
        }
    }
}

/// Read output until it contains `want`; returns everything read.
async fn expect(out: &mut InteractiveOutput, seen: &mut Vec<u8>, want: &str) {
    let found = |s: &[u8]| String::from_utf8_lossy(s).contains(want);
    let r = tokio::time::timeout(Duration::from_secs(20), async {
        while !found(seen) {
            match out.next().await.unwrap() {
                Some(ExecEvent::Stdout(d) | ExecEvent::Stderr(d)) => seen.extend(d),
                other => panic!(
                    "{other:?} before {want:?}; output {:?}",
                    String::from_utf8_lossy(seen)
                ),
            }
        }
    })
    .await;
    assert!(
        r.is_ok(),
        "no {want:?} in {:?}",
        String::from_utf8_lossy(seen)
    );
}

use vm_test_support::data::noise as bytes;

fn peak_rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 100 MiB through the guest command's stdin arrive intact (sha256 computed by the command),
/// and the agent's memory stays bounded by the window, not the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_round_trip_100_mib_with_checksum() {
    let a = TestAgent::start();
    let (mut input, mut output) = open(&a, "sha256sum", None).await;
    let total = 100 * 1024 * 1024;
    let chunk = bytes(4 * 1024 * 1024, 7);
    let mut want = Sha256::new();
    for _ in 0..total / chunk.len() {
        want.update(&chunk);
    }
    let writer = tokio::spawn(async move {
        for _ in 0..total / chunk.len() {
            input.write(&chunk).await.unwrap();
        }
        input.close_stdin().await.unwrap();
        input
    });
    let (out, status) = collect(&mut output).await;
    let _input = writer.await.unwrap();
    assert!(
        status.success(),
        "{status:?}: {}",
        String::from_utf8_lossy(&out)
    );
    let got = String::from_utf8(out).unwrap();
    assert_eq!(
        got.split_whitespace().next(),
        Some(hex::encode(want.finalize()).as_str())
    );
    let peak = peak_rss_kib(a.pid());
    assert!(
        peak < 48 * 1024,
        "agent peak RSS {peak} KiB for a 100 MiB stdin"
    );
}

/// A command that does not read its stdin holds the host's writes at about the window; once
/// it reads, everything arrives. Half-close: `wc -c` sees EOF while output still flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_pressure_and_half_close() {
    let a = TestAgent::start();
    let (mut input, mut output) = open(&a, "sleep 1.5; wc -c; echo after-eof", None).await;
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let progress = sent.clone();
    let writer = tokio::spawn(async move {
        let block = vec![b'x'; 256 * 1024];
        for _ in 0..32 {
            input.write(&block).await.unwrap();
            progress.fetch_add(block.len(), std::sync::atomic::Ordering::SeqCst);
        }
        input.close_stdin().await.unwrap();
        input
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let early = sent.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        early <= 2 * 1024 * 1024,
        "{early} bytes accepted while the command was not reading"
    );
    let (out, status) = collect(&mut output).await;
    let _input = writer.await.unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(String::from_utf8_lossy(&out), "8388608\nafter-eof\n");
}

/// Closing stdin at once (nothing sent) gives the command EOF; nothing hangs.
#[tokio::test]
async fn stdin_closed_early_is_eof() {
    let a = TestAgent::start();
    let mut s = a
        .client()
        .exec_interactive(shell("cat; echo done", None))
        .await
        .unwrap();
    s.input.close_stdin().await.unwrap();
    let (out, status) = tokio::time::timeout(T, collect(&mut s.output))
        .await
        .unwrap();
    assert_eq!((out.as_slice(), status.code), (&b"done\n"[..], Some(0)));
}

/// Cancel is seen while the command ignores stdin and the window is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_with_a_full_window() {
    let a = TestAgent::start();
    let (mut input, mut output) = open(&a, "sleep 60", None).await;
    let block = vec![0u8; 1024 * 1024];
    input.write(&block).await.unwrap();
    // The window is used up: a further write waits.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), input.write(&[1]))
            .await
            .is_err()
    );
    input.cancel().await.unwrap();
    let (_, status) = tokio::time::timeout(T, collect(&mut output)).await.unwrap();
    assert_eq!(status.signal, Some(libc::SIGKILL), "{status:?}");
    // The input half learns that the command ended.
    assert!(matches!(input.write(b"x").await, Err(ClientError::Ended)));
}

/// A signal reaches the command (a shell that traps TERM reports it and exits 7); with
/// `all` it reaches the whole group (the shell and its `sleep` die of it); an out-of-range
/// number is refused by the client before it is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_reaches_the_command_or_its_group() {
    let a = TestAgent::start();
    let (mut input, mut output) = open(
        &a,
        "trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.1; done",
        None,
    )
    .await;
    let mut seen = Vec::new();
    expect(&mut output, &mut seen, "ready").await;
    input.signal(libc::SIGTERM, false).await.unwrap();
    let (out, status) = tokio::time::timeout(T, collect(&mut output)).await.unwrap();
    assert_eq!((out.as_slice(), status.code), (&b"got TERM\n"[..], Some(7)));

    let (mut input, mut output) = open(&a, "echo ready; sleep 60; echo not reached", None).await;
    let mut seen = Vec::new();
    expect(&mut output, &mut seen, "ready").await;
    input.signal(libc::SIGTERM, true).await.unwrap();
    let (out, status) = tokio::time::timeout(T, collect(&mut output)).await.unwrap();
    assert_eq!(
        (out.as_slice(), status.signal),
        (&b""[..], Some(libc::SIGTERM)),
        "{status:?}"
    );
    assert!(matches!(
        input.signal(0, false).await,
        Err(ClientError::InvalidRequest(_))
    ));
}

/// With a terminal: `tty` names a pty, `stty size` follows resizes, Ctrl-C (a byte) interrupts
/// `sleep` and the shell survives, and `exit 3` is the exit status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_name_size_resize_and_ctrl_c() {
    let a = TestAgent::start();
    let size = TtySize { rows: 24, cols: 80 };
    let (mut input, mut output) = open(&a, "tty; stty size; exec sh", Some(size)).await;
    let mut seen = Vec::new();
    expect(&mut output, &mut seen, "24 80").await;
    let text = String::from_utf8_lossy(&seen).to_string();
    assert!(text.contains("/dev/pts/"), "tty printed {text:?}");

    input
        .resize(TtySize {
            rows: 50,
            cols: 132,
        })
        .await
        .unwrap();
    input.write(b"stty size\n").await.unwrap();
    let mut seen = Vec::new();
    expect(&mut output, &mut seen, "50 132").await;

    input
        .write(b"sleep 30; echo slept-$((2+3))\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = std::time::Instant::now();
    input.write(&[0x03]).await.unwrap();
    input.write(b"echo alive-$((6*7))\n").await.unwrap();
    let mut seen = Vec::new();
    expect(&mut output, &mut seen, "alive-42").await;
    assert!(t0.elapsed() < Duration::from_secs(10));
    // The echo of the typed line holds `$((2+3))`; only a finished sleep prints `slept-5`.
    assert!(!String::from_utf8_lossy(&seen).contains("slept-5"));

    input.write(b"exit 3\n").await.unwrap();
    let (_, status) = tokio::time::timeout(T, collect(&mut output)).await.unwrap();
    assert_eq!(status.code, Some(3), "{status:?}");
}

/// Stdin EOF on a terminal is the EOF character: `cat` ends.
#[tokio::test]
async fn pty_stdin_eof() {
    let a = TestAgent::start();
    let mut s = a
        .client()
        .exec_interactive(shell(
            "cat; echo cat-ended",
            Some(TtySize { rows: 10, cols: 40 }),
        ))
        .await
        .unwrap();
    s.input.write(b"hello\n").await.unwrap();
    s.input.close_stdin().await.unwrap();
    let (out, status) = tokio::time::timeout(T, collect(&mut s.output))
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(
        out.contains("hello") && out.contains("cat-ended"),
        "{out:?}"
    );
    assert_eq!(status.code, Some(0));
}

/// Spawn failures come back at start, as for Exec.
#[tokio::test]
async fn command_not_found_at_start() {
    let a = TestAgent::start();
    let mut req = shell("", None);
    req.exec.command = vm_agent_protocol::Command::Argv(vec!["no-such-program-here".into()]);
    let err = a.client().exec_interactive(req).await.unwrap_err();
    assert_eq!(err.agent_kind(), Some(ErrorKind::CommandNotFound), "{err}");
}

/// A request the agent cannot decode (what a newer client's request is to an older agent)
/// gets `Unsupported`, not a hang-up or a hang.
#[tokio::test]
async fn unknown_request_is_unsupported() {
    let a = TestAgent::start();
    let mut s = tokio::net::UnixStream::connect(&a.sock).await.unwrap();
    write_frame(&mut s, &a.hello(), MAX_FRAME, T).await.unwrap();
    let _: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    // ClientFrame::Request (variant 1) of Request variant 120: unknown to any agent.
    s.write_all(&[2, 0, 0, 0, 1, 120]).await.unwrap();
    let f: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
    assert!(
        matches!(&f, AgentFrame::Error(e) if e.kind == ErrorKind::Unsupported),
        "{f:?}"
    );
}

/// An agent from before interactive exec hangs up on the request (it cannot decode it);
/// the client says the agent does not support it.
#[tokio::test]
async fn old_agent_hang_up_is_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("old.sock");
    let l = UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let _: ClientFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
        let ok = AgentFrame::HelloOk {
            version: PROTOCOL_VERSION,
            info: AgentInfo::default(),
        };
        s.write_all(&encode_frame(&ok, MAX_FRAME).unwrap())
            .await
            .unwrap();
        // What an older agent does with a request it cannot decode: drop the connection.
        let r: Result<ClientFrame, _> = read_frame(&mut s, MAX_FRAME, Some(T), T).await;
        assert!(matches!(
            r,
            Ok(ClientFrame::Request(Request::ExecInteractive(_)))
        ));
    });
    let err = vm_agent_client::AgentClient::unix(&sock)
        .exec_interactive(shell("true", None))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Unsupported { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("does not support interactive exec"),
        "{err}"
    );
}
