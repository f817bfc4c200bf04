//! Snapshots through the `vm-vmm` process: the [`SNAPSHOT`](super::SNAPSHOT) and
//! [`SNAPSHOT_STOP`](super::SNAPSHOT_STOP) control commands and their reply.
//!
//! The command names no path: the VMM writes into the one directory its launcher configured
//! ([`ProcessConfig::snapshot_dir`](super::ProcessConfig::snapshot_dir)), which
//! [`check_snapshot_dir`] accepts only as an absolute path to a real directory (not a link)
//! of mode `0700`; in the jail it is bound read-write at its own path and handed to the
//! jail's uid, so a jailed VMM can write nowhere else, and whatever the control channel says
//! cannot choose where. A snapshot is written once: its files are created `O_EXCL`, so a
//! second command into the same directory is refused (the launcher moves the snapshot away,
//! or starts a VMM with a fresh directory).
//!
//! The reply is one line on stderr: [`SNAPSHOT_PREFIX`] (a control byte no log record can
//! hold, as for metrics) and a [`SnapshotReply`] as JSON.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{SNAPSHOT, SNAPSHOT_STOP};
use crate::RunningVm;
use crate::snapshot::{AfterSnapshot, SnapshotInfo, format::MAX_STATE_BYTES};

/// The start of a snapshot reply line on the log stream.
pub const SNAPSHOT_PREFIX: &[u8] = b"\x1esnapshot ";

/// Why a configured snapshot or restore directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// Not an absolute path, or it holds a NUL byte.
    #[error("{0} is not an absolute path")]
    NotAbsolute(PathBuf),
    /// It cannot be read.
    #[error("{0}")]
    Stat(PathBuf, #[source] io::Error),
    /// Not a directory (a symbolic link is refused too).
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    /// Group or others have access.
    #[error("{0} has mode {1:o}, must be 0700")]
    Mode(PathBuf, u32),
}

fn absolute(dir: &Path) -> Result<(), DirError> {
    let nul = dir.as_os_str().as_encoded_bytes().contains(&0);
    if !dir.is_absolute() || nul {
        return Err(DirError::NotAbsolute(dir.to_path_buf()));
    }
    Ok(())
}

/// Checks a snapshot directory of the configuration (see the module docs).
pub fn check_snapshot_dir(dir: &Path) -> Result<(), DirError> {
    absolute(dir)?;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| DirError::Stat(dir.into(), e))?;
    if !meta.is_dir() {
        return Err(DirError::NotADirectory(dir.into()));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(DirError::Mode(dir.into(), mode));
    }
    Ok(())
}

/// Checks a restore directory of the configuration (what it holds, `Vm::restore` checks).
pub fn check_restore_dir(dir: &Path) -> Result<(), DirError> {
    absolute(dir)
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

/// The largest file a VMM with `mem_mib` of guest RAM writes for a snapshot: the memory file
/// (the RAM) or the state file (at most [`MAX_STATE_BYTES`]); its jail's `RLIMIT_FSIZE`.
pub fn max_file_bytes(mem_mib: u32) -> u64 {
    (u64::from(mem_mib) << 20) + MAX_STATE_BYTES
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
    fn refused(error: String) -> Self {
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

    fn written(info: &SnapshotInfo, dir: &Path) -> Self {
        SnapshotReply {
            ok: true,
            error: None,
            dir: Some(dir.to_path_buf()),
            state_bytes: info.state_bytes,
            memory_bytes: info.memory_bytes,
            memory_written: info.memory_written,
            pause_us: info.pause_latency.as_micros() as u64,
            took_us: info.took.as_micros() as u64,
        }
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

/// Runs a snapshot command on the control thread and returns its reply.
pub fn handle(vm: &RunningVm, dir: Option<&Path>, then: AfterSnapshot) -> SnapshotReply {
    let Some(dir) = dir else {
        return SnapshotReply::refused(
            "this VMM is not configured for snapshots (no snapshot_dir)".into(),
        );
    };
    match vm.snapshot(dir, then) {
        Ok(info) => SnapshotReply::written(&info, dir),
        Err(e) => {
            let chain = vm_error_chain::error_chain(&e);
            tracing::error!("snapshot: {chain}");
            SnapshotReply::refused(chain)
        }
    }
}

/// Sends `reply` on stderr (errors ignored, as for every log write).
pub fn write_reply(reply: &SnapshotReply) {
    crate::logger::writer::write_raw_stderr(&reply_line(reply));
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

    #[test]
    fn only_a_private_absolute_directory_is_accepted() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("snap");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        check_snapshot_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(matches!(
            check_snapshot_dir(&dir),
            Err(DirError::Mode(_, 0o750))
        ));
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(matches!(
            check_snapshot_dir(&link),
            Err(DirError::NotADirectory(_))
        ));
        assert!(matches!(
            check_snapshot_dir(Path::new("rel")),
            Err(DirError::NotAbsolute(_))
        ));
        assert!(matches!(
            check_restore_dir(Path::new("/a\0b")),
            Err(DirError::NotAbsolute(_))
        ));
        assert!(matches!(
            check_snapshot_dir(&tmp.path().join("absent")),
            Err(DirError::Stat(..))
        ));
        assert_eq!(max_file_bytes(16), (16 << 20) + MAX_STATE_BYTES);
    }
}
