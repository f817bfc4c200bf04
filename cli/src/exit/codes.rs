//! The exit codes of the `vm` binary and the one mapping from an error's class to them
//! ([`code`]). Free of the rest of the CLI, so the shim's test of every class through every
//! front end compiles this file as it is (`shim/src/error.rs`).

use vm_sandbox::Class;

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
/// The guest command cannot be executed (docker/podman's code for it).
pub const NOT_EXECUTABLE: u8 = 126;
/// The guest command was not found (docker/podman's code for it).
pub const COMMAND_NOT_FOUND: u8 = 127;
/// Interrupted by SIGINT/SIGTERM.
pub const INTERRUPTED: u8 = 130;

/// The exit code of an error of class `class`.
pub fn code(class: Class) -> u8 {
    match class {
        Class::Usage | Class::Path => USAGE,
        Class::Refused | Class::Forbidden => REFUSED,
        Class::NoDriver => NO_DRIVER,
        Class::WallExpired => TIMEOUT,
        Class::CommandNotFound => COMMAND_NOT_FOUND,
        Class::NotExecutable => NOT_EXECUTABLE,
        Class::NotFound
        | Class::NotRunning
        | Class::Paused
        | Class::BootFailed
        | Class::GuestError
        | Class::Busy
        | Class::ServeFailed
        | Class::Image
        | Class::Unsupported
        | Class::Internal => FAILED,
    }
}
