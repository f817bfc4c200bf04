//! A session as a snapshot keeps it ([`SessionState`]) and how a fresh server takes it back:
//! the tree ([`crate::fs::FsState`]: node ids and handles, each path resolved again and
//! checked) and the DAX window's mapped chunks, mapped again from the restored inodes.

use std::os::fd::AsFd;

use super::Server;
use crate::dax;
use crate::fs::{FsState, Kind, RestoreError};

/// One 2 MiB chunk of the DAX window mapping a file range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChunkMapping {
    /// Window offset (a multiple of 2 MiB).
    pub moffset: u64,
    /// The inode whose file is mapped.
    pub nodeid: u64,
    /// File offset.
    pub foffset: u64,
    /// Bytes of file in the chunk (page-aligned, at most 2 MiB; the rest is zero pages).
    pub file_len: u64,
}

/// A session as a snapshot keeps it: whether `INIT` was answered, the tree, the DAX window.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionState {
    /// A session is open.
    pub open: bool,
    /// Inodes and handles.
    pub fs: FsState,
    /// The window's mapped chunks.
    pub mappings: Vec<ChunkMapping>,
}

impl Server {
    /// The session as a snapshot keeps it.
    pub fn save(&self) -> SessionState {
        SessionState {
            open: self.session,
            fs: self.fs.save(),
            mappings: self.mappings.values().copied().collect(),
        }
    }

    /// Rebuilds a saved session into this fresh server (its tree resolved again and checked,
    /// its DAX chunks mapped again): the guest's node ids, handles and window stay valid.
    pub fn restore(&mut self, state: &SessionState) -> Result<(), RestoreError> {
        self.fs.restore(&state.fs)?;
        self.session = state.open;
        let size = self.dax.as_ref().map_or(0, |d| d.size());
        let max = usize::try_from(size / dax::DAX_ALIGN).unwrap_or(usize::MAX);
        if state.mappings.len() > max {
            return Err(RestoreError::TooMany {
                what: "DAX mappings",
                count: state.mappings.len(),
                max,
            });
        }
        for m in &state.mappings {
            let bad = || RestoreError::Invalid {
                what: "DAX mapping",
                id: m.moffset,
            };
            let page = dax::PAGE;
            let shape_ok = dax::check_range(size, m.moffset, dax::DAX_ALIGN).is_ok()
                && m.file_len > 0
                && m.file_len <= dax::DAX_ALIGN
                && m.file_len.is_multiple_of(page)
                && m.foffset.is_multiple_of(page)
                && !self.mappings.contains_key(&m.moffset);
            let ino = self.fs.inode(m.nodeid).map_err(|_| bad())?;
            if !shape_ok || ino.kind != Kind::File || !ino.readable {
                return Err(bad());
            }
            let fd = ino.fd.clone();
            let window = self.dax.as_mut().ok_or_else(bad)?;
            let map_err = |errno| RestoreError::Map {
                moffset: m.moffset,
                errno,
            };
            window.unmap(m.moffset, dax::DAX_ALIGN).map_err(map_err)?;
            dax::place(
                window.as_mut(),
                m.moffset,
                m.file_len,
                fd.as_fd(),
                m.foffset,
            )
            .map_err(map_err)?;
            self.mappings.insert(m.moffset, *m);
        }
        Ok(())
    }
}
