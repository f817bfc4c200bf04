//! The files a restore reads, opened as the invoking user's own before the jail: the snapshot
//! directory without following a link, `vmstate` and `memory` beneath it with `openat2` (no
//! link anywhere), each checked by `fstat` on its descriptor (`vm_sys::private`): a real
//! directory and regular files, owned by this process's effective uid and writable by nobody
//! else. Whoever can write the memory file writes the guest's code, and the state file its
//! registers; the launcher checks the directory before it starts this process, and this check
//! is on the very descriptors the restore then uses.
//!
//! The state file's bytes are read here (bounded by [`format::MAX_STATE_BYTES`], its size checked on
//! the descriptor first) but not decoded: decoding is hostile-input parsing and waits for the
//! jail and the restore thread's filter ([`crate::snapshot::PendingRestore`]).

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use vm_sys::private;

use super::format;
use super::{MEMORY_FILE, STATE_FILE, SnapshotError};

/// A snapshot's files, opened and checked ([`SnapshotFiles::open`]).
#[derive(Debug)]
pub struct SnapshotFiles {
    /// The directory.
    pub(crate) dir: PathBuf,
    /// The state file's path (for messages) and bytes, undecoded.
    pub(crate) state_path: PathBuf,
    pub(crate) state: Vec<u8>,
    /// The memory file's path (for messages) and descriptor.
    pub(crate) memory_path: PathBuf,
    pub(crate) memory: File,
}

impl SnapshotFiles {
    /// Opens the snapshot in `dir` (see the module docs), refusing by name a directory or file
    /// that is a link, another kind of file, another user's, or writable by group or others.
    pub fn open(dir: &Path) -> Result<SnapshotFiles, SnapshotError> {
        let owner = private::euid();
        let refused = |path: PathBuf| {
            move |source| match source {
                private::Refusal::Open(e) => SnapshotError::Io {
                    what: "opening",
                    path,
                    source: e.into(),
                },
                source => SnapshotError::NotPrivate {
                    path,
                    owner,
                    source,
                },
            }
        };
        let fd = private::open_dir(dir, owner).map_err(refused(dir.to_path_buf()))?;
        let open = |name: &str| {
            let path = dir.join(name);
            private::open_file(fd.as_fd(), OsStr::new(name), owner)
                .map(|f| (f, path.clone()))
                .map_err(refused(path))
        };
        let (state_file, state_path) = open(STATE_FILE)?;
        let (memory, memory_path) = open(MEMORY_FILE)?;
        let state = format::read_bounded(state_file, &state_path).map_err(|source| {
            SnapshotError::State {
                path: state_path.clone(),
                source,
            }
        })?;
        Ok(SnapshotFiles {
            dir: dir.to_path_buf(),
            state_path,
            state,
            memory_path,
            memory,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::format::{MAX_STATE_BYTES, StateError};
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn snapshot_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        chmod(d.path(), 0o700);
        for name in [STATE_FILE, MEMORY_FILE] {
            std::fs::write(d.path().join(name), b"bytes").unwrap();
            chmod(&d.path().join(name), 0o600);
        }
        d
    }

    fn refused_path(e: SnapshotError) -> PathBuf {
        match e {
            SnapshotError::NotPrivate { path, .. } => path,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn private_files_open_and_every_tampering_is_refused_by_name() {
        let d = snapshot_dir();
        let files = SnapshotFiles::open(d.path()).unwrap();
        assert_eq!(files.state, b"bytes");
        assert_eq!(files.memory_path, d.path().join(MEMORY_FILE));

        chmod(&d.path().join(MEMORY_FILE), 0o666);
        let e = SnapshotFiles::open(d.path()).unwrap_err();
        assert!(e.to_string().contains("writable by no one else"), "{e}");
        assert_eq!(refused_path(e), d.path().join(MEMORY_FILE));
        chmod(&d.path().join(MEMORY_FILE), 0o600);

        chmod(d.path(), 0o770);
        assert_eq!(
            refused_path(SnapshotFiles::open(d.path()).unwrap_err()),
            d.path()
        );
        chmod(d.path(), 0o700);

        let state = d.path().join(STATE_FILE);
        std::fs::rename(&state, d.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", &state).unwrap();
        assert_eq!(
            refused_path(SnapshotFiles::open(d.path()).unwrap_err()),
            state
        );
    }

    #[test]
    fn an_oversized_state_file_is_refused_before_it_is_read() {
        let d = snapshot_dir();
        let f = File::options()
            .write(true)
            .open(d.path().join(STATE_FILE))
            .unwrap();
        f.set_len(MAX_STATE_BYTES + 1).unwrap();
        assert!(matches!(
            SnapshotFiles::open(d.path()),
            Err(SnapshotError::State {
                source: StateError::TooLarge(n),
                ..
            }) if n == MAX_STATE_BYTES + 1
        ));
    }
}
