//! A session's tree state for a snapshot: every inode the guest holds (its node id, the
//! directory it was first looked up in and the name, its host identity and lookup count) and
//! every open handle, and how a restore rebuilds them.
//!
//! The guest kernel keeps node ids and handles across a snapshot; a restored server must
//! answer for the same ones. [`Fs::restore`] resolves each inode again, by name beneath its
//! restored parent (`openat2`, never a path string), and keeps it only if it is the same host
//! inode (`st_dev`, `st_ino`) it was: a tree that changed under a snapshot is refused, naming
//! the path, never served as something else. A saved state is hostile input (the snapshot's
//! file): counts are capped by the limits, names checked as a `LOOKUP`'s, parents must come
//! first, ids must be new.

use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};

use super::{Fs, Handle, Kind, ROOT_ID, key_of, open_to_read};
use crate::sys;

/// One inode of a saved session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedInode {
    /// Its node id.
    pub nodeid: u64,
    /// The directory it was first looked up in.
    pub parent: u64,
    /// Its name there.
    pub name: Vec<u8>,
    /// Host `st_dev`.
    pub dev: u64,
    /// Host `st_ino`.
    pub ino: u64,
    /// The guest's lookup count.
    pub nlookup: u64,
}

/// One open handle of a saved session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedHandle {
    /// The handle.
    pub fh: u64,
    /// Its inode.
    pub nodeid: u64,
    /// Opened with `OPENDIR`.
    pub dir: bool,
}

/// The tree's part of a saved session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsState {
    /// The next node id to give.
    pub next_node: u64,
    /// The next handle to give.
    pub next_fh: u64,
    /// Every inode but the pinned ones, parents before children.
    pub inodes: Vec<SavedInode>,
    /// Every open handle.
    pub handles: Vec<SavedHandle>,
}

/// Why a saved session cannot be restored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RestoreError {
    /// More of something than the server's caps allow.
    #[error("{count} {what} (at most {max})")]
    TooMany {
        /// Inodes, handles or mappings.
        what: &'static str,
        /// How many were saved.
        count: usize,
        /// The cap.
        max: usize,
    },
    /// An entry that cannot be what the server ever saved.
    #[error("invalid {what} {id}")]
    Invalid {
        /// What kind of entry.
        what: &'static str,
        /// Its id.
        id: u64,
    },
    /// A saved path that no longer resolves beneath the share.
    #[error("{path}: {errno} (the mount changed since the snapshot)")]
    Gone {
        /// The path in the share.
        path: String,
        /// The cause.
        errno: Errno,
    },
    /// A saved path that now names another file.
    #[error("{path} is another file than when the snapshot was taken")]
    Changed {
        /// The path in the share.
        path: String,
    },
    /// A DAX range that cannot be mapped again.
    #[error("DAX range at {moffset:#x}: {errno}")]
    Map {
        /// Window offset.
        moffset: u64,
        /// The cause.
        errno: Errno,
    },
}

fn invalid(what: &'static str, id: u64) -> RestoreError {
    RestoreError::Invalid { what, id }
}

/// A name a `LOOKUP` would accept.
fn valid_name(n: &[u8]) -> bool {
    !n.is_empty()
        && n.len() <= crate::abi::NAME_MAX
        && !n.contains(&b'/')
        && n != b"."
        && n != b".."
        && !n.contains(&0)
}

impl Fs {
    /// The tree's state: every inode but the pinned ones (parents first: node ids grow) and
    /// every handle.
    pub fn save(&self) -> FsState {
        let mut inodes: Vec<SavedInode> = self
            .inodes
            .iter()
            .filter(|(_, i)| !i.pinned)
            .map(|(&nodeid, i)| SavedInode {
                nodeid,
                parent: i.parent,
                name: i.name.clone(),
                dev: i.key.0,
                ino: i.key.1,
                nlookup: i.nlookup,
            })
            .collect();
        inodes.sort_by_key(|i| i.nodeid);
        let mut handles: Vec<SavedHandle> = self
            .handles
            .iter()
            .map(|(&fh, h)| SavedHandle {
                fh,
                nodeid: h.nodeid,
                dir: h.dir,
            })
            .collect();
        handles.sort_by_key(|h| h.fh);
        FsState {
            next_node: self.next_node,
            next_fh: self.next_fh,
            inodes,
            handles,
        }
    }

