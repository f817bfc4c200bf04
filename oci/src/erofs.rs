//! One read-only erofs image made from a directory tree by `mkfs.erofs` (erofs-utils): the one
//! hardened runner for every tree this workspace packs — an OCI image's flattened layers
//! ([`build`]), a containerd snapshot (`vm_sandbox::SnapshotRoots`) and a host directory given
//! with `-v` (`vm_sandbox::mounts`, [`build_with`] and [`Owners::Root`]).
//!
//! Uncompressed: no decompression work in the guest, whose kernel code may run emulated (TCG).
//! The guest kernel could read lz4 images (`CONFIG_EROFS_FS_ZIP` is on and `images/verify.sh`
//! checks it), but the space saved is not worth the guest CPU. The child runs under
//! `no_new_privs` with only `CAP_DAC_READ_SEARCH` (it must read every file) in its bounding set
//! (see [`crate::sys::caps`]), with stdin empty, stdout discarded and stderr kept for the error.

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

/// Whose files the image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// Owners, modes, mtimes, hardlinks and xattrs as in the tree (an image's layers), with a
    /// fixed UUID so the same tree gives the same bytes.
    Tree,
    /// Every file owned by root and no xattrs (`--all-root -x-1`): a host directory, whose
    /// owners mean nothing in the guest.
    Root,
}

/// Builds `out` from the directory `tree` with the tree's owners ([`Owners::Tree`]).
pub fn build(tree: &Path, out: &Path) -> Result<(), ErofsError> {
    build_with(tree, out, Owners::Tree)
}

/// Builds `out` from the directory `tree`, in the hardened child (see the module docs).
pub fn build_with(tree: &Path, out: &Path, owners: Owners) -> Result<(), ErofsError> {
    let mut cmd = Command::new("mkfs.erofs");
    cmd.arg("--quiet");
    match owners {
        Owners::Tree => cmd.arg("-U00000000-0000-0000-0000-000000000000"),
        Owners::Root => cmd.args(["--all-root", "-x-1"]),
    };
    cmd.arg(out)
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
