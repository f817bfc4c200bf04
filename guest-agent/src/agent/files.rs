//! Confined file access: ReadFile, WriteFile, List, MakeDirs, SetMode, Remove.
//!
//! A write never touches its destination until it is complete: [`create_part`] makes a
//! temporary file beside it ([`Part`]), which [`Part::commit`] renames over the destination
//! and which is removed if the part is dropped uncommitted (an error, a dropped connection).
//!
//! Paths are relative to a root. `..` components, absolute paths, NUL bytes and overlong paths
//! are refused before touching the filesystem; every open then goes through
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to a directory fd, so neither a
//! symlink nor a directory swapped for a symlink during the call can reach outside the root.
//! The root itself (a guest path chosen by the host) is resolved with `RESOLVE_IN_ROOT` below
//! the agent's base directory (`/` in a guest, `--root DIR` on the host).

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use std::sync::atomic::{AtomicU64, Ordering};

use super::sys::fs as sys;
use vm_agent_protocol::protocol::{ErrorKind, FileEntry, MAX_LIST_ENTRIES, MAX_PATH_BYTES};

/// File errors, each mapped to a wire [`ErrorKind`].
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("path {0:?} leaves its root")]
    Escape(String),
    #[error("invalid path {0:?}")]
    BadPath(String),
    #[error("{0:?} not found")]
    NotFound(String),
    #[error("{0:?} is not a regular file")]
    NotRegular(String),
    #[error("{0:?} is a directory")]
    Directory(String),
    #[error("{path:?} is {size} bytes, over the cap of {max} bytes")]
    TooLarge { path: String, size: u64, max: u64 },
    #[error("{path:?} grew past the cap of {max} bytes while being copied")]
    Grew { path: String, max: u64 },
    #[error("more than {max} entries")]
    TooManyEntries { max: u32 },
    #[error("cannot hand {path:?} to its owner")]
    Owner {
        path: String,
        #[source]
        source: super::user::UserError,
    },
    #[error("i/o error on {path:?}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl FileError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            FileError::Escape(_) => ErrorKind::Escape,
            FileError::BadPath(_) | FileError::Owner { .. } => ErrorKind::BadRequest,
            FileError::NotFound(_) => ErrorKind::NotFound,
            FileError::NotRegular(_) | FileError::Directory(_) => ErrorKind::BadRequest,
            FileError::TooLarge { .. }
            | FileError::Grew { .. }
            | FileError::TooManyEntries { .. } => ErrorKind::TooLarge,
            FileError::Io { .. } => ErrorKind::Io,
        }
    }
}

/// `openat2(dir, path, flags, mode, resolve)`, retried on EAGAIN/EINTR.
fn openat2(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> Result<OwnedFd, FileError> {
    let c = CString::new(if path.is_empty() { "." } else { path })
        .map_err(|_| FileError::BadPath(path.into()))?;
    for _ in 0..16 {
        let e = match sys::openat2(dir, &c, flags, mode, resolve) {
            Ok(fd) => return Ok(fd),
            Err(e) => e,
        };
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
            Some(libc::EXDEV) | Some(libc::ELOOP) => return Err(FileError::Escape(path.into())),
            Some(libc::ENOENT) => return Err(FileError::NotFound(path.into())),
            _ => {
                return Err(FileError::Io {
                    path: path.into(),
                    source: e,
                });
            }
        }
    }
    Err(FileError::Io {
        path: path.into(),
        source: std::io::Error::from_raw_os_error(libc::EAGAIN),
    })
}

const BENEATH: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;

