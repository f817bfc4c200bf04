//! Driving `vm exec -i`/`-t` like a user: stdin piped in, and an interactive shell session
//! typed through a real pseudo-terminal (the `expectrl` crate) with the host terminal's
//! settings compared before and after.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use expectrl::{Eof, Expect, Session};

use super::{Env, Out, vm_bin};

/// `vm ARGS` with `input` on its stdin (closed after it).
pub fn with_stdin(env: &Env, args: &[&str], input: &[u8]) -> Out {
    let mut child = env
        .cmd()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running vm");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    Out::from(child.wait_with_output().unwrap())
}

/// Single-quote `s` for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// On a terminal: `vm ARGS` (which must end in `-- sh` run with `-it` and `-e PS1=gp> `)
/// shows the guest shell's prompt, computes `$((6*7))`, survives a Ctrl-C that interrupts
/// `sleep`, and `exit 3` ends `vm` with code 3; the terminal's settings afterwards equal
/// those before. `wait` bounds each step.
pub fn shell_session(env: &Env, args: &[&str], wait: Duration) {
    let dir = env.dir.path();
    let vm_line: Vec<String> = std::iter::once(vm_bin().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| quote(&a))
        .collect();
    let script = format!(
        "stty -g > {b}; {vm}; echo vm-exit=$?; stty -g > {a}; echo outer-done",
        b = quote(dir.join("before").to_str().unwrap()),
        a = quote(dir.join("after").to_str().unwrap()),
        vm = vm_line.join(" "),
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script])
        .env("VM_RUNTIME_DIR", env.runtime())
        .env("TERM", "xterm")
        .env_remove("RUST_LOG");
    let mut p = Session::spawn(cmd).expect("spawning on a pty");
    p.set_expect_timeout(Some(wait));
    let step = |p: &mut expectrl::session::OsSession, want: &str| {
        if let Err(e) = p.expect(want) {
            panic!("waiting for {want:?}: {e}");
        }
    };
    step(&mut p, "gp> ");
    p.send_line("echo $((6*7))").unwrap();
    step(&mut p, "42");
    step(&mut p, "gp> ");
    p.send_line("echo term=$TERM").unwrap();
    step(&mut p, "term=xterm");
    step(&mut p, "gp> ");
    p.send_line("sleep 60; echo slept-$((2+3))").unwrap();
    std::thread::sleep(Duration::from_secs(1));
    p.send([0x03u8]).unwrap(); // Ctrl-C: a byte for the guest's terminal, not a cancel
    step(&mut p, "gp> ");
    p.send_line("echo alive-$((1+1))").unwrap();
    let got = p
        .expect("alive-2")
        .expect("the shell did not survive Ctrl-C");
    let before_alive = String::from_utf8_lossy(got.before()).to_string();
    assert!(
        !before_alive.contains("slept-5"),
        "sleep was not interrupted"
    );
    p.send_line("exit 3").unwrap();
    step(&mut p, "vm-exit=3");
    step(&mut p, "outer-done");
    let _ = p.expect(Eof);
    let before = std::fs::read_to_string(dir.join("before")).unwrap();
    let after = std::fs::read_to_string(dir.join("after")).unwrap();
    assert_eq!(before, after, "terminal settings changed by vm");
}
