//! Interactive exec (`vm exec -i`/`-t`) inside a real guest: stdin streamed through the
//! acknowledged window with a checksum, a pseudo-terminal with its size, and keystroke
//! echo through it (every echo checked; its latency printed, as the benchmarks report it).

use std::time::Duration;

use vm_sandbox::Run;
use vm_sandbox::agent::{Command, ExecEvent, InteractiveOutput, TtySize};
use vm_tests::host::{pseudo_random, sha256_hex};
use vm_tests::proof::bench::Millis;
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure};

async fn collect(out: &mut InteractiveOutput) -> Result<(String, Option<i32>), String> {
    let mut all = Vec::new();
    loop {
        match out.next().await.ctx("output")? {
            Some(ExecEvent::Stdout(d) | ExecEvent::Stderr(d)) => all.extend(d),
            Some(ExecEvent::Exit(s)) => return Ok((String::from_utf8_lossy(&all).into(), s.code)),
            None => return Err("no exit status".into()),
        }
    }
}

async fn stdin_streamed(vm: &MicroVm) -> Result<(), String> {
    let data = pseudo_random(4 * 1024 * 1024, 11);
    let run = Run {
        command: Command::Shell("sha256sum".into()),
        ..Run::default()
    };
    let mut s = vm.exec_interactive(run, None).await.ctx("start")?;
    let mut input = s.input;
    let feed = data.clone();
    let writer = tokio::spawn(async move {
        input.write(&feed).await?;
        input.close_stdin().await
    });
    let collected = collect(&mut s.output).await;
    writer.await.ctx("writer")?.ctx("stdin")?;
    let (out, code) = collected?;
    ensure!(code == Some(0), "sha256sum exited {code:?}: {out}");
    let want = sha256_hex(&data);
    ensure!(
        out.starts_with(&want),
        "sha256sum printed {out:?}, want {want}"
    );
    Ok(())
}

async fn pty_and_size(vm: &MicroVm) -> Result<(), String> {
    let run = Run {
        command: Command::Shell("tty; stty size".into()),
        ..Run::default()
    };
    let size = TtySize { rows: 33, cols: 99 };
    let mut s = vm.exec_interactive(run, Some(size)).await.ctx("start")?;
    let (out, code) = collect(&mut s.output).await?;
    ensure!(code == Some(0), "exited {code:?}: {out}");
    ensure!(out.contains("/dev/pts/"), "tty printed {out:?}");
    ensure!(out.contains("33 99"), "stty size printed {out:?}");
    Ok(())
}

async fn keystroke_echo(vm: &MicroVm, driver: &str) -> Result<(), String> {
    let samples = vm_tests::interactive::keystroke_echoes(vm, 1000).await?;
    if let Some(m) = Millis::of(&samples) {
        println!(
            "keystroke echo [{driver}]: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} bytes",
            m.p50,
            m.p99,
            m.max,
            samples.len()
        );
    }
    Ok(())
}

#[test]
fn interactive() {
    vm_tests::scenario("interactive", |driver| async move {
        let vm = boot(driver, &GuestSpec::new("interactive")).await?;
        let mut c = Cases::new("interactive", driver);
        c.run_within(
            "stdin_streamed",
            Duration::from_secs(120),
            stdin_streamed(&vm),
        )
        .await;
        c.run("pty_and_size", pty_and_size(&vm)).await;
        c.run_within(
            "keystroke_echo",
            Duration::from_secs(300),
            keystroke_echo(&vm, driver),
        )
        .await;
        vm.close().await;
        c.finish()
    });
}
