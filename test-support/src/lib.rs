//! Shared by the workspace's tests: the one way a test that cannot run on this host says so.
//!
//! A skipped test prints `SKIP <test>: <reason>` to stderr and appends the same line to the file
//! named by `VM_TEST_SKIP_LOG` (set by `ci/test.sh`, which lists those lines and counts them in
//! its `N passed, N failed, N skipped` summary). A skip is never a pass in disguise: the reason
//! is always visible, and counted.
//!
//! [`hybrid`] is the hybrid-vsock handshake in front of a test server, for tests that reach
//! a stand-in VM the way a host client reaches a real one.

use std::io::Write;

pub mod hybrid;

/// Report `test` as skipped for `reason`.
pub fn skip(test: &str, reason: &str) {
    skip_line(&format!("SKIP {test}: {reason}"));
}

/// Report an already formatted `SKIP <test>: <reason>` line.
pub fn skip_line(line: &str) {
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("VM_TEST_SKIP_LOG") {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(mut f) => {
                if let Err(e) = writeln!(f, "{line}") {
                    eprintln!("warning: could not record the skip in {path:?}: {e}");
                }
            }
            Err(e) => eprintln!("warning: could not open skip log {path:?}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn appends_to_the_skip_log() {
        let dir = std::env::temp_dir().join(format!("vm-skip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skipped.log");
        // SAFETY: no other thread of this test binary reads or writes the environment.
        unsafe { std::env::set_var("VM_TEST_SKIP_LOG", &log) };
        super::skip("a_test", "no widget here");
        super::skip_line("SKIP other: reason");
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text, "SKIP a_test: no widget here\nSKIP other: reason\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
