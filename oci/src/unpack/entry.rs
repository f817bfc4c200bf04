//! One layer's tar entries applied to the tree, with OCI semantics and no way out.
//!
//! - Paths: a leading `/` is dropped (absolute paths mean the image root), `.` is skipped,
//!   and an entry naming `..` anywhere is refused. Parents are resolved in the tree (see
//!   [`crate::sys::confined`]), so a symlink planted earlier points back into the tree, never out;
//!   missing parents are created `0755 root:root`.
//! - `.wh.NAME` deletes NAME from lower layers; `.wh..wh..opq` empties its directory of
//!   everything lower layers put there (entries of this same layer stay).
//! - Regular files, directories, symlinks, hardlinks (whose target must already be in the
//!   tree) and FIFOs keep mode, owner, mtime and `user.*` xattrs. Setuid/setgid bits are
//!   cleared and device nodes dropped (counted in [`UnpackStats`]); other xattrs
//!   (`security.capability`, `trusted.overlay.*`, …) are not kept.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};

use tar::{Archive, Entry, EntryType};

use super::{UnpackError, UnpackStats};
use crate::limits::Limits;
use crate::sys::confined::{self, at, open_in_root};

const OPAQUE: &[u8] = b".wh..wh..opq";
const WHITEOUT: &[u8] = b".wh.";

/// The state of one layer being applied.
struct Layer<'a> {
    root: BorrowedFd<'a>,
    index: usize,
    /// Paths this layer wrote (an opaque marker keeps these).
    written: HashSet<OsString>,
}

/// Applies every entry of `archive` to the tree at `root`.
pub(super) fn apply_all<R: Read>(
    root: BorrowedFd<'_>,
    index: usize,
    archive: &mut Archive<R>,
    limits: &Limits,
    stats: &mut UnpackStats,
) -> Result<(), UnpackError> {
    let tar_err = |source| UnpackError::Tar {
        layer: index,
        source,
    };
    let mut layer = Layer {
        root,
        index,
        written: HashSet::new(),
    };
    for entry in archive.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        stats.entries += 1;
        if stats.entries > limits.max_entries {
            return Err(UnpackError::TooManyEntries(limits.max_entries));
        }
        layer.apply(&mut entry, stats)?;
    }
    Ok(())
}

/// Deepest path accepted: each entry resolves its parents one prefix at a time, so depth
/// must not be the image's to choose.
const MAX_DEPTH: usize = 128;

/// The normal components of a tar path: `/` and `.` dropped, `..` refused.
fn components(raw: &[u8]) -> Result<Vec<OsString>, &'static str> {
    let mut out = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("\"..\" would escape the image root"),
            _ if out.len() == MAX_DEPTH => return Err("more than 128 directories deep"),
            c => out.push(OsString::from_vec(c.to_vec())),
        }
    }
    Ok(out)
}

fn join(parts: &[OsString]) -> OsString {
    let mut s = OsString::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            s.push("/");
        }
        s.push(p);
    }
    s
}

fn show(raw: &[u8]) -> String {
    String::from_utf8_lossy(&raw[..raw.len().min(256)]).into_owned()
}

