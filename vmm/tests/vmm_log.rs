//! `vm-vmm`'s log never crashes it: with stderr a closed pipe, or a regular file under
//! `RLIMIT_FSIZE` 0 (the jail's limit), a configuration error still ends the process with its
//! own exit code (`SetupFailed`, 1), not a panic (101) or a signal. These runs stop before
//! the VM needs `/dev/kvm`.

use std::io::Write;
use std::process::{Command, ExitStatus, Stdio};

use vmm::process::{ExitKind, ProcessExit};

/// Runs `vm-vmm` (through `sh -c SCRIPT`, `"$0"` being the binary) with `stdin` on its
/// control channel and `stderr` as its log.
fn run(script: &str, stdin: &[u8], stderr: Stdio) -> ExitStatus {
    let mut child = Command::new("sh")
        .args(["-c", script, env!("CARGO_BIN_EXE_vm-vmm")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn vm-vmm");
    let mut control = child.stdin.take().expect("piped");
    let _ = control.write_all(stdin);
    drop(control);
    child.wait().expect("wait vm-vmm")
}

fn setup_failed(status: ExitStatus) -> bool {
    ProcessExit::from_status(status) == ProcessExit::Exited(ExitKind::SetupFailed)
}

/// A control channel whose first line is not a configuration.
const BAD_CONFIG: &[u8] = b"{}\n";

#[test]
fn a_log_file_gets_the_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vmm.log");
    let status = run(
        r#"exec "$0""#,
        BAD_CONFIG,
        std::fs::File::create(&path).unwrap().into(),
    );
    assert!(setup_failed(status), "{status:?}");
    let log = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines[0].contains("ERROR") && lines[0].contains("invalid configuration"),
        "{log}"
    );
    assert!(lines[1].contains("exit SetupFailed"), "{log}");
}

#[test]
fn a_file_over_its_size_limit_loses_lines_not_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vmm.log");
    for stdin in [BAD_CONFIG, b"".as_slice()] {
        let status = run(
            r#"ulimit -f 0 && exec "$0""#,
            stdin,
            std::fs::File::create(&path).unwrap().into(),
        );
        assert!(setup_failed(status), "{status:?}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }
    // Arguments are refused through the same log.
    let status = run(
        r#"ulimit -f 0 && exec "$0" --an-argument"#,
        b"",
        std::fs::File::create(&path).unwrap().into(),
    );
    assert!(setup_failed(status), "{status:?}");
}

#[test]
fn a_closed_log_pipe_loses_lines_not_the_process() {
    for stdin in [BAD_CONFIG, b"".as_slice()] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = run(r#"exec "$0""#, stdin, writer.into());
        assert!(setup_failed(status), "{status:?}");
    }
}
