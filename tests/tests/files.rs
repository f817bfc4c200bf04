//! Files: write/read round trips, streamed transfers with their cap, listing and globbing,
//! and refused escapes from the root.

use sha2::{Digest, Sha256};
use vm_agent_protocol::protocol::ErrorKind;
use vm_agent_protocol::sparse::ChunkSink;
use vm_drivers::MachineError;
use vm_sandbox::SandboxError;
use vm_test_support::data::{self, MIB};
use vm_tests::host::{pseudo_random, sha256_hex};
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure, error_chain, exec_ok};

async fn round_trip(vm: &MicroVm) -> Result<(), String> {
    vm.write_file("data/hello.txt", b"hello, guest\n")
        .await
        .ctx("write hello.txt")?;
    let back = vm.read_file("data/hello.txt").await.ctx("read hello.txt")?;
    ensure!(
        back == b"hello, guest\n",
        "read back {:?}",
        String::from_utf8_lossy(&back)
    );
    // The guest sees the same bytes at <root>/data/hello.txt.
    let cat = exec_ok(vm, "cat data/hello.txt").await?;
    ensure!(cat == "hello, guest\n", "cat in the guest printed {cat:?}");
    // Overwrite replaces the whole content.
    vm.write_file("data/hello.txt", b"short")
        .await
        .ctx("overwrite hello.txt")?;
    let back = vm
        .read_file("data/hello.txt")
        .await
        .ctx("read overwritten")?;
    ensure!(
        back == b"short",
        "after overwrite read {:?}",
        String::from_utf8_lossy(&back)
    );
    Ok(())
}

/// A binary blob of a few hundred KiB (several protocol chunks, incompressible).
async fn blob_round_trip(vm: &MicroVm) -> Result<(), String> {
    let blob = pseudo_random(384 * 1024 + 17, 0xb10b);
    vm.write_file("data/nested/deep/blob.bin", &blob)
        .await
        .ctx("write blob")?;
    // The guest holds exactly what was written (checked before reading it back).
    let sum = exec_ok(vm, "sha256sum data/nested/deep/blob.bin").await?;
    let want = sha256_hex(&blob);
    ensure!(
        sum.starts_with(&want),
        "guest sha256sum {sum:?}, host {want}"
    );
    let back = vm
        .read_file("data/nested/deep/blob.bin")
        .await
        .ctx("read blob")?;
    ensure!(
        back.len() == blob.len(),
        "blob read back {} bytes, wrote {}",
        back.len(),
        blob.len()
    );
    ensure!(back == blob, "blob read back differs from what was written");
    Ok(())
}

/// Digests what streams through it, holding none of it.
#[derive(Default)]
struct Digesting {
    h: Sha256,
    n: u64,
}

impl ChunkSink for Digesting {
    async fn put(&mut self, d: &[u8]) -> std::io::Result<()> {
        self.h.update(d);
        self.n += d.len() as u64;
        Ok(())
    }
}

/// A 48 MiB file streamed in from a host file and out into a digest, never held whole on the
/// host: the sha256 matches on the way in (computed by the guest) and out; a cap below the
/// size is refused before any byte moves, both ways, and the refused write leaves the file
/// as it was.
async fn streamed(vm: &MicroVm) -> Result<(), String> {
    let size = 48 * MIB;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let src = dir.path().join("stream.bin");
    data::sparse_file(&src, size).map_err(|e| e.to_string())?;
    let want = data::sha256_file(&src).map_err(|e| e.to_string())?;
    let open = || async { tokio::fs::File::open(&src).await.map_err(|e| e.to_string()) };
    let n = vm
        .write_file_from("data/stream.bin", 64 * MIB, &mut open().await?)
        .await
        .ctx("stream in")?;
    ensure!(n == size, "streamed in {n} bytes of {size}");
    let sum = exec_ok(vm, "sha256sum data/stream.bin").await?;
    ensure!(
        sum.starts_with(&want),
        "guest sha256sum {sum:?}, host {want}"
    );
    let read_back = || async {
        let mut d = Digesting::default();
        let r = vm.read_file_to("data/stream.bin", 64 * MIB, &mut d).await;
        r.map(|_| (d.n, hex::encode(d.h.finalize())))
    };
    let (n, got) = read_back().await.ctx("stream out")?;
    ensure!(
        n == size && got == want,
        "streamed out {n} bytes, sha256 {got}"
    );

    let mut d = Digesting::default();
    let e = vm.read_file_to("data/stream.bin", 16 * MIB, &mut d).await;
    ensure!(
        matches!(&e, Err(e) if agent_kind(e) == Some(ErrorKind::TooLarge)) && d.n == 0,
        "a read over the cap: {:?} after {} bytes",
        e.map_err(|e| error_chain(&e)),
        d.n
    );
    let e = vm
        .write_file_from("data/stream.bin", 16 * MIB, &mut open().await?)
        .await;
    ensure!(e.is_err(), "a write over the cap was accepted");
    let (n, got) = read_back()
        .await
        .ctx("stream out after the refused write")?;
    ensure!(
        n == size && got == want,
        "the refused write changed the file"
    );
    Ok(())
}

