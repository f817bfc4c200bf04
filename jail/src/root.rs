//! The jail's root, in two halves: [`RootPlan::new`] works out every path, directory and mount
//! in the launcher (it may allocate), [`RootPlan::build`] only makes system calls on the
//! prepared C strings. The second half is what a forked child of a multi-threaded launcher
//! runs before `exec` (the tcg driver), where allocating is not safe; `vm-vmm` runs it too.
//!
//! The root is a small tmpfs mounted on [`JailConfig::root`] (an empty host directory; the
//! tmpfs exists only in the new mount namespace). Every bind lands at its own host path inside
//! it, read-write and `noexec` ([`JailConfig::binds`]: the socket directory), read-only and
//! `noexec` ([`JailConfig::ro`]: kernel, initrd, firmware) or read-only with `exec`
//! ([`JailConfig::exec`]: the program and its libraries); [`JailConfig::links`] recreate the
//! host's `/lib` → `usr/lib` style links. Then `pivot_root`, the old root detached, and the
//! tmpfs made read-only.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::Mode;

use super::{JailConfig, JailError};

/// Size of the root tmpfs (it holds only the directories and files leading to the mounts).
const ROOT_TMPFS_OPTIONS: &CStr = c"size=64k,nr_inodes=512,mode=0755";

/// A step of [`RootPlan::build`] (or of the rest of a pre-`exec` jail) that failed, and why;
/// `Copy` and allocation-free so that a forked child can return it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepError {
    /// What was being done.
    pub step: Step,
    /// Which path of the plan it was done to, counted from 1 (0: none); see
    /// [`RootPlan::path_of`].
    pub item: u8,
    /// The cause.
    pub errno: Errno,
}

/// The steps of building a jail, each with a fixed description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum Step {
    Unshare = 1,
    Fork,
    DeathSignal,
    Private,
    Tmpfs,
    MountPoint,
    Link,
    Bind,
    Remount,
    PivotRoot,
    Chdir,
    DetachOld,
    RemoveOld,
    ReadOnlyRoot,
    Hostname,
    Grant,
    Fds,
    Rlimit,
    Bounding,
    Groups,
    SetGid,
    SetUid,
    ClearCaps,
    NoNewPrivs,
    Seccomp,
}

impl Step {
    const ALL: [Step; 25] = [
        Step::Unshare,
        Step::Fork,
        Step::DeathSignal,
        Step::Private,
        Step::Tmpfs,
        Step::MountPoint,
        Step::Link,
        Step::Bind,
        Step::Remount,
        Step::PivotRoot,
        Step::Chdir,
        Step::DetachOld,
        Step::RemoveOld,
        Step::ReadOnlyRoot,
        Step::Hostname,
        Step::Grant,
        Step::Fds,
        Step::Rlimit,
        Step::Bounding,
        Step::Groups,
        Step::SetGid,
        Step::SetUid,
        Step::ClearCaps,
        Step::NoNewPrivs,
        Step::Seccomp,
    ];

    /// What the step does, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Step::Unshare => "unshare(mount, pid, ipc, uts, net)",
            Step::Fork => "fork into the pid namespace",
            Step::DeathSignal => "PR_SET_PDEATHSIG",
            Step::Private => "making mounts private",
            Step::Tmpfs => "mounting the root tmpfs on",
            Step::MountPoint => "creating a mount point in the root",
            Step::Link => "creating a symbolic link in the root",
            Step::Bind => "bind-mounting a path into the root",
            Step::Remount => "setting a bind mount's flags (read-only, nosuid, nodev, noexec)",
            Step::PivotRoot => "pivot_root",
            Step::Chdir => "chdir /",
            Step::DetachOld => "detaching the old root",
            Step::RemoveOld => "removing the old-root mount point",
            Step::ReadOnlyRoot => "making the root read-only",
            Step::Hostname => "sethostname",
            Step::Grant => "handing the socket directory or boot files to the jail's ids",
            Step::Fds => "closing inherited file descriptors",
            Step::Rlimit => "setting a resource limit",
            Step::Bounding => "dropping the capability bounding set",
            Step::Groups => "setgroups",
            Step::SetGid => "setresgid",
            Step::SetUid => "setresuid",
            Step::ClearCaps => "clearing capabilities",
            Step::NoNewPrivs => "PR_SET_NO_NEW_PRIVS",
            Step::Seccomp => "installing the seccomp filter",
        }
    }

    pub(super) fn from_u8(n: u8) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u8 == n)
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step.describe(), self.errno.desc())
    }
}

