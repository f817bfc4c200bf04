//! Cancel: cancelling (or dropping) a streaming exec kills its whole process tree.

use std::time::{Duration, Instant};

use vm_agent_client::{ExecEvent, ExecStream};
use vm_agent_protocol::protocol::Command;
use vm_sandbox::Run;
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure, exec_ok};

/// `sleep <secs>` processes alive in the guest, read from /proc so the probe never counts
/// itself.
/// A process may exit between the glob and the open: stderr goes to /dev/null before the `<`
/// redirection is tried, for the whole loop too.
async fn sleepers(vm: &MicroVm, secs: u32) -> Result<usize, String> {
    let line = format!(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline; echo; done 2>/dev/null | grep -c '^sleep {secs} ' || true"
    );
    let out = exec_ok(vm, &line).await?;
    out.trim()
        .parse()
        .map_err(|_| format!("sleeper count {out:?}"))
}

/// Starts `sh -c 'echo started; sleep N & sleep N'` and waits for its first output.
async fn start_tree(vm: &MicroVm, secs: u32) -> Result<ExecStream, String> {
    let run = Run {
        command: Command::Shell(format!("echo started; sleep {secs} & sleep {secs}")),
        ..Default::default()
    };
    let mut stream = vm.exec_stream(run).await.ctx("exec_stream")?;
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("started") {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
            Err(_) => return Err("no output from the streaming exec within 30 s".into()),
            Ok(Err(e)) => return Err(format!("stream: {}", vm_tests::error_chain(&e))),
            Ok(Ok(Some(ExecEvent::Stdout(d) | ExecEvent::Stderr(d)))) => seen.extend(d),
            Ok(Ok(Some(ExecEvent::Exit(s)))) => {
                return Err(format!("the tree exited early: {s:?}"));
            }
            Ok(Ok(None)) => return Err("the stream ended early".into()),
        }
    }
    // Both sleepers must be up before the cancel means anything.
    let deadline = Instant::now() + Duration::from_secs(20);
    while sleepers(vm, secs).await? < 2 {
        ensure!(Instant::now() < deadline, "the two sleepers never appeared");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(stream)
}

async fn wait_gone(vm: &MicroVm, secs: u32) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n = sleepers(vm, secs).await?;
        if n == 0 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{n} 'sleep {secs}' processes survived"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn cancel_kills_the_tree(vm: &MicroVm) -> Result<(), String> {
    let stream = start_tree(vm, 300).await?;
    let status = stream.cancel().await.ctx("cancel")?;
    ensure!(
        !status.success(),
        "a cancelled exec reported success: {status:?}"
    );
    wait_gone(vm, 300).await?;
    let ps = exec_ok(vm, "ps").await?;
    ensure!(!ps.contains("sleep 300"), "ps still shows sleep 300:\n{ps}");
    Ok(())
}

async fn drop_kills_the_tree(vm: &MicroVm) -> Result<(), String> {
    let stream = start_tree(vm, 301).await?;
    drop(stream);
    wait_gone(vm, 301).await
}

#[test]
fn cancel() {
    vm_tests::scenario("cancel", |driver| async move {
        let vm = boot(driver, &GuestSpec::new("cancel")).await?;
        let mut c = Cases::new("cancel", driver);
        c.run("cancel_kills_the_tree", cancel_kills_the_tree(&vm))
            .await;
        c.run("drop_kills_the_tree", drop_kills_the_tree(&vm)).await;
        vm.close().await;
        c.finish()
    });
}