    /// The path of inode `node` in the share (for messages).
    fn path_of(&self, parent: u64, name: &[u8]) -> String {
        let mut parts = vec![String::from_utf8_lossy(name).into_owned()];
        let mut at = parent;
        // Bounded: each step goes to a strictly older inode.
        while let Some(i) = self.inodes.get(&at).filter(|i| !i.pinned) {
            parts.push(String::from_utf8_lossy(&i.name).into_owned());
            at = i.parent;
        }
        parts.reverse();
        parts.join("/")
    }

    /// Rebuilds a saved tree into this freshly opened one (see the module docs).
    pub fn restore(&mut self, state: &FsState) -> Result<(), RestoreError> {
        let limits = self.limits;
        let max_inodes = limits.max_inodes.saturating_sub(self.inodes.len());
        if state.inodes.len() > max_inodes {
            return Err(RestoreError::TooMany {
                what: "inodes",
                count: state.inodes.len(),
                max: max_inodes,
            });
        }
        if state.handles.len() > limits.max_handles {
            return Err(RestoreError::TooMany {
                what: "handles",
                count: state.handles.len(),
                max: limits.max_handles,
            });
        }
        let first = self.next_node;
        for s in &state.inodes {
            let fresh = s.nodeid >= first
                && s.nodeid < state.next_node
                && !self.inodes.contains_key(&s.nodeid);
            let parent_ok = s.parent < s.nodeid
                && self
                    .inodes
                    .get(&s.parent)
                    .is_some_and(|p| p.kind == Kind::Dir);
            if !fresh || !parent_ok || !valid_name(&s.name) || s.nlookup == 0 {
                return Err(invalid("inode", s.nodeid));
            }
            let path = || self.path_of(s.parent, &s.name);
            let dir_fd = self.inodes[&s.parent].fd.clone();
            let gone = |errno| RestoreError::Gone {
                path: path(),
                errno,
            };
            let path_fd =
                sys::open_beneath(dir_fd.as_fd(), &s.name, OFlag::O_PATH).map_err(gone)?;
            let st = sys::stat(path_fd.as_fd()).map_err(gone)?;
            if key_of(&st) != (s.dev, s.ino) || self.by_key.contains_key(&key_of(&st)) {
                return Err(RestoreError::Changed { path: path() });
            }
            let (fd, readable) = open_to_read(dir_fd.as_fd(), &s.name, path_fd, &st);
            self.insert(s.nodeid, s.parent, &s.name, fd, readable, &st, s.nlookup);
        }
        self.next_node = state.next_node.max(first);
        for h in &state.handles {
            let ino = self
                .inodes
                .get(&h.nodeid)
                .filter(|_| h.fh > 0 && h.fh < state.next_fh && !self.handles.contains_key(&h.fh))
                .ok_or(invalid("handle", h.fh))?;
            let kind_ok = match h.dir {
                true => matches!(ino.kind, Kind::Dir | Kind::SingleFileRoot),
                false => ino.kind == Kind::File,
            };
            if !kind_ok || !ino.readable {
                return Err(invalid("handle", h.fh));
            }
            let handle = Handle {
                nodeid: h.nodeid,
                fd: ino.fd.clone(),
                dir: h.dir,
            };
            self.handles.insert(h.fh, handle);
        }
        self.next_fh = state.next_fh.max(self.next_fh);
        debug_assert!(self.inodes.contains_key(&ROOT_ID));
        Ok(())
    }
}