pub(super) fn at(step: Step) -> impl Fn(Errno) -> StepError {
    move |errno| StepError {
        step,
        item: 0,
        errno,
    }
}

/// [`at`] for the `index`th path of a list of the plan.
fn at_item(step: Step, index: usize) -> impl Fn(Errno) -> StepError {
    move |errno| StepError {
        step,
        item: u8::try_from(index + 1).unwrap_or(0),
        errno,
    }
}

/// One bind mount of the plan.
#[derive(Debug)]
struct BindMount {
    src: CString,
    dst: CString,
    flags: MsFlags,
}

/// Everything [`RootPlan::build`] needs, prepared.
#[derive(Debug)]
pub struct RootPlan {
    root: CString,
    /// Directories to create inside the root, parents first.
    dirs: Vec<CString>,
    /// Empty files to create inside the root (mount points of bound files).
    files: Vec<CString>,
    /// (link inside the root, its target).
    links: Vec<(CString, CString)>,
    mounts: Vec<BindMount>,
    old: CString,
}

pub(super) fn cstring(p: &Path) -> Result<CString, JailError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| JailError::Relative(p.to_path_buf()))
}

/// `path` (absolute) under `root`.
pub(super) fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

impl RootPlan {
    /// Works out the root of `cfg` (reads the host only to tell files from directories).
    pub fn new(cfg: &JailConfig) -> Result<RootPlan, JailError> {
        let all = cfg
            .binds
            .iter()
            .chain(&cfg.ro)
            .chain(&cfg.exec)
            .chain(cfg.links.iter().map(|(l, _)| l));
        for p in std::iter::once(&cfg.root).chain(all) {
            if !p.is_absolute() {
                return Err(JailError::Relative(p.clone()));
            }
        }
        let root = &cfg.root;
        let mut dirs: Vec<PathBuf> = Vec::new();
        let want_dir = |d: &Path, dirs: &mut Vec<PathBuf>| {
            for a in d.ancestors().collect::<Vec<_>>().into_iter().rev() {
                if a != Path::new("/") && !dirs.iter().any(|x| x == a) {
                    dirs.push(a.to_path_buf());
                }
            }
        };
        let base = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        let kinds = [
            (&cfg.binds, base | MsFlags::MS_NOEXEC),
            (&cfg.ro, base | MsFlags::MS_RDONLY | MsFlags::MS_NOEXEC),
            (&cfg.exec, base | MsFlags::MS_RDONLY),
        ];
        let mut files = Vec::new();
        let mut mounts = Vec::new();
        for (paths, flags) in kinds {
            for p in paths {
                let meta = std::fs::metadata(p).map_err(|e| JailError::Source {
                    path: p.clone(),
                    source: e,
                })?;
                if meta.is_dir() {
                    want_dir(p, &mut dirs);
                } else {
                    if let Some(parent) = p.parent() {
                        want_dir(parent, &mut dirs);
                    }
                    files.push(cstring(&inside(root, p))?);
                }
                mounts.push(BindMount {
                    src: cstring(p)?,
                    dst: cstring(&inside(root, p))?,
                    flags,
                });
            }
        }
        let mut links = Vec::new();
        for (link, target) in &cfg.links {
            if let Some(parent) = link.parent() {
                want_dir(parent, &mut dirs);
            }
            links.push((cstring(&inside(root, link))?, cstring(target)?));
        }
        dirs.push(PathBuf::from("/.old"));
        Ok(RootPlan {
            root: cstring(root)?,
            dirs: dirs
                .iter()
                .map(|d| cstring(&inside(root, d)))
                .collect::<Result<_, _>>()?,
            files,
            links,
            mounts,
            old: cstring(&root.join(".old"))?,
        })
    }

    /// The path a [`StepError`] of this plan's [`build`](Self::build) names, if any.
    pub fn path_of(&self, e: &StepError) -> Option<PathBuf> {
        use std::ffi::OsStr;
        let i = usize::from(e.item.checked_sub(1)?);
        let c = match e.step {
            Step::Tmpfs => Some(&self.root),
            Step::MountPoint => self.dirs.iter().chain(&self.files).nth(i),
            Step::Link => self.links.get(i).map(|(l, _)| l),
            Step::Bind | Step::Remount => self.mounts.get(i).map(|m| &m.src),
            _ => None,
        }?;
        Some(PathBuf::from(OsStr::from_bytes(c.as_bytes())))
    }

