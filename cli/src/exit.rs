//! Exit codes of the `vm` binary: the whole table ([`codes`]: each error class's code), the
//! CLI's own coded errors, and rendering an error on one line.
//!
//! `vm exec` (and `vm exec NAME`) exits with the guest command's own status, so the codes
//! `vm` uses for itself sit where a shell already reserves meanings (the same choice
//! `timeout(1)`, `env(1)`, `docker run` and `podman run` make):
//!
//! | code    | meaning                                                                  |
//! |---------|--------------------------------------------------------------------------|
//! | 0–255   | the guest command's exit code (`exec`); a guest signal N gives 128+N     |
//! | 2       | usage error: bad flag, bad value (`--memory 12X`, `-v relative`), bad name |
//! | 124     | the VM's wall lifetime (`--timeout`) expired before the command finished  |
//! | 125     | `vm` itself failed: boot failure, agent error, I/O, unknown VM name       |
//! | 126     | the guest command cannot be executed (as docker/podman); or refused: the spec is invalid or the trust policy forbids it |
//! | 127     | the guest command was not found (as docker/podman); or no driver on this host can contain the work at the requested trust |
//! | 130     | interrupted (Ctrl-C or SIGTERM); the guest command tree was cancelled     |
//!
//! For the guest command itself we follow docker and podman: a program that does not exist
//! exits 127 and one that cannot be executed (no execute permission, not an executable
//! format, a directory) exits 126, with a shell-like line on stderr (`vm: NAME: command not
//! found`, `vm: NAME: cannot execute: REASON`); `vm`'s own failures are 125, as theirs are.
//! Where we differ: docker and podman use 126 and 127 *only* for the command, while `vm`
//! also exits 126 when it refuses the work (invalid spec, trust policy) and 127 when no
//! driver can contain it. Both are "the command did not run, and running it again
//! unchanged will not help", which is what 126/127 tell a script; the `vm: …` line on
//! stderr says which. A guest command that itself exits 124–127 is indistinguishable from
//! these by the number alone.
//!
//! A library error's code is its class's ([`vm_sandbox::classify`]: the class is decided
//! once, in `vm-sandbox`, for the CLI, the Python SDK and the containerd shim alike).

use std::fmt;

mod codes;

pub use codes::*;

/// The text appended to `vm --help`.
pub const HELP_TABLE: &str = "\
Exit status:
  0-255  the guest command's exit code (vm exec); a guest killed by signal N gives 128+N
  2      usage error (bad flag or value, bad VM name)
  124    the VM's wall lifetime (--timeout) expired
  125    vm itself failed (boot failure, agent or I/O error, unknown VM)
  126    the guest command cannot be executed (as docker/podman), or
         refused: invalid spec or forbidden by the trust policy
  127    the guest command was not found (as docker/podman), or
         no driver on this host can contain the work (see `vm drivers`)
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

/// Maps an error to its exit code: a CLI-coded error's own, else its class's
/// ([`vm_sandbox::classify`], [`code`]).
pub fn classify(err: &anyhow::Error) -> u8 {
    if let Some(c) = err.chain().find_map(|c| c.downcast_ref::<Coded>()) {
        return c.code;
    }
    code(vm_sandbox::classify(err.as_ref()).class)
}

/// Renders an error as one line: the messages of the cause chain joined by `: `,
/// skipping a cause whose text the previous message already contains. A guest command
/// that was not found or cannot be executed is told the way a shell tells it
/// (`NAME: command not found`), without the layers it came through.
pub fn one_line(err: &anyhow::Error) -> String {
    if let Some(line) = vm_sandbox::classify(err.as_ref()).command_line {
        return line;
    }
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

    /// Library errors wrapped in `SandboxError` keep their cause in the chain, so the exit
    /// code comes from the cause (and the one-line message names it).
    #[test]
    fn sandbox_errors_classify_by_their_cause() {
        use vm_sandbox::{SandboxError, SelectError};
        use vm_spec::{AdmitError, Containment, Trust};
        let select = SandboxError::Select(SelectError::Unknown {
            name: "nope".into(),
            known: "kvm, tcg".into(),
        });
        let err = anyhow::Error::new(select).context("booting");
        assert_eq!(classify(&err), USAGE);
        assert!(
            one_line(&err).contains("\"nope\" is not registered"),
            "{}",
            one_line(&err)
        );

        let admit = SandboxError::Admit(AdmitError::Forbidden {
            tier: "tcg".into(),
            trust: Trust::Untrusted,
            provided: Containment::UserKernel,
            required: Containment::MicroVm,
            allowed_by: Some("--allow-emulation"),
        });
        let err = anyhow::Error::new(admit);
        assert_eq!(classify(&err), REFUSED);
        assert!(one_line(&err).contains("--allow-emulation"));
    }

    /// A guest command that was not found or cannot be executed: docker/podman's codes and
    /// a shell-like line, however deep in the chain the agent's verdict is.
    #[test]
    fn guest_command_not_found_or_not_executable() {
        use vm_sandbox::SandboxError;
        use vm_sandbox::agent::{ClientError, ErrorKind};
        use vm_sandbox::drivers::MachineError;
        let wrapped = |kind, message: &str| {
            let agent = ClientError::Agent {
                kind,
                message: message.into(),
            };
            let machine = MachineError::Agent(agent);
            anyhow::Error::new(SandboxError::Machine {
                op: "exec stream",
                source: machine,
            })
            .context("starting the command in the guest")
        };
        let err = wrapped(ErrorKind::CommandNotFound, "nosuch: command not found");
        assert_eq!(classify(&err), COMMAND_NOT_FOUND);
        assert_eq!(classify(&err), 127);
        assert_eq!(one_line(&err), "nosuch: command not found");
        let msg = "/etc/passwd: cannot execute: Permission denied (os error 13)";
        let err = wrapped(ErrorKind::NotExecutable, msg);
        assert_eq!(classify(&err), NOT_EXECUTABLE);
        assert_eq!(classify(&err), 126);
        assert_eq!(one_line(&err), msg);
        // Any other agent error is `vm` failing, with the whole chain.
        let err = wrapped(ErrorKind::Spawn, "working directory /x: No such file");
        assert_eq!(classify(&err), FAILED);
        assert!(one_line(&err).starts_with("starting the command in the guest: "));
    }
}
