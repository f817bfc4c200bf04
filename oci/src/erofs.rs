//! The flattened tree as one read-only erofs image, made by `mkfs.erofs` (erofs-utils).
//!
//! Uncompressed: the guest kernel is built without `CONFIG_EROFS_FS_ZIP`. Owners, modes,
//! mtimes, hardlinks and xattrs come from the tree. The child keeps only
//! `CAP_DAC_READ_SEARCH` (see [`crate::sys::caps`]).

use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

use thiserror::Error;

use crate::sys::caps;

/// `mkfs.erofs` could not make the image.
#[derive(Debug, Error)]
pub enum ErofsError {
    #[error("running mkfs.erofs (install erofs-utils)")]
    Spawn(#[source] io::Error),
    #[error("mkfs.erofs failed ({status}): {stderr}")]
    Failed { status: String, stderr: String },
}

/// Builds `out` from the directory `tree` (owners, modes and xattrs as in the tree).
pub fn build(tree: &Path, out: &Path) -> Result<(), ErofsError> {
    let mut cmd = Command::new("mkfs.erofs");
    cmd.arg("--quiet")
        .arg("-U00000000-0000-0000-0000-000000000000")
        .arg(out)
        .arg(tree)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    caps::bound_child(&mut cmd, caps::CAP_DAC_READ_SEARCH);
    let output = cmd.output().map_err(ErofsError::Spawn)?;
    if !output.status.success() {
        let text = String::from_utf8_lossy(&output.stderr);
        let tail: String = text.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(ErofsError::Failed {
            status: output.status.to_string(),
            stderr: tail,
        });
    }
    Ok(())
}