    /// Builds the root and enters it (in the new mount namespace). Allocates nothing.
    pub fn build(&self) -> Result<(), StepError> {
        let none: Option<&CStr> = None;
        mount(
            none,
            c"/",
            none,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            none,
        )
        .map_err(at(Step::Private))?;
        mount(
            Some(c"tmpfs"),
            self.root.as_c_str(),
            Some(c"tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some(ROOT_TMPFS_OPTIONS),
        )
        .map_err(at_item(Step::Tmpfs, 0))?;
        for (i, d) in self.dirs.iter().enumerate() {
            match nix::unistd::mkdir(d.as_c_str(), Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(at_item(Step::MountPoint, i)(e)),
            }
        }
        for (i, f) in self.files.iter().enumerate() {
            let fd = nix::fcntl::open(
                f.as_c_str(),
                OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o644),
            )
            .map_err(at_item(Step::MountPoint, self.dirs.len() + i))?;
            drop(fd);
        }
        for (i, (link, target)) in self.links.iter().enumerate() {
            nix::unistd::symlinkat(target.as_c_str(), AT_FDCWD, link.as_c_str())
                .map_err(at_item(Step::Link, i))?;
        }
        for (i, m) in self.mounts.iter().enumerate() {
            mount(
                Some(m.src.as_c_str()),
                m.dst.as_c_str(),
                none,
                MsFlags::MS_BIND,
                none,
            )
            .map_err(at_item(Step::Bind, i))?;
            mount(none, m.dst.as_c_str(), none, m.flags, none)
                .map_err(at_item(Step::Remount, i))?;
        }
        nix::unistd::pivot_root(self.root.as_c_str(), self.old.as_c_str())
            .map_err(at(Step::PivotRoot))?;
        nix::unistd::chdir(c"/").map_err(at(Step::Chdir))?;
        umount2(c"/.old", MntFlags::MNT_DETACH).map_err(at(Step::DetachOld))?;
        nix::unistd::unlinkat(AT_FDCWD, c"/.old", nix::unistd::UnlinkatFlags::RemoveDir)
            .map_err(at(Step::RemoveOld))?;
        mount(
            none,
            c"/",
            none,
            MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(ROOT_TMPFS_OPTIONS),
        )
        .map_err(at(Step::ReadOnlyRoot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_land_at_their_own_path_inside_the_root() {
        assert_eq!(
            inside(Path::new("/run/vm/a/root"), Path::new("/run/vm/a")),
            PathBuf::from("/run/vm/a/root/run/vm/a")
        );
    }

    #[test]
    fn plan_creates_parents_first_and_files_as_files() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("k");
        std::fs::write(&file, b"x").unwrap();
        let cfg = JailConfig {
            root: "/r".into(),
            binds: vec![tmp.path().to_path_buf()],
            ro: vec![file.clone()],
            links: vec![("/lib".into(), "usr/lib".into())],
            ..JailConfig::default()
        };
        let plan = RootPlan::new(&cfg).unwrap();
        let dirs: Vec<_> = plan.dirs.iter().map(|d| d.to_str().unwrap()).collect();
        let t = tmp.path().to_str().unwrap();
        assert_eq!(dirs.first().copied(), Some("/r/tmp"));
        assert!(dirs.contains(&format!("/r{t}").as_str()), "{dirs:?}");
        assert_eq!(dirs.last().copied(), Some("/r/.old"));
        assert_eq!(
            plan.files,
            vec![cstring(&inside(Path::new("/r"), &file)).unwrap()]
        );
        assert_eq!(plan.mounts.len(), 2);
        assert!(
            plan.mounts[1]
                .flags
                .contains(MsFlags::MS_RDONLY | MsFlags::MS_NOEXEC)
        );
        assert!(!plan.mounts[0].flags.contains(MsFlags::MS_RDONLY));
        assert_eq!(plan.links[0].0.to_str().unwrap(), "/r/lib");
    }

    #[test]
    fn every_step_round_trips_through_its_number() {
        for s in Step::ALL {
            assert_eq!(Step::from_u8(s as u8), Some(s));
            assert!(!s.describe().is_empty());
        }
        assert_eq!(Step::from_u8(0), None);
    }
}
