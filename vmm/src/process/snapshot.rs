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

use crate::RunningVm;
use crate::snapshot::{SnapshotInfo, format::MAX_STATE_BYTES};

pub use vm_vmm_protocol::snapshot::{
    AfterSnapshot, HandBackError, SNAPSHOT_PREFIX, SnapshotReply, hand_back, parse_command,
    parse_reply_line, reply_line,
};

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

/// The largest file a VMM with `mem_mib` of guest RAM writes for a snapshot: the memory file
/// (the RAM) or the state file (at most [`MAX_STATE_BYTES`]); its jail's `RLIMIT_FSIZE`.
pub fn max_file_bytes(mem_mib: u32) -> u64 {
    (u64::from(mem_mib) << 20) + MAX_STATE_BYTES
}

/// Runs a snapshot command on the control thread and returns its reply.
pub fn handle(vm: &RunningVm, dir: Option<&Path>, then: AfterSnapshot) -> SnapshotReply {
    let Some(dir) = dir else {
        return SnapshotReply::refused(
            "this VMM is not configured for snapshots (no snapshot_dir)".into(),
        );
    };
    match vm.snapshot(dir, then) {
        Ok(info) => written(&info, dir),
        Err(e) => {
            let chain = vm_error_chain::error_chain(&e);
            tracing::error!("snapshot: {chain}");
            SnapshotReply::refused(chain)
        }
    }
}

/// The reply for a snapshot written into `dir`.
fn written(info: &SnapshotInfo, dir: &Path) -> SnapshotReply {
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

/// Sends `reply` on stderr (errors ignored, as for every log write).
pub fn write_reply(reply: &SnapshotReply) {
    crate::logger::writer::write_raw_stderr(&reply_line(reply));
}

#[cfg(test)]
mod tests {
    use super::*;

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
