//! Files only their owner can change. A directory named by path that someone else might
//! control (a snapshot directory: its files say what a VM mounts and runs) is opened without
//! following a link and checked by `fstat` on that descriptor; its files are opened beneath
//! it with `openat2` (no link anywhere in the name) and checked the same way. What was
//! checked is what is then read: the descriptor, never the path again.
//!
//! The rule ([`check`]): the right kind of file, owned by the expected uid (the caller's
//! effective uid, [`euid`]), and writable by nobody else (no group or other write bit; with
//! a POSIX ACL the group bits are its mask, so a named user or group with write access shows
//! there too).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};

use crate::fs::{RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, openat2};

/// The kind of file a name must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Directory,
    /// A regular file.
    File,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Directory => "directory",
            Kind::File => "regular file",
        }
    }

    fn matches(self, st: &FileStat) -> bool {
        let fmt = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        match self {
            Kind::Directory => fmt == SFlag::S_IFDIR,
            Kind::File => fmt == SFlag::S_IFREG,
        }
    }
}

/// Why a file is not one only its owner can change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The name is a symbolic link.
    #[error("is a symbolic link")]
    Link,
    /// The name is another kind of file.
    #[error("is not a {0}")]
    Kind(&'static str),
    /// Another user owns it.
    #[error("belongs to uid {found}, not to uid {expected}")]
    Owner {
        /// Its owner.
        found: u32,
        /// The uid it must belong to.
        expected: u32,
    },
    /// Group or others may write it.
    #[error("is writable by group or others (mode {0:04o})")]
    Writable(u32),
    /// It could not be opened or examined.
    #[error("cannot be opened")]
    Open(#[source] Errno),
}

/// The calling process's effective uid: the owner [`check`] expects of the caller's files.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn judge(st: &FileStat, kind: Kind, owner: u32) -> Result<(), Refusal> {
    let fmt = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    if fmt == SFlag::S_IFLNK {
        return Err(Refusal::Link);
    }
    if !kind.matches(st) {
        return Err(Refusal::Kind(kind.name()));
    }
    if st.st_uid != owner {
        return Err(Refusal::Owner {
            found: st.st_uid,
            expected: owner,
        });
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(Refusal::Writable(mode));
    }
    Ok(())
}

/// Checks the open file `fd` (`fstat`): of `kind`, owned by `owner`, writable by nobody else.
pub fn check(fd: BorrowedFd<'_>, kind: Kind, owner: u32) -> Result<(), Refusal> {
    let st = fstat(fd).map_err(Refusal::Open)?;
    judge(&st, kind, owner)
}

/// Checks the entry `name` of the directory `dir` without following it (`fstatat` with
/// `AT_SYMLINK_NOFOLLOW`): as [`check`], a symbolic link refused as one.
pub fn check_entry(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    kind: Kind,
    owner: u32,
) -> Result<(), Refusal> {
    let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(Refusal::Open)?;
    judge(&st, kind, owner)
}

/// Opens the directory `path` without following a link in its last component and checks it
/// ([`check`]). A link there is [`Refusal::Link`]; links above it are the caller's path.
pub fn open_dir(path: &Path, owner: u32) -> Result<OwnedFd, Refusal> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::open(path, flags, Mode::empty()) {
        Ok(fd) => fd,
        // O_NOFOLLOW on a link: ELOOP; O_DIRECTORY on a link may answer ENOTDIR first.
        Err(Errno::ELOOP) => return Err(Refusal::Link),
        Err(Errno::ENOTDIR) => {
            let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            return Err(if link {
                Refusal::Link
            } else {
                Refusal::Kind(Kind::Directory.name())
            });
        }
        Err(e) => return Err(Refusal::Open(e)),
    };
    check(fd.as_fd(), Kind::Directory, owner)?;
    Ok(fd)
}

