//! A snapshot directory read as its user's own. Whoever can write a snapshot's files decides
//! what a restore runs: `snapshot.json` holds the spec (mounts, environment, user, limits)
//! and the memory file the guest's code. A SHA-256 in a file is a checksum, not an
//! authentication, so the only defence is who may write them: the directory and every entry
//! in it must belong to the user restoring (the effective uid) and be writable by nobody
//! else, and no entry may be a link or anything but a regular file.
//!
//! [`OpenSnapshot::open`] checks that by descriptor (`vm_sys::private`: the directory opened
//! without following a link, each entry examined with `fstatat` without following it),
//! before anything boots, and refuses naming the file; the record and the token are then read
//! through descriptors opened beneath the directory (`openat2`, no link anywhere) and checked
//! again, so what was checked is what is read. The backend opens its own files the same way
//! (for kvm, `vmm::snapshot::files`).

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use vm_agent_protocol::token::AgentToken;
use vm_sys::private::{self, Kind};

use crate::snapshots::{
    MAX_RECORD_BYTES, RECORD_FILE, RECORD_VERSION, SnapshotError, SnapshotRecord, TOKEN_FILE,
};

/// A snapshot directory opened and checked ([`OpenSnapshot::open`]).
#[derive(Debug)]
pub struct OpenSnapshot {
    dir: OwnedFd,
    path: PathBuf,
    owner: u32,
}

impl OpenSnapshot {
    /// Opens the snapshot directory `path` and checks it and every entry in it: each must
    /// belong to this process's effective uid and be writable by nobody else, the directory
    /// a real directory and each entry a regular file. Refused naming the first that is not.
    pub fn open(path: &Path) -> Result<OpenSnapshot, SnapshotError> {
        let owner = private::euid();
        let refused = |path: PathBuf| {
            move |why| SnapshotError::NotPrivate {
                path,
                owner,
                source: why,
            }
        };
        let dir = private::open_dir(path, owner).map_err(refused(path.to_path_buf()))?;
        let mut names = private::entries(dir.as_fd()).map_err(|source| SnapshotError::Io {
            what: "listing",
            path: path.to_path_buf(),
            source,
        })?;
        names.sort();
        for name in &names {
            private::check_entry(dir.as_fd(), name, Kind::File, owner)
                .map_err(refused(path.join(name)))?;
        }
        Ok(OpenSnapshot {
            dir,
            path: path.to_path_buf(),
            owner,
        })
    }

    /// The directory's path (as given).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `name` beneath the directory, checked again on its descriptor.
    fn file(&self, name: &str) -> Result<(File, PathBuf), SnapshotError> {
        let path = self.path.join(name);
        match private::open_file(self.dir.as_fd(), OsStr::new(name), self.owner) {
            Ok(f) => Ok((f, path)),
            Err(private::Refusal::Open(e)) => Err(SnapshotError::Io {
                what: "opening",
                path,
                source: e.into(),
            }),
            Err(why) => Err(SnapshotError::NotPrivate {
                path,
                owner: self.owner,
                source: why,
            }),
        }
    }

    /// Reads and checks the record (bounded; another version refused).
    pub fn record(&self) -> Result<SnapshotRecord, SnapshotError> {
        let (f, path) = self.file(RECORD_FILE)?;
        let mut text = Vec::new();
        f.take(MAX_RECORD_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|source| SnapshotError::Io {
                what: "reading",
                path: path.clone(),
                source,
            })?;
        parse_record(&text, path)
    }

    /// Reads the snapshot's agent token.
    pub fn token(&self) -> Result<AgentToken, SnapshotError> {
        let (f, path) = self.file(TOKEN_FILE)?;
        AgentToken::read_from(f, &path).map_err(SnapshotError::Token)
    }
}

/// The record in `text`, read from `path` (bounded by the caller; another version refused).
fn parse_record(text: &[u8], path: PathBuf) -> Result<SnapshotRecord, SnapshotError> {
    if text.len() as u64 > MAX_RECORD_BYTES {
        return Err(SnapshotError::RecordTooLarge(path));
    }
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    let v: Versioned = serde_json::from_slice(text).map_err(|source| SnapshotError::Record {
        path: path.clone(),
        source,
    })?;
    if v.version != RECORD_VERSION {
        return Err(SnapshotError::Version {
            path,
            found: v.version,
        });
    }
    serde_json::from_slice(text).map_err(|source| SnapshotError::Record { path, source })
}

/// Reads and checks the record of the snapshot in `dir`, the directory checked first
/// ([`OpenSnapshot::open`]).
pub fn read_record(dir: &Path) -> Result<SnapshotRecord, SnapshotError> {
    OpenSnapshot::open(dir)?.record()
}