async fn walk_and_glob(vm: &MicroVm) -> Result<(), String> {
    for (p, body) in [
        ("g/a.txt", "a"),
        ("g/b.md", "b"),
        ("g/sub/c.txt", "c"),
        ("g/sub/x/d.txt", "d"),
    ] {
        vm.write_file(p, body.as_bytes())
            .await
            .ctx(&format!("write {p}"))?;
    }
    let all = vm.walk("g").await.ctx("walk g")?;
    let want = ["g/a.txt", "g/b.md", "g/sub/c.txt", "g/sub/x/d.txt"];
    ensure!(all == want, "walk(g) = {all:?}, want {want:?}");
    let txt = vm.glob("g/**/*.txt").await.ctx("glob g/**/*.txt")?;
    ensure!(
        txt == ["g/a.txt", "g/sub/c.txt", "g/sub/x/d.txt"],
        "glob g/**/*.txt = {txt:?}"
    );
    let top = vm.glob("g/*.txt").await.ctx("glob g/*.txt")?;
    ensure!(top == ["g/a.txt"], "glob g/*.txt = {top:?}");
    let none = vm.glob("g/**/*.rs").await.ctx("glob g/**/*.rs")?;
    ensure!(none.is_empty(), "glob g/**/*.rs = {none:?}");
    let missing = vm.walk("does/not/exist").await.ctx("walk a missing dir")?;
    ensure!(missing.is_empty(), "walk of a missing dir = {missing:?}");
    Ok(())
}

fn agent_kind(e: &SandboxError) -> Option<ErrorKind> {
    match e {
        SandboxError::Machine {
            source: MachineError::Agent(c),
            ..
        } => c.agent_kind(),
        _ => None,
    }
}

/// `..` and absolute paths are refused on the host before the agent is asked; asked
/// directly, the agent refuses them too (the second layer).
async fn lexical_escapes(vm: &MicroVm) -> Result<(), String> {
    for p in [
        "../etc/passwd",
        "/etc/passwd",
        "data/../../etc/passwd",
        "..",
        "a/\0b",
    ] {
        match vm.read_file(p).await {
            Ok(b) => return Err(format!("read_file({p:?}) returned {} bytes", b.len())),
            Err(SandboxError::Path(e)) => eprintln!("    read_file({p:?}) refused: {e}"),
            Err(e) => {
                return Err(format!(
                    "read_file({p:?}) failed, but not as a path refusal: {}",
                    error_chain(&e)
                ));
            }
        }
        ensure!(
            vm.write_file(p, b"x").await.is_err(),
            "write_file({p:?}) was accepted"
        );
    }
    let agent = vm.machine();
    for p in ["../etc/passwd", "/etc/passwd", "data/../../etc/passwd"] {
        match agent.call(|c| c.read_file(vm.root(), p)).await {
            Ok(b) => return Err(format!("the agent read {p:?} ({} bytes)", b.len())),
            Err(MachineError::Agent(e)) if e.agent_kind() == Some(ErrorKind::Escape) => {}
            Err(e) => {
                return Err(format!(
                    "agent read_file({p:?}): expected an Escape refusal, got {}",
                    error_chain(&e)
                ));
            }
        }
    }
    Ok(())
}

/// A symlink created inside the guest that points out of the root is not followed.
async fn symlink_escapes(vm: &MicroVm) -> Result<(), String> {
    exec_ok(
        vm,
        "ln -sfn /etc etclink && ln -sf /etc/passwd pwlink && ln -sfn ../.. uplink",
    )
    .await?;
    exec_ok(vm, "test -r /etc/passwd").await?;
    for p in ["etclink/passwd", "pwlink", "uplink/etc/passwd"] {
        match vm.read_file(p).await {
            Ok(b) => {
                return Err(format!(
                    "read_file({p:?}) followed the symlink out ({} bytes)",
                    b.len()
                ));
            }
            Err(e) => {
                let kind = agent_kind(&e);
                ensure!(
                    kind == Some(ErrorKind::Escape),
                    "read_file({p:?}): expected Escape, got {}",
                    error_chain(&e)
                );
            }
        }
    }
    let w = vm.write_file("etclink/e2e-evil", b"owned").await;
    ensure!(
        w.is_err(),
        "write_file through a symlink to /etc was accepted"
    );
    let w = vm.write_file("pwlink", b"owned").await;
    ensure!(
        w.is_err(),
        "write_file onto a symlink to /etc/passwd was accepted"
    );
    let out = exec_ok(
        vm,
        "test -e /etc/e2e-evil && echo present || echo absent; head -c 5 /etc/passwd",
    )
    .await?;
    ensure!(
        out.starts_with("absent\n") && !out.contains("owned"),
        "guest /etc after the attempts: {out:?}"
    );
    let listed = vm.walk("").await.ctx("walk root")?;
    let through: Vec<&String> = listed
        .iter()
        .filter(|p| p.starts_with("etclink/") || p.starts_with("uplink/"))
        .collect();
    ensure!(
        through.is_empty(),
        "walk followed symlinks out of the root: {through:?}"
    );
    Ok(())
}

#[test]
fn files() {
    vm_tests::scenario("files", |driver| async move {
        let vm = boot(driver, &GuestSpec::new("files")).await?;
        let mut c = Cases::new("files", driver);
        c.run("round_trip", round_trip(&vm)).await;
        c.run("blob_round_trip", blob_round_trip(&vm)).await;
        c.run("streamed", streamed(&vm)).await;
        c.run("walk_and_glob", walk_and_glob(&vm)).await;
        c.run("lexical_escapes", lexical_escapes(&vm)).await;
        c.run("symlink_escapes", symlink_escapes(&vm)).await;
        vm.close().await;
        c.finish()
    });
}
