//! Streamed file transfer through the real agent: a sparse file far larger than the agent's
//! memory bound goes in and out intact with its holes kept, the cap is enforced before any data
//! and again mid-stream, and an interrupted or refused write leaves the destination as it was.
mod common;

use std::path::Path;
use std::time::Duration;

use common::TestAgent;
use vm_agent_client::ClientError;
use vm_agent_protocol::ErrorKind;
use vm_agent_protocol::frame::{read_frame, write_frame};
use vm_agent_protocol::protocol::{AgentFrame, ClientFrame, MAX_FRAME, Request};
use vm_agent_protocol::sparse::{ChunkSink, SparseWriter};
use vm_test_support::data::{self, MIB, noise};

const T: Duration = Duration::from_secs(10);

fn sha256_of(p: &Path) -> String {
    data::sha256_file(p).unwrap()
}

fn allocated(p: &Path) -> u64 {
    data::allocated(p).unwrap()
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Names in `dir` (the agent's temporary files start with `.`).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The agent's peak RSS stays under this while moving a file 4 times its size each way.
const AGENT_HWM_BOUND_KIB: u64 = 64 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_file_streams_in_and_out_intact_with_flat_agent_memory() {
    let a = TestAgent::start();
    let c = a.client();
    let size = 256 * MIB;
    let src = a.dir.path().join("src.bin");
    data::sparse_file(&src, size).unwrap();
    let want = sha256_of(&src);

    let mut f = tokio::fs::File::open(&src).await.unwrap();
    let sent = c
        .write_file_from("/", "in/big.bin", 1 << 30, &mut f)
        .await
        .unwrap();
    assert_eq!(sent, size);
    let inside = a.root().join("in/big.bin");
    assert_eq!(std::fs::metadata(&inside).unwrap().len(), size);
    assert_eq!(sha256_of(&inside), want, "content changed on the way in");
    assert!(
        allocated(&inside) < 16 * MIB,
        "holes not kept: {} bytes allocated",
        allocated(&inside)
    );
    assert_eq!(names(&a.root().join("in")), ["big.bin"]);

    let dst = a.dir.path().join("back.bin");
    let mut w = SparseWriter::new(tokio::fs::File::create(&dst).await.unwrap());
    let got = c
        .read_file_to("/", "in/big.bin", 1 << 30, &mut w)
        .await
        .unwrap();
    assert_eq!(got, size);
    drop(w.finish().await.unwrap());
    assert_eq!(sha256_of(&dst), want, "content changed on the way out");
    assert!(allocated(&dst) < 16 * MIB, "host copy not sparse");

    let hwm = vm_hwm_kib(a.pid());
    eprintln!("agent VmHWM after 2 x {} MiB: {hwm} KiB", size / MIB);
    assert!(
        hwm < AGENT_HWM_BOUND_KIB,
        "agent peak RSS {hwm} KiB, bound {AGENT_HWM_BOUND_KIB} KiB"
    );
}

/// Appends to the file being read when the first chunk arrives, so it grows past the cap
/// while the agent is still reading it.
struct GrowOnFirstChunk {
    path: std::path::PathBuf,
    grow_by: u64,
    got: u64,
}

impl ChunkSink for GrowOnFirstChunk {
    async fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        if self.got == 0 {
            let f = std::fs::OpenOptions::new().write(true).open(&self.path)?;
            f.set_len(f.metadata()?.len() + self.grow_by)?;
        }
        self.got += data.len() as u64;
        Ok(())
    }
}

#[tokio::test]
async fn a_file_growing_past_the_cap_mid_read_is_refused() {
    let a = TestAgent::start();
    let c = a.client();
    let p = a.root().join("log");
    std::fs::write(&p, noise(8 * MIB as usize, 3)).unwrap();
    let mut sink = GrowOnFirstChunk {
        path: p.clone(),
        grow_by: 8 * MIB,
        got: 0,
    };
    let e = c
        .read_file_to("/", "log", 12 * MIB, &mut sink)
        .await
        .unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::TooLarge), "{e}");
    assert!(e.to_string().contains("grew past the cap"), "{e}");
    assert!(
        sink.got <= 12 * MIB,
        "{} bytes delivered past the cap",
        sink.got
    );
    // Growth within the cap is simply copied: reads go to EOF.
    let mut sink = GrowOnFirstChunk {
        path: p,
        grow_by: MIB,
        got: 0,
    };
    let n = c
        .read_file_to("/", "log", 64 * MIB, &mut sink)
        .await
        .unwrap();
    assert_eq!((n, sink.got), (17 * MIB, 17 * MIB));
}

