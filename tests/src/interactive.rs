//! Interactive exec in a real guest, shared by the end-to-end scenario and the benchmarks:
//! keystroke echo through a guest pseudo-terminal (what `vm exec -t` rides on).

use std::time::{Duration, Instant};

use vm_sandbox::agent::{Command, ExecEvent, Interactive, InteractiveOutput, TtySize};
use vm_sandbox::{MicroVm, Run};

use crate::Ctx;

/// Longest wait for one echo (or for the guest side to get ready).
const ECHO_WAIT: Duration = Duration::from_secs(30);

/// Reads output until `want` has arrived in full (nothing else may come first beyond what
/// `allow_before` permits); bounded by [`ECHO_WAIT`].
async fn read_until(
    out: &mut InteractiveOutput,
    want: &[u8],
    allow_before: bool,
) -> Result<(), String> {
    let mut got = Vec::new();
    let read = async {
        while !got.ends_with(want) {
            match out.next().await.ctx("reading the guest terminal")? {
                Some(ExecEvent::Stdout(d) | ExecEvent::Stderr(d)) => got.extend(d),
                other => return Err(format!("{other:?} while waiting for {want:?}")),
            }
            if !allow_before && got.len() >= want.len() && !got.ends_with(want) {
                return Err(format!("echo {got:?}, sent {want:?}"));
            }
        }
        Ok(())
    };
    tokio::time::timeout(ECHO_WAIT, read)
        .await
        .map_err(|_| format!("no {want:?} within {ECHO_WAIT:?}"))?
}

/// Types `n` printable bytes, one at a time, into `cat` on a raw guest terminal (as a shell's
/// line editor runs it) and times each byte's echo: write the byte, read it back. Every
/// echo must be exactly the byte sent.
pub async fn keystroke_echoes(vm: &MicroVm, n: usize) -> Result<Vec<Duration>, String> {
    let run = Run {
        command: Command::Shell("stty raw -echo && echo ready && exec cat".into()),
        ..Run::default()
    };
    let size = TtySize { rows: 24, cols: 80 };
    let Interactive {
        mut input,
        mut output,
    } = vm
        .exec_interactive(run, Some(size))
        .await
        .ctx("interactive exec on a pty")?;
    read_until(&mut output, b"ready\n", true).await?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let byte = b'a' + (i % 26) as u8;
        let start = Instant::now();
        input.write(&[byte]).await.ctx("typing")?;
        read_until(&mut output, &[byte], false).await?;
        samples.push(start.elapsed());
    }
    input.cancel().await.ctx("ending cat")?;
    Ok(samples)
}
