//! Exec: output, exit codes, stdin and pipelines inside a real guest.

use std::time::Duration;

use vm_agent_protocol::protocol::Command;
use vm_sandbox::Run;
use vm_tests::host::{pseudo_random, sha256_hex};
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure, exec_ok, sh};

async fn echo(vm: &MicroVm) -> Result<(), String> {
    let out = exec_ok(vm, "echo hello from the guest").await?;
    ensure!(out == "hello from the guest\n", "echo printed {out:?}");
    let argv = vm
        .capture(&["echo", "-n", "two words", "x"])
        .await
        .ctx("capture echo")?;
    ensure!(
        argv.output == b"two words x",
        "argv echo printed {:?}",
        argv.output
    );
    Ok(())
}

async fn exit_codes(vm: &MicroVm) -> Result<(), String> {
    for code in [0, 1, 7, 255] {
        let out = sh(vm, &format!("exit {code}")).await?;
        ensure!(
            out.status.code == Some(code),
            "exit {code} came back as {:?}",
            out.status
        );
        ensure!(
            out.status.signal.is_none() && !out.status.timed_out,
            "{:?}",
            out.status
        );
    }
    let killed = sh(vm, "kill -9 $$").await?;
    ensure!(
        killed.status.signal == Some(9),
        "a SIGKILLed shell came back as {:?}",
        killed.status
    );
    Ok(())
}

async fn stdin_reaches_the_command(vm: &MicroVm) -> Result<(), String> {
    let run = Run {
        command: Command::Shell("tr a-z A-Z".into()),
        stdin: b"hello stdin\n".to_vec(),
        ..Default::default()
    };
    let out = vm.run(run).await.ctx("tr with stdin")?;
    ensure!(
        out.output == b"HELLO STDIN\n",
        "tr printed {:?}",
        String::from_utf8_lossy(&out.output)
    );
    // A larger binary stdin arrives intact.
    let blob = pseudo_random(200 * 1024, 42);
    let run = Run {
        command: Command::Shell("wc -c".into()),
        stdin: blob.clone(),
        ..Default::default()
    };
    let out = vm.run(run).await.ctx("wc -c with stdin")?;
    let text = String::from_utf8_lossy(&out.output);
    ensure!(
        text.lines().next().map(str::trim) == Some("204800"),
        "wc -c said {text:?}"
    );
    let run = Run {
        command: Command::Shell("sha256sum".into()),
        stdin: blob.clone(),
        ..Default::default()
    };
    let out = vm.run(run).await.ctx("sha256sum with stdin")?;
    let text = String::from_utf8_lossy(&out.output);
    let want = sha256_hex(&blob);
    ensure!(
        text.starts_with(&want),
        "guest sha256 {text:?}, host {want}"
    );
    Ok(())
}

async fn pipeline(vm: &MicroVm) -> Result<(), String> {
    let want = (1..=100)
        .filter(|n: &u32| n.to_string().contains('1'))
        .count();
    let out = exec_ok(vm, "seq 1 100 | grep -c 1").await?;
    ensure!(
        out.trim() == want.to_string(),
        "seq|grep -c printed {out:?}, expected {want}"
    );
    let sum: u32 = (1..=100).sum();
    let out = exec_ok(vm, "seq 1 100 | awk '{s+=$1} END {print s}'").await?;
    ensure!(
        out.trim() == sum.to_string(),
        "seq|awk sum printed {out:?}, expected {sum}"
    );
    Ok(())
}

/// A command past its timeout is killed (with its children) and reported as timed out.
async fn timeout_kills(vm: &MicroVm) -> Result<(), String> {
    let run = Run {
        command: Command::Shell("sleep 302 & sleep 302".into()),
        timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let start = std::time::Instant::now();
    let out = vm.run(run).await.ctx("sleep past its timeout")?;
    let took = start.elapsed();
    ensure!(
        out.status.timed_out,
        "not reported as timed out: {:?}",
        out.status
    );
    ensure!(
        took < Duration::from_secs(15),
        "the timed-out exec returned after {took:?}"
    );
    // The whole tree goes (allowing the kill a moment to land).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = exec_ok(vm, "ps | grep -c '[s]leep 302' || true").await?;
        if left.trim() == "0" {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "{} 'sleep 302' left 10 s after the timeout",
            left.trim()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Output larger than one protocol chunk arrives whole and in order.
async fn large_output(vm: &MicroVm) -> Result<(), String> {
    let n = 300_000;
    let out = sh(vm, &format!("seq 1 {n}")).await?;
    ensure!(
        out.status.success() && !out.truncated,
        "seq: {:?} truncated={}",
        out.status,
        out.truncated
    );
    let want: String = (1..=n).map(|i| format!("{i}\n")).collect();
    ensure!(
        out.output.len() == want.len(),
        "got {} bytes of output, want {}",
        out.output.len(),
        want.len()
    );
    ensure!(
        out.output == want.as_bytes(),
        "the output differs from seq's"
    );
    // Binary output written in large blocks (cat of a file written from the host).
    let blob = pseudo_random(300 * 1024, 7);
    vm.write_file("big.bin", &blob).await.ctx("write big.bin")?;
    let out = sh(vm, "cat big.bin").await?;
    ensure!(
        out.status.success() && !out.truncated,
        "cat: {:?} truncated={}",
        out.status,
        out.truncated
    );
    ensure!(
        out.output.len() == blob.len(),
        "cat output {} bytes, file {}",
        out.output.len(),
        blob.len()
    );
    ensure!(out.output == blob, "cat output differs from the file");
    Ok(())
}

async fn cwd_is_the_root(vm: &MicroVm) -> Result<(), String> {
    let out = exec_ok(vm, "pwd").await?;
    ensure!(out.trim() == vm.root(), "pwd {out:?}, root {}", vm.root());
    exec_ok(vm, "mkdir -p sub/dir").await?;
    let run = Run {
        command: Command::Shell("pwd".into()),
        cwd: Some("sub/dir".into()),
        ..Default::default()
    };
    let out = vm.run(run).await.ctx("pwd in sub/dir")?;
    let want = format!("{}/sub/dir\n", vm.root());
    ensure!(
        out.output == want.as_bytes(),
        "pwd printed {:?}",
        String::from_utf8_lossy(&out.output)
    );
    Ok(())
}

#[test]
fn exec() {
    vm_tests::scenario("exec", |driver| async move {
        let vm = boot(driver, &GuestSpec::new("exec")).await?;
        let mut c = Cases::new("exec", driver);
        c.run("echo", echo(&vm)).await;
        c.run("exit_codes", exit_codes(&vm)).await;
        c.run("stdin", stdin_reaches_the_command(&vm)).await;
        c.run("pipeline", pipeline(&vm)).await;
        c.run("cwd", cwd_is_the_root(&vm)).await;
        c.run("timeout_kills", timeout_kills(&vm)).await;
        c.run_within("large_output", Duration::from_secs(60), large_output(&vm))
            .await;
        vm.close().await;
        c.finish()
    });
}