/// Opens the regular file `name` directly inside `dir` for reading (`openat2` with
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` and `O_NOFOLLOW`; a FIFO
/// cannot block the open) and checks it ([`check`]).
pub fn open_file(dir: BorrowedFd<'_>, name: &OsStr, owner: u32) -> Result<File, Refusal> {
    let resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK;
    let fd = match openat2(dir, name, flags, 0, resolve) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return Err(Refusal::Link),
        Err(e) => return Err(Refusal::Open(e)),
    };
    check(fd.as_fd(), Kind::File, owner)?;
    Ok(File::from(fd))
}

/// The names in the directory `dir` (read through the descriptor, not a path; `.` and `..`
/// left out).
pub fn entries(dir: BorrowedFd<'_>) -> std::io::Result<Vec<OsString>> {
    let here = format!("/proc/self/fd/{}", dir.as_raw_fd());
    std::fs::read_dir(here)?
        .map(|e| e.map(|e| e.file_name()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_private_directory_and_file_pass_and_each_fault_is_named() {
        let me = euid();
        let d = tempfile::tempdir().unwrap();
        chmod(d.path(), 0o700);
        std::fs::write(d.path().join("f"), b"x").unwrap();
        chmod(&d.path().join("f"), 0o600);
        let dir = open_dir(d.path(), me).unwrap();
        let f = open_file(dir.as_fd(), OsStr::new("f"), me).unwrap();
        check(f.as_fd(), Kind::File, me).unwrap();
        check_entry(dir.as_fd(), OsStr::new("f"), Kind::File, me).unwrap();
        let mut names = entries(dir.as_fd()).unwrap();
        names.sort();
        assert_eq!(names, vec![OsString::from("f")]);

        // Another owner.
        assert_eq!(
            open_file(dir.as_fd(), OsStr::new("f"), me + 1).unwrap_err(),
            Refusal::Owner {
                found: me,
                expected: me + 1
            }
        );
        // Group- or other-writable, file and directory.
        chmod(&d.path().join("f"), 0o620);
        assert_eq!(
            open_file(dir.as_fd(), OsStr::new("f"), me).unwrap_err(),
            Refusal::Writable(0o620)
        );
        chmod(&d.path().join("f"), 0o644);
        open_file(dir.as_fd(), OsStr::new("f"), me).unwrap();
        chmod(d.path(), 0o702);
        assert_eq!(
            open_dir(d.path(), me).unwrap_err(),
            Refusal::Writable(0o702)
        );
        chmod(d.path(), 0o700);

        // A link, as the file or as the directory; a directory where a file must be.
        std::os::unix::fs::symlink("f", d.path().join("l")).unwrap();
        assert_eq!(
            open_file(dir.as_fd(), OsStr::new("l"), me).unwrap_err(),
            Refusal::Link
        );
        assert_eq!(
            check_entry(dir.as_fd(), OsStr::new("l"), Kind::File, me).unwrap_err(),
            Refusal::Link
        );
        let link = d.path().join("dirlink");
        std::os::unix::fs::symlink(d.path(), &link).unwrap();
        assert_eq!(open_dir(&link, me).unwrap_err(), Refusal::Link);
        assert_eq!(
            open_dir(&d.path().join("f"), me).unwrap_err(),
            Refusal::Kind("directory")
        );
        std::fs::create_dir(d.path().join("sub")).unwrap();
        assert_eq!(
            open_file(dir.as_fd(), OsStr::new("sub"), me).unwrap_err(),
            Refusal::Kind("regular file")
        );
        // A name that leaves the directory.
        assert!(matches!(
            open_file(dir.as_fd(), OsStr::new("../x"), me),
            Err(Refusal::Open(Errno::EXDEV))
        ));
    }

    #[test]
    fn a_fifo_does_not_block_the_open_and_is_refused() {
        let me = euid();
        let d = tempfile::tempdir().unwrap();
        chmod(d.path(), 0o700);
        nix::unistd::mkfifo(&d.path().join("p"), Mode::from_bits_truncate(0o600)).unwrap();
        let dir = open_dir(d.path(), me).unwrap();
        assert_eq!(
            open_file(dir.as_fd(), OsStr::new("p"), me).unwrap_err(),
            Refusal::Kind("regular file")
        );
    }
}
