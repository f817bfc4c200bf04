//! Exit codes of the `vm` binary, and the mapping from errors to them.
//!
//! `vm exec` (and `vm exec NAME`) exits with the guest command's own status, so the codes
//! `vm` uses for itself sit where a shell already reserves meanings (the same choice
//! `timeout(1)`, `env(1)` and `docker run` make):
//!
//! | code    | meaning                                                                  |
//! |---------|--------------------------------------------------------------------------|
//! | 0–255   | the guest command's exit code (`exec`); a guest signal N gives 128+N     |
//! | 2       | usage error: bad flag, bad value (`--memory 12X`, `-v relative`), bad name |
//! | 124     | the VM's wall lifetime (`--timeout`) expired before the command finished  |
//! | 125     | `vm` itself failed: boot failure, agent error, I/O, unknown VM name       |
//! | 126     | refused: the spec is invalid or the trust policy forbids it              |
//! | 127     | no driver on this host can contain the work at the requested trust       |
//! | 130     | interrupted (Ctrl-C or SIGTERM); the guest command tree was cancelled     |
//!
//! A guest command that itself exits 124–127 is indistinguishable from `vm`'s own codes by
//! the number alone; `vm` always prints a one-line `vm: …` message on stderr for its own.

use std::fmt;

/// Success.
pub const OK: u8 = 0;
/// Usage error (clap's own code).
pub const USAGE: u8 = 2;
/// Wall lifetime expired.
pub const TIMEOUT: u8 = 124;
/// `vm` itself failed.
pub const FAILED: u8 = 125;
/// Refused by validation or policy.
pub const REFUSED: u8 = 126;
/// No driver can contain the work here.
pub const NO_DRIVER: u8 = 127;
/// Interrupted by SIGINT/SIGTERM.
pub const INTERRUPTED: u8 = 130;

/// The text appended to `vm --help`.
pub const HELP_TABLE: &str = "\
Exit status:
  0-255  the guest command's exit code (vm exec); a guest killed by signal N gives 128+N
  2      usage error (bad flag or value, bad VM name)
  124    the VM's wall lifetime (--timeout) expired
  125    vm itself failed (boot failure, agent or I/O error, unknown VM)
  126    refused: invalid spec or forbidden by the trust policy
  127    no driver on this host can contain the work (see `vm drivers`)
  130    interrupted by Ctrl-C/SIGTERM (the guest command tree is cancelled first)";

/// An error raised by the CLI itself, carrying the exit code it maps to.
#[derive(Debug)]
pub struct Coded {
    /// Exit code.
    pub code: u8,
    /// One-line message (what went wrong and what to do).
    pub message: String,
}

impl fmt::Display for Coded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Coded {}

/// A usage error (exit 2).
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    Coded {
        code: USAGE,
        message: message.into(),
    }
    .into()
}

/// A failure of `vm` itself (exit 125).
pub fn failed(message: impl Into<String>) -> anyhow::Error {
    Coded {
        code: FAILED,
        message: message.into(),
    }
    .into()
}

/// Maps an error to its exit code by looking through its cause chain for the
/// error types whose meaning is known: CLI-coded errors, spec refusals, driver
/// selection failures. Anything else is `vm` itself failing.
pub fn classify(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if let Some(c) = cause.downcast_ref::<Coded>() {
            return c.code;
        }
        if let Some(code) = crate::glue::classify_library_error(cause) {
            return code;
        }
    }
    FAILED
}

/// Renders an error as one line: the messages of the cause chain joined by `: `,
/// skipping a cause whose text the previous message already contains.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let msg = cause.to_string();
        if msg.is_empty() || out.contains(&msg) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(msg.trim());
    }
    out.replace('\n', " ")
}

/// The exit code for a guest command's status: its code, or 128+N for signal N.
pub fn from_guest(code: Option<i32>, signal: Option<i32>) -> u8 {
    match (code, signal) {
        (_, Some(sig)) if (1..=127).contains(&sig) => 128 + sig as u8,
        (Some(c), _) => (c & 0xff) as u8,
        _ => FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_status_mapping() {
        assert_eq!(from_guest(Some(0), None), 0);
        assert_eq!(from_guest(Some(7), None), 7);
        assert_eq!(from_guest(Some(256 + 3), None), 3);
        assert_eq!(from_guest(None, Some(9)), 137);
        assert_eq!(from_guest(None, Some(15)), 143);
        assert_eq!(from_guest(None, None), FAILED);
    }

    #[test]
    fn coded_errors_classify_through_context() {
        let e = anyhow::Error::from(Coded {
            code: REFUSED,
            message: "no".into(),
        })
        .context("resolving the spec");
        assert_eq!(classify(&e), REFUSED);
        assert_eq!(classify(&anyhow::anyhow!("boom")), FAILED);
        assert_eq!(classify(&usage("bad")), USAGE);
    }

    #[test]
    fn one_line_joins_causes() {
        let e = failed("inner").context("outer");
        assert_eq!(one_line(&e), "outer: inner");
    }
}
