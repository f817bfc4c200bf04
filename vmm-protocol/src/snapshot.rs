//! Snapshots through the `vm-vmm` process: the [`SNAPSHOT`] and [`SNAPSHOT_STOP`] control
//! lines and their reply.
//!
//! The command names no path: the VMM writes into the one directory its launcher configured
//! ([`ProcessConfig::snapshot_dir`](crate::ProcessConfig::snapshot_dir)), so whatever the
//! control channel says cannot choose where. The reply is one line on stderr:
//! [`SNAPSHOT_PREFIX`] (a control byte no log record can hold, as for metrics) and a
//! [`SnapshotReply`] as JSON. A jailed VMM writes its files as the jail's uid; the launcher
//! takes them back with [`hand_back`] once the VMM has exited.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::process::{SNAPSHOT, SNAPSHOT_STOP};

/// The start of a snapshot reply line on the log stream.
pub const SNAPSHOT_PREFIX: &[u8] = b"\x1esnapshot ";

/// What the VM does once its snapshot is written (on an error it always resumes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterSnapshot {
    /// Run on.
    Resume,
    /// Stop; the process then exits with [`crate::ExitKind::Ended`].
    Stop,
}

/// The reply to a snapshot command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotReply {
    /// Whether the snapshot was written.
    pub ok: bool,
    /// Why not (the error chain), when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The directory written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Bytes of the state file.
    #[serde(default)]
    pub state_bytes: u64,
    /// Bytes of guest RAM (the memory file's length).
    #[serde(default)]
    pub memory_bytes: u64,
    /// Bytes of RAM written (non-zero pages).
    #[serde(default)]
    pub memory_written: u64,
    /// Microseconds from the pause request until every vCPU was parked.
    #[serde(default)]
    pub pause_us: u64,
    /// Microseconds from the pause request until both files were written.
    #[serde(default)]
    pub took_us: u64,
}

impl SnapshotReply {
    /// A refusal saying `error`.
    pub fn refused(error: String) -> Self {
        SnapshotReply {
            error: Some(error),
            ..SnapshotReply::default()
        }
    }

    /// The reply to a line that starts like a snapshot command without being one (an
    /// argument, a typo, an over-long line): refused, rather than ignored, so the launcher is
    /// not left waiting.
    pub fn unknown_command() -> Self {
        Self::refused(format!(
            "unknown snapshot command: `{SNAPSHOT}` or `{SNAPSHOT_STOP}`, alone on a line"
        ))
    }
}

/// The reply line for `reply`: [`SNAPSHOT_PREFIX`], one JSON object, a newline.
pub fn reply_line(reply: &SnapshotReply) -> Vec<u8> {
    let mut line = SNAPSHOT_PREFIX.to_vec();
    if serde_json::to_writer(&mut line, reply).is_err() {
        line.truncate(SNAPSHOT_PREFIX.len());
        line.extend_from_slice(br#"{"ok":false,"error":"reply not encodable"}"#);
    }
    line.push(b'\n');
    line
}

/// The reply in a line (with or without its newline); `None` for any other line.
pub fn parse_reply_line(line: &[u8]) -> Option<SnapshotReply> {
    let json = line.strip_prefix(SNAPSHOT_PREFIX)?;
    serde_json::from_slice(json.strip_suffix(b"\n").unwrap_or(json)).ok()
}

/// What a control line (its trailing whitespace trimmed) asks for: `None` when it is no
/// snapshot command at all.
pub fn parse_command(line: &[u8]) -> Option<AfterSnapshot> {
    match line {
        l if l == SNAPSHOT.as_bytes() => Some(AfterSnapshot::Resume),
        l if l == SNAPSHOT_STOP.as_bytes() => Some(AfterSnapshot::Stop),
        _ => None,
    }
}

/// Why [`hand_back`] could not give a snapshot directory back.
#[derive(Debug, thiserror::Error)]
#[error("cannot give {} back to uid {uid}", .path.display())]
pub struct HandBackError {
    /// The directory or the file.
    pub path: PathBuf,
    /// The uid it was to go to (the caller's effective uid).
    pub uid: u32,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// For the launcher, once a jailed VMM that wrote a snapshot into `dir` has exited: gives the
/// directory (mode `0700`) and every entry in it, none followed if it is a link, back to this
/// process's effective uid and gid. The jail handed the directory to the VM's own uid, and
/// the files the VMM created are that uid's: `JAIL_ID_BASE` plus a pid, which a later VM
/// may get again, and would then own the snapshot to rewrite. Without a jail (or not root)
/// everything is already the caller's and nothing changes.
pub fn hand_back(dir: &Path) -> Result<(), HandBackError> {
    use nix::fcntl::{AtFlags, OFlag, open};
    use nix::sys::stat::{Mode, fchmod};
    use nix::unistd::{fchown, fchownat, getegid, geteuid};
    use std::os::fd::AsFd;
    let (uid, gid) = (geteuid(), getegid());
    let fail = |path: PathBuf| {
        move |source: io::Error| HandBackError {
            path,
            uid: uid.as_raw(),
            source,
        }
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = open(dir, flags, Mode::empty()).map_err(|e| fail(dir.to_path_buf())(e.into()))?;
    for name in vm_sys::private::entries(fd.as_fd()).map_err(fail(dir.to_path_buf()))? {
        fchownat(
            fd.as_fd(),
            name.as_os_str(),
            Some(uid),
            Some(gid),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| fail(dir.join(&name))(e.into()))?;
    }
    fchown(fd.as_fd(), Some(uid), Some(gid)).map_err(|e| fail(dir.to_path_buf())(e.into()))?;
    fchmod(fd.as_fd(), Mode::from_bits_truncate(0o700))
        .map_err(|e| fail(dir.to_path_buf())(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_exact_lines() {
        assert_eq!(parse_command(b"snapshot"), Some(AfterSnapshot::Resume));
        assert_eq!(parse_command(b"snapshot-stop"), Some(AfterSnapshot::Stop));
        for l in [
            &b"snapshot /tmp/x"[..],
            b"snapshot\0",
            b"snapshots",
            b"snapshot-stop x",
        ] {
            assert_eq!(parse_command(l), None);
        }
        let r = SnapshotReply::unknown_command();
        assert!(!r.ok && r.error.unwrap().contains("snapshot-stop"));
    }

    #[test]
    fn replies_round_trip_and_nothing_else_parses() {
        let r = SnapshotReply::refused("no".into());
        let line = reply_line(&r);
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(parse_reply_line(&line), Some(r));
        assert_eq!(parse_reply_line(b"snapshot {\"ok\":true}"), None);
        assert_eq!(parse_reply_line(b"\x1emetrics {}"), None);
    }
}