impl Layer<'_> {
    fn err(&self, path: &[u8], why: impl Into<String>) -> UnpackError {
        UnpackError::Entry {
            layer: self.index,
            path: show(path),
            why: why.into(),
        }
    }

    fn io(&self, path: &[u8], what: &str, e: io::Error) -> UnpackError {
        self.err(path, format!("{what}: {e}"))
    }

    /// The directory `parts` in the tree, created (0755 root:root) where missing.
    fn dir(&self, raw: &[u8], parts: &[OsString]) -> Result<OwnedFd, UnpackError> {
        let flags = libc::O_PATH | libc::O_DIRECTORY;
        let mut cur = open_in_root(self.root, OsStr::new(""), flags)
            .map_err(|e| self.io(raw, "opening the root", e))?;
        for i in 0..parts.len() {
            let prefix = join(&parts[..=i]);
            let shown = prefix.to_string_lossy().into_owned();
            cur = match open_in_root(self.root, &prefix, flags) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    fs::DirBuilder::new()
                        .mode(0o755)
                        .create(at(cur.as_fd(), &parts[i]))
                        .map_err(|e| match e.kind() {
                            io::ErrorKind::AlreadyExists => self.err(
                                raw,
                                format!("parent {shown} is a symlink to a missing directory"),
                            ),
                            _ => self.io(raw, "creating a parent", e),
                        })?;
                    open_in_root(self.root, &prefix, flags)
                        .map_err(|e| self.io(raw, "opening a parent", e))?
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                    return Err(self.err(raw, format!("parent {shown} is not a directory")));
                }
                Err(e) => return Err(self.io(raw, "resolving a parent", e)),
            };
        }
        Ok(cur)
    }

    fn apply<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        stats: &mut UnpackStats,
    ) -> Result<(), UnpackError> {
        let raw = entry.path_bytes().into_owned();
        let parts = components(&raw).map_err(|why| UnpackError::Escape {
            layer: self.index,
            path: show(&raw),
            why,
        })?;
        let Some((name, parent)) = parts.split_last() else {
            return Ok(()); // the root itself keeps 0755 root:root
        };
        let kind = entry.header().entry_type();
        if name.as_bytes() == OPAQUE {
            return self.opaque(&raw, parent);
        }
        if let Some(target) = name.as_bytes().strip_prefix(WHITEOUT) {
            return self.whiteout(&raw, parent, target);
        }
        if matches!(kind, EntryType::Char | EntryType::Block) {
            stats.dropped_devices += 1;
            tracing::debug!(path = %show(&raw), "dropping a device node");
            return Ok(());
        }
        if matches!(kind, EntryType::XGlobalHeader | EntryType::XHeader) {
            return Ok(());
        }
        let dir = self.dir(&raw, parent)?;
        let dir = dir.as_fd();
        let h = entry.header();
        let mode = h.mode().map_err(|e| self.io(&raw, "mode", e))? & 0o7777;
        if mode & 0o6000 != 0 && !kind.is_dir() {
            stats.cleared_setid += 1;
        }
        let mode = mode & !0o6000;
        let uid = h.uid().map_err(|e| self.io(&raw, "uid", e))?;
        let gid = h.gid().map_err(|e| self.io(&raw, "gid", e))?;
        let owner = (
            u32::try_from(uid).map_err(|_| self.err(&raw, "uid out of range"))?,
            u32::try_from(gid).map_err(|_| self.err(&raw, "gid out of range"))?,
        );
        let mtime = h.mtime().unwrap_or(0);
        let path = at(dir, name);
        match kind {
            EntryType::Directory => {
                let is_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
                if !is_dir {
                    confined::remove(dir, name).map_err(|e| self.io(&raw, "replacing", e))?;
                    fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&path)
                        .map_err(|e| self.io(&raw, "creating", e))?;
                }
                std::os::unix::fs::lchown(&path, Some(owner.0), Some(owner.1))
                    .map_err(|e| self.io(&raw, "chown", e))?;
                fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                    .map_err(|e| self.io(&raw, "chmod", e))?;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                confined::remove(dir, name).map_err(|e| self.io(&raw, "replacing", e))?;
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(|e| self.io(&raw, "creating", e))?;
                io::copy(entry, &mut f).map_err(|e| self.io(&raw, "writing", e))?;
                std::os::unix::fs::fchown(&f, Some(owner.0), Some(owner.1))
                    .map_err(|e| self.io(&raw, "chown", e))?;
                f.set_permissions(fs::Permissions::from_mode(mode))
                    .map_err(|e| self.io(&raw, "chmod", e))?;
                confined::set_mtime(dir, name, mtime).map_err(|e| self.io(&raw, "mtime", e))?;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| self.err(&raw, "symlink without a target"))?
                    .into_owned();
                confined::remove(dir, name).map_err(|e| self.io(&raw, "replacing", e))?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
                    .map_err(|e| self.io(&raw, "symlink", e))?;
                std::os::unix::fs::lchown(&path, Some(owner.0), Some(owner.1))
                    .map_err(|e| self.io(&raw, "chown", e))?;
                confined::set_mtime(dir, name, mtime).map_err(|e| self.io(&raw, "mtime", e))?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| self.err(&raw, "hardlink without a target"))?
                    .into_owned();
                self.hardlink(&raw, dir, name, &target)?;
            }
            EntryType::Fifo => {
                confined::remove(dir, name).map_err(|e| self.io(&raw, "replacing", e))?;
                confined::mkfifo(dir, name, mode).map_err(|e| self.io(&raw, "mkfifo", e))?;
                std::os::unix::fs::lchown(&path, Some(owner.0), Some(owner.1))
                    .map_err(|e| self.io(&raw, "chown", e))?;
            }
            other => return Err(self.err(&raw, format!("unsupported entry type {other:?}"))),
        }
        if !matches!(kind, EntryType::Link | EntryType::Symlink) {
            self.xattrs(&raw, entry, &path)?;
        }
        self.written.insert(join(&parts));
        Ok(())
    }

    fn hardlink(
        &self,
        raw: &[u8],
        dir: BorrowedFd<'_>,
        name: &OsStr,
        target: &[u8],
    ) -> Result<(), UnpackError> {
        let tparts = components(target).map_err(|why| UnpackError::Escape {
            layer: self.index,
            path: format!("{} -> {}", show(raw), show(target)),
            why,
        })?;
        let missing = || {
            self.err(
                raw,
                format!("hardlink target {} is not in the image", show(target)),
            )
        };
        let (tname, tparent) = tparts.split_last().ok_or_else(missing)?;
        let tdir = open_in_root(self.root, &join(tparent), libc::O_PATH | libc::O_DIRECTORY)
            .map_err(|_| missing())?;
        let src = at(tdir.as_fd(), tname);
        match fs::symlink_metadata(&src) {
            Ok(m) if m.is_dir() => {
                return Err(self.err(raw, "hardlink target is a directory"));
            }
            Ok(_) => {}
            Err(_) => return Err(missing()),
        }
        confined::remove(dir, name).map_err(|e| self.io(raw, "replacing", e))?;
        // linkat without AT_SYMLINK_FOLLOW: a symlink target is linked, not followed.
        fs::hard_link(&src, at(dir, name)).map_err(|e| self.io(raw, "hardlink", e))
    }

    fn xattrs<R: Read>(
        &self,
        raw: &[u8],
        entry: &mut Entry<'_, R>,
        path: &std::path::Path,
    ) -> Result<(), UnpackError> {
        let Some(exts) = entry
            .pax_extensions()
            .map_err(|e| self.io(raw, "pax headers", e))?
        else {
            return Ok(());
        };
        for ext in exts {
            let ext = ext.map_err(|e| self.io(raw, "pax header", e))?;
            let Ok(key) = ext.key() else { continue };
            if let Some(name) = key.strip_prefix("SCHILY.xattr.")
                && name.starts_with("user.")
            {
                confined::set_xattr(path, name, ext.value_bytes())
                    .map_err(|e| self.io(raw, "xattr", e))?;
            }
        }
        Ok(())
    }

    fn whiteout(&self, raw: &[u8], parent: &[OsString], target: &[u8]) -> Result<(), UnpackError> {
        if target.is_empty() || target == b"." || target == b".." {
            return Err(self.err(raw, "malformed whiteout"));
        }
        match open_in_root(self.root, &join(parent), libc::O_PATH | libc::O_DIRECTORY) {
            Ok(dir) => confined::remove(dir.as_fd(), OsStr::from_bytes(target))
                .map_err(|e| self.io(raw, "whiteout", e)),
            Err(_) => Ok(()), // nothing below to delete
        }
    }

    fn opaque(&mut self, raw: &[u8], parent: &[OsString]) -> Result<(), UnpackError> {
        let dir = self.dir(raw, parent)?;
        let listing = fs::read_dir(at(dir.as_fd(), OsStr::new("")))
            .map_err(|e| self.io(raw, "listing", e))?;
        for child in listing {
            let child = child.map_err(|e| self.io(raw, "listing", e))?;
            let mut rel = parent.to_vec();
            rel.push(child.file_name());
            if !self.written.contains(&join(&rel)) {
                confined::remove(dir.as_fd(), &child.file_name())
                    .map_err(|e| self.io(raw, "opaque dir", e))?;
            }
        }
        self.written.insert(join(parent));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_drop_root_and_dot_and_refuse_dotdot() {
        let c = |s: &str| components(s.as_bytes());
        assert_eq!(c("/etc/./passwd").unwrap(), ["etc", "passwd"]);
        assert_eq!(c("./").unwrap(), Vec::<OsString>::new());
        assert!(c("a/../../b").is_err());
        assert!(c("..").is_err());
        assert_eq!(c(&"d/".repeat(128)).unwrap().len(), 128);
        assert!(c(&"d/".repeat(129)).is_err());
    }
}
