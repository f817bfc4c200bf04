//! One check of [`Guest::exec_interactive`], run on a booted `MicroVm` and on an attached
//! `RunningVm` alike: stdin on pipes with a half-close, in the guest's root with the VM's
//! environment plus the run's; a pseudo-terminal with its size and a resize.

use std::time::Duration;

use vm_sandbox::agent::{Command, ExecEvent, InteractiveOutput, TtySize};
use vm_sandbox::{Guest, Run, SandboxError};

async fn collect(out: &mut InteractiveOutput) -> (String, Option<i32>) {
    let mut all = Vec::new();
    let run = async {
        loop {
            match out.next().await.unwrap() {
                Some(ExecEvent::Stdout(d) | ExecEvent::Stderr(d)) => all.extend(d),
                Some(ExecEvent::Exit(s)) => return s.code,
                None => panic!("no exit"),
            }
        }
    };
    let code = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("interactive exec did not finish");
    (String::from_utf8_lossy(&all).into_owned(), code)
}

fn sh(line: &str) -> Command {
    Command::Argv(vec!["sh".into(), "-c".into(), line.into()])
}

/// `var` is set by the VM's environment to `value`.
pub async fn check(vm: &Guest, var: &str, value: &str) {
    // Pipes: stdin until its end, then the command carries on; the VM's env and root.
    let run = Run {
        command: sh(&format!("wc -l; echo ${var} $EXTRA; pwd")),
        env: vec![("EXTRA".into(), "more".into())],
        ..Run::default()
    };
    let mut s = vm.exec_interactive(run, None).await.unwrap();
    s.input.write(b"a\nb\n").await.unwrap();
    s.input.close_stdin().await.unwrap();
    let (out, code) = collect(&mut s.output).await;
    assert_eq!(out, format!("2\n{value} more\n{}\n", vm.root()));
    assert_eq!(code, Some(0));

    // A terminal of the asked size, resized.
    let run = Run {
        command: sh("tty; stty size; read x; stty size"),
        ..Run::default()
    };
    let size = TtySize { rows: 30, cols: 90 };
    let mut s = vm.exec_interactive(run, Some(size)).await.unwrap();
    s.input
        .resize(TtySize {
            rows: 40,
            cols: 100,
        })
        .await
        .unwrap();
    s.input.write(b"go\n").await.unwrap();
    let (out, code) = collect(&mut s.output).await;
    assert!(out.contains("/dev/pts/"), "{out:?}");
    assert!(out.contains("40 100"), "{out:?}");
    assert_eq!(code, Some(0));

    // Inline stdin is refused: stdin goes through the input half.
    let run = Run {
        command: sh("cat"),
        stdin: b"x".to_vec(),
        ..Run::default()
    };
    let err = vm.exec_interactive(run, None).await.unwrap_err();
    assert!(matches!(err, SandboxError::Unsupported(_)), "{err:?}");
}