#[tokio::test]
async fn a_source_over_the_cap_leaves_the_destination_untouched() {
    let a = TestAgent::start();
    let c = a.client();
    std::fs::create_dir(a.root().join("d")).unwrap();
    std::fs::write(a.root().join("d/f"), b"old").unwrap();
    let data = noise(3 * MIB as usize, 4);
    let e = c
        .write_file_from("/", "d/f", 2 * MIB, &mut &data[..])
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::TooLarge { max, .. } if max == 2 * MIB),
        "{e}"
    );
    // The agent sees the connection end without DataEnd and removes its temporary file.
    let end = std::time::Instant::now() + Duration::from_secs(5);
    while names(&a.root().join("d")) != ["f"] && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(names(&a.root().join("d")), ["f"]);
    assert_eq!(std::fs::read(a.root().join("d/f")).unwrap(), b"old");
    // Within the cap it replaces the file, which keeps its mode.
    use std::os::unix::fs::PermissionsExt;
    let perms = std::fs::Permissions::from_mode(0o750);
    std::fs::set_permissions(a.root().join("d/f"), perms).unwrap();
    c.write_file_from("/", "d/f", 4 * MIB, &mut &data[..])
        .await
        .unwrap();
    assert_eq!(std::fs::read(a.root().join("d/f")).unwrap(), data);
    let mode = std::fs::metadata(a.root().join("d/f"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o750);
    assert_eq!(names(&a.root().join("d")), ["f"]);
}

#[tokio::test]
async fn an_interrupted_write_leaves_no_half_file() {
    let a = TestAgent::start();
    std::fs::write(a.root().join("keep"), b"previous").unwrap();
    for path in ["keep", "new"] {
        let mut s = tokio::net::UnixStream::connect(&a.sock).await.unwrap();
        write_frame(&mut s, &a.hello(), MAX_FRAME, T).await.unwrap();
        let _: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
        let req = Request::WriteFile {
            root: "/".into(),
            path: path.into(),
            max: 10 * MIB,
        };
        write_frame(&mut s, &ClientFrame::Request(req), MAX_FRAME, T)
            .await
            .unwrap();
        let f: AgentFrame = read_frame(&mut s, MAX_FRAME, Some(T), T).await.unwrap();
        assert_eq!(f, AgentFrame::Ok);
        let half = ClientFrame::Data(noise(256 * 1024, 5));
        write_frame(&mut s, &half, MAX_FRAME, T).await.unwrap();
        // The temporary file exists while the write is open, hidden beside the destination.
        let tmp = names(a.root());
        assert!(
            tmp.iter()
                .any(|n| n.starts_with(&format!(".{path}.vm-part-"))),
            "{tmp:?}"
        );
        drop(s);
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while names(a.root()) != ["keep"] && std::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(names(a.root()), ["keep"], "after interrupting {path}");
        assert_eq!(std::fs::read(a.root().join("keep")).unwrap(), b"previous");
    }
}

/// Sleeps on the first chunk (a pager the user has not scrolled yet), then takes the rest.
struct StallOnce {
    stall: Duration,
    got: Vec<u8>,
}

impl ChunkSink for StallOnce {
    async fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        if self.got.is_empty() {
            tokio::time::sleep(self.stall).await;
        }
        self.got.extend_from_slice(data);
        Ok(())
    }
}

/// A host that reads a file slower than the agent's I/O timeout still gets every byte: file
/// reads are back-pressured, not timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_gets_every_byte_past_the_io_timeout() {
    let a = TestAgent::start_with(common::Opts {
        extra_args: &["--io-timeout-ms", "300"],
        env: &[],
    });
    let data = noise(8 * MIB as usize, 6);
    std::fs::write(a.root().join("f"), &data).unwrap();
    let mut sink = StallOnce {
        stall: Duration::from_millis(1500),
        got: Vec::new(),
    };
    let n = a
        .client()
        .read_file_to("/", "f", 64 * MIB, &mut sink)
        .await
        .unwrap();
    assert_eq!(n, 8 * MIB);
    assert!(sink.got == data, "the bytes differ");
}