/// Check a relative path and return its normal components (`""`/`.` = the root itself).
pub fn clean(path: &str) -> Result<Vec<&str>, FileError> {
    if path.len() > MAX_PATH_BYTES || path.contains('\0') {
        return Err(FileError::BadPath(path.chars().take(256).collect()));
    }
    if path.starts_with('/') {
        return Err(FileError::Escape(path.into()));
    }
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(FileError::Escape(path.into())),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn fstat(fd: BorrowedFd<'_>, path: &str) -> Result<libc::stat, FileError> {
    sys::fstat(fd).map_err(|source| FileError::Io {
        path: path.into(),
        source,
    })
}

fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// Open the request root below the agent's base directory.
pub fn open_root(base: BorrowedFd<'_>, root: &str) -> Result<OwnedFd, FileError> {
    let rel = clean(root.trim_start_matches('/'))?.join("/");
    openat2(
        base,
        &rel,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
}

/// Open a regular file for reading; returns it with its size, refused when over `max`.
pub fn open_read(
    root: BorrowedFd<'_>,
    path: &str,
    max: u64,
) -> Result<(std::fs::File, u64), FileError> {
    let rel = clean(path)?.join("/");
    if rel.is_empty() {
        return Err(FileError::NotRegular(path.into()));
    }
    let fd = openat2(
        root,
        &rel,
        libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
        0,
        BENEATH,
    )?;
    let st = fstat(fd.as_fd(), path)?;
    if !is_reg(&st) {
        return Err(FileError::NotRegular(path.into()));
    }
    let size = st.st_size as u64;
    if size > max {
        return Err(FileError::TooLarge {
            path: path.into(),
            size,
            max,
        });
    }
    Ok((std::fs::File::from(fd), size))
}

/// A temporary file beside a write's destination (see the module docs).
#[derive(Debug)]
pub struct Part {
    dir: OwnedFd,
    tmp: CString,
    name: CString,
    path: String,
    committed: bool,
}

impl Part {
    /// Renames the temporary file over the destination.
    pub fn commit(mut self) -> Result<(), FileError> {
        sys::renameat(self.dir.as_fd(), &self.tmp, &self.name).map_err(|source| FileError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        if !self.committed {
            let _ = sys::unlinkat(self.dir.as_fd(), &self.tmp);
        }
    }
}

/// A fresh temporary name beside `name` (a hidden, bounded-length single component).
fn part_name(name: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut cut = name.len().min(200);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!(
        ".{}.vm-part-{}-{nanos:x}-{seq}",
        &name[..cut],
        std::process::id()
    )
}

/// Gives the temporary file the replaced file's owner (best effort: only root may) and
/// permission bits (`0o777`; set-id bits are not carried over to new content).
fn keep_owner_and_mode(file: &std::fs::File, st: &libc::stat, path: &str) -> Result<(), FileError> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::os::unix::fs::fchown(file, Some(st.st_uid), Some(st.st_gid));
    file.set_permissions(std::fs::Permissions::from_mode(st.st_mode & 0o777))
        .map_err(|source| FileError::Io {
            path: path.into(),
            source,
        })
}

/// Starts a write of `path`: missing parent directories are created, an existing destination
/// must be a regular file (followed beneath the root; a symlink at the destination is
/// replaced, never written through) whose owner and mode the new file keeps, and the data
/// goes to a fresh temporary file beside it.
pub fn create_part(root: BorrowedFd<'_>, path: &str) -> Result<(Part, std::fs::File), FileError> {
    let comps = clean(path)?;
    let Some((last, parents)) = comps.split_last() else {
        return Err(FileError::BadPath(path.into()));
    };
    let parent = match openat2(
        root,
        &parents.join("/"),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        BENEATH,
    ) {
        Ok(fd) => fd,
        Err(FileError::NotFound(_)) => mkdirs(root, parents)?,
        Err(e) => return Err(e),
    };
    let existing = match openat2(parent.as_fd(), last, libc::O_PATH, 0, BENEATH) {
        Ok(fd) => {
            let st = fstat(fd.as_fd(), path)?;
            if !is_reg(&st) {
                return Err(FileError::NotRegular(path.into()));
            }
            Some(st)
        }
        Err(FileError::NotFound(_)) => None,
        Err(e) => return Err(e),
    };
    let name = CString::new(*last).map_err(|_| FileError::BadPath(path.into()))?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_NONBLOCK;
    let mut tries = 0;
    loop {
        let tmp = part_name(last);
        match openat2(parent.as_fd(), &tmp, flags, 0o644, BENEATH) {
            Ok(fd) => {
                let file = std::fs::File::from(fd);
                let part = Part {
                    dir: parent,
                    tmp: CString::new(tmp).map_err(|_| FileError::BadPath(path.into()))?,
                    name,
                    path: path.into(),
                    committed: false,
                };
                if let Some(st) = existing {
                    keep_owner_and_mode(&file, &st, path)?;
                }
                return Ok((part, file));
            }
            Err(FileError::Io { source, .. })
                if source.raw_os_error() == Some(libc::EEXIST) && tries < 8 =>
            {
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

pub(super) fn mkdirs(root: BorrowedFd<'_>, comps: &[&str]) -> Result<OwnedFd, FileError> {
    let mut dir = openat2(root, "", libc::O_PATH | libc::O_DIRECTORY, 0, BENEATH)?;
    for (i, c) in comps.iter().enumerate() {
        let prefix = comps[..=i].join("/");
        match openat2(root, &prefix, libc::O_PATH | libc::O_DIRECTORY, 0, BENEATH) {
            Ok(fd) => dir = fd,
            Err(FileError::NotFound(_)) => {
                let name = CString::new(*c).map_err(|_| FileError::BadPath(prefix.clone()))?;
                if let Err(e) = sys::mkdirat(dir.as_fd(), &name, 0o755)
                    && e.raw_os_error() != Some(libc::EEXIST)
                {
                    return Err(FileError::Io {
                        path: prefix,
                        source: e,
                    });
                }
                dir = openat2(root, &prefix, libc::O_PATH | libc::O_DIRECTORY, 0, BENEATH)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(dir)
}

/// Creates the absolute directory `path` below `base` (with its missing parents) and, with an
/// `owner`, gives the last directory to that user's uid and gid (resolved in `/etc`, the image
/// root's in a guest booted with one).
pub fn make_dirs(base: BorrowedFd<'_>, path: &str, owner: Option<&str>) -> Result<(), FileError> {
    let comps = clean(path.trim_start_matches('/'))?;
    let dir = mkdirs(base, &comps)?;
    let Some(ids) = super::user::resolve_opt(owner).map_err(|source| FileError::Owner {
        path: path.into(),
        source,
    })?
    else {
        return Ok(());
    };
    sys::chown_fd(dir.as_fd(), ids.uid, ids.gid).map_err(|source| FileError::Io {
        path: path.into(),
        source,
    })
}

/// Sets the permission bits (`mode & 0o777`) of the regular file at the absolute `path`
/// below `base`.
pub fn set_mode(base: BorrowedFd<'_>, path: &str, mode: u32) -> Result<(), FileError> {
    use std::os::unix::fs::PermissionsExt;
    let (file, _) = open_read(base, path.trim_start_matches('/'), u64::MAX)?;
    file.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))
        .map_err(|source| FileError::Io {
            path: path.into(),
            source,
        })
}

/// Removes what is at `path` below `root`: a file, or a symlink itself (`unlinkat` never
/// follows the last component); the directories on the way are opened beneath `root`, so
/// none of them can be a way out.
pub fn remove(root: BorrowedFd<'_>, path: &str) -> Result<(), FileError> {
    let parts = clean(path)?;
    let Some((name, parents)) = parts.split_last() else {
        return Err(FileError::Directory(path.into()));
    };
    let dir = openat2(
        root,
        &parents.join("/"),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        BENEATH,
    )?;
    let name = CString::new(*name).map_err(|_| FileError::BadPath(path.into()))?;
    sys::unlinkat(dir.as_fd(), &name).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOENT) => FileError::NotFound(path.into()),
        Some(libc::EISDIR) => FileError::Directory(path.into()),
        _ => FileError::Io {
            path: path.into(),
            source,
        },
    })
}

/// Regular files under `root/path`, recursively (symlinks are not followed).
pub fn list(root: BorrowedFd<'_>, path: &str) -> Result<Vec<FileEntry>, FileError> {
    let rel = clean(path)?.join("/");
    let dir = openat2(root, &rel, libc::O_RDONLY | libc::O_DIRECTORY, 0, BENEATH)?;
    let mut out = Vec::new();
    walk(dir, String::new(), 0, &mut out)?;
    Ok(out)
}

const MAX_DEPTH: u32 = 64;

fn walk(
    dir: OwnedFd,
    prefix: String,
    depth: u32,
    out: &mut Vec<FileEntry>,
) -> Result<(), FileError> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let names = read_names(&dir, &prefix)?;
    for name in names {
        let Some(name_str) = OsStr::from_bytes(&name).to_str() else {
            continue;
        };
        let rel = if prefix.is_empty() {
            name_str.to_string()
        } else {
            format!("{prefix}/{name_str}")
        };
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        // O_PATH first: never open a FIFO or device for real.
        let Ok(fd) = openat2(
            dir.as_fd(),
            name_str,
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
            BENEATH | libc::RESOLVE_NO_SYMLINKS,
        ) else {
            continue;
        };
        let st = fstat(fd.as_fd(), &rel)?;
        if is_reg(&st) {
            if out.len() >= MAX_LIST_ENTRIES as usize {
                return Err(FileError::TooManyEntries {
                    max: MAX_LIST_ENTRIES,
                });
            }
            out.push(FileEntry {
                path: rel,
                size: st.st_size as u64,
            });
        } else if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            let sub = match openat2(
                dir.as_fd(),
                name_str,
                flags | libc::O_DIRECTORY,
                0,
                BENEATH | libc::RESOLVE_NO_SYMLINKS,
            ) {
                Ok(fd) => fd,
                Err(FileError::Escape(_) | FileError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            walk(sub, rel, depth + 1, out)?;
        }
    }
    Ok(())
}

/// Directory entry names of `dir` (not `.`/`..`), bounded.
fn read_names(dir: &OwnedFd, path: &str) -> Result<Vec<Vec<u8>>, FileError> {
    sys::read_dir_names(dir.as_fd(), MAX_LIST_ENTRIES as usize).map_err(|source| FileError::Io {
        path: path.into(),
        source,
    })
}
