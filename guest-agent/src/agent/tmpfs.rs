//! `MountTmpfs`: a size-bounded tmpfs the runtime mounts at a guest directory (a container's
//! `emptyDir` volume or `tmpfs` mount), done by the agent itself: an image need not have
//! `mount`, and its processes need not be root.
//!
//! The directory is created confined below the agent's root like `MakeDirs` (no symlink
//! leads out), and the tmpfs is mounted on the opened directory itself
//! (`/proc/self/fd/N`), so a path swapped after the check cannot redirect it. Only an agent
//! that is PID 1 mounts: a host-side agent (the tests') never touches the host's mounts.

use std::ffi::CString;
use std::os::fd::AsRawFd;

use super::Agent;
use super::files::{self, FileError};
use super::sys::fs as sys;
use vm_agent_protocol::protocol::{ErrorKind, MAX_TMPFS_BYTES};

/// The smallest tmpfs mounted (one page).
const MIN_TMPFS_BYTES: u64 = 4096;

/// Why a tmpfs was not mounted.
#[derive(Debug, thiserror::Error)]
pub enum TmpfsError {
    #[error("mounting a tmpfs needs the agent to be PID 1")]
    NotPid1,
    #[error("tmpfs size {0} is not in {MIN_TMPFS_BYTES}..={MAX_TMPFS_BYTES} bytes")]
    Size(u64),
    #[error("a tmpfs is not mounted on /")]
    Root,
    #[error(transparent)]
    Path(#[from] FileError),
    #[error("mount tmpfs on {path:?}")]
    Mount {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl TmpfsError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            TmpfsError::NotPid1 => ErrorKind::Unsupported,
            TmpfsError::Size(_) | TmpfsError::Root => ErrorKind::BadRequest,
            TmpfsError::Path(e) => e.kind(),
            TmpfsError::Mount { .. } => ErrorKind::Io,
        }
    }
}

/// Mounts a tmpfs of `size_bytes` at the absolute guest directory `path` (see the module
/// docs).
pub fn mount_tmpfs(agent: &Agent, path: &str, size_bytes: u64) -> Result<(), TmpfsError> {
    if !agent.is_pid1() {
        return Err(TmpfsError::NotPid1);
    }
    if !(MIN_TMPFS_BYTES..=MAX_TMPFS_BYTES).contains(&size_bytes) {
        return Err(TmpfsError::Size(size_bytes));
    }
    let comps = files::clean(path.trim_start_matches('/'))?;
    if comps.is_empty() {
        return Err(TmpfsError::Root);
    }
    let dir = files::mkdirs(agent.base_fd(), &comps)?;
    let target = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let mount_err = |source| TmpfsError::Mount {
        path: path.into(),
        source,
    };
    let cstr =
        |s: &str| CString::new(s).map_err(|_| TmpfsError::Path(FileError::BadPath(path.into())));
    let data = format!("size={size_bytes},mode=1777");
    sys::mount(
        &cstr("tmpfs")?,
        &cstr(&target)?,
        Some(&cstr("tmpfs")?),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&cstr(&data)?),
    )
    .map_err(mount_err)?;
    tracing::info!(path, size_bytes, "tmpfs mounted");
    Ok(())
}
