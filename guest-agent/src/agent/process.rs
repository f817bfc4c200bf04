//! Spawning the processes the agent runs, each in its own session/process group and (when
//! available) its own leaf cgroup, with exactly the given environment, and killing their trees.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;

use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use super::cgroup::{CgroupDir, Cgroups};
use super::reaper::{Reaper, ReaperError};
use super::sys::proc as sys;
use super::user::Ids;
use vm_agent_protocol::protocol::{Command, ErrorKind, ExitStatus};

/// Process errors.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("empty argv")]
    EmptyArgv,
    #[error("invalid environment variable name {0:?}")]
    BadEnv(String),
    #[error("working directory {path}")]
    Cwd {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{program}: cannot execute: {source}")]
    NotExecutable {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot create pipe")]
    Pipe(#[source] std::io::Error),
    #[error("cannot create cgroup")]
    Cgroup(#[source] super::cgroup::CgroupError),
    #[error("spawn failed")]
    Spawn(#[source] ReaperError),
}

impl ProcessError {
    /// The error kind reported to the host: a program that is missing or cannot be
    /// executed gets its own kind (the host maps them to exit codes 127 and 126, as
    /// container CLIs and shells do); anything else is a spawn failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ProcessError::NotFound(_) => ErrorKind::CommandNotFound,
            ProcessError::NotExecutable { .. } => ErrorKind::NotExecutable,
            _ => ErrorKind::Spawn,
        }
    }

    /// Sorts the failure of `exec` of `program` (the working directory is known good):
    /// ENOENT means no such program, EACCES/ENOEXEC/EISDIR/ENOTDIR/EPERM a program that
    /// cannot be executed.
    fn from_exec(program: &str, e: ReaperError) -> ProcessError {
        match e {
            ReaperError::Spawn(io) => match io.raw_os_error() {
                Some(libc::ENOENT) => ProcessError::NotFound(program.to_string()),
                Some(libc::EACCES | libc::ENOEXEC | libc::EISDIR | libc::ENOTDIR | libc::EPERM) => {
                    ProcessError::NotExecutable {
                        program: program.to_string(),
                        source: io,
                    }
                }
                _ => ProcessError::Spawn(ReaperError::Spawn(io)),
            },
            other => ProcessError::Spawn(other),
        }
    }
}

/// How the child's stdout/stderr are connected.
#[derive(Debug, Clone, Copy)]
pub enum OutputMode<'a> {
    /// One pipe shared by stdout and stderr (order preserved).
    Combined,
    /// Separate stdout and stderr pipes.
    Separate,
    /// This pseudo-terminal slave is stdin, stdout and stderr, and becomes the child's
    /// controlling terminal (`with_stdin` is then irrelevant).
    Terminal(BorrowedFd<'a>),
}

/// What to spawn.
#[derive(Debug)]
pub struct SpawnSpec<'a> {
    pub command: &'a Command,
    pub env: &'a [(String, String)],
    pub cwd: Option<&'a str>,
    pub default_cwd: &'a Path,
    pub with_stdin: bool,
    pub output: OutputMode<'a>,
    /// Leaf cgroup name, e.g. `exec-7`.
    pub name: &'a str,
    /// Run as this identity (`None` = the agent's own, root).
    pub user: Option<&'a Ids>,
    /// Run with this guest directory (a pod member's root, a mount) as `/`, in a mount
    /// namespace of its own: `cwd` and the program are resolved inside it.
    pub root: Option<&'a Path>,
    /// The leaf goes in this cgroup group (a pod member's, with its limits).
    pub group: Option<&'a str>,
    /// Confined as a container's process ([`super::container`]): its namespaces, identity
    /// (`user` then only names the uid and gid), capabilities and seccomp filter.
    pub confine: Option<&'a super::container::Prepared>,
}

/// A spawned process tree.
#[derive(Debug)]
pub struct Proc {
    pub pid: i32,
    pub exit: oneshot::Receiver<ExitStatus>,
    pub stdin: Option<pipe::Sender>,
    pub out: Option<pipe::Receiver>,
    pub err: Option<pipe::Receiver>,
    pub cgroup: Option<CgroupDir>,
}

/// A close-on-exec pipe `(read end, write end)`.
fn make_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = std::io::pipe()?;
    Ok((r.into(), w.into()))
}

/// `path` as a C string (a guest path with a NUL in it cannot be entered).
fn cstring_of(path: &Path) -> Result<std::ffi::CString, ProcessError> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| ProcessError::Cwd {
        path: path.display().to_string(),
        source: std::io::Error::from_raw_os_error(libc::EINVAL),
    })
}

/// Spawn per `spec` through the reaper.
pub fn spawn(
    reaper: &Reaper,
    cgroups: Option<&Cgroups>,
    spec: &SpawnSpec<'_>,
) -> Result<Proc, ProcessError> {
    let (mut cmd, program) = match spec.command {
        Command::Shell(line) => {
            let mut c = std::process::Command::new("/bin/sh");
            c.arg("-c").arg(line);
            (c, "/bin/sh")
        }
        Command::Argv(argv) => {
            let (first, rest) = argv.split_first().ok_or(ProcessError::EmptyArgv)?;
            let mut c = std::process::Command::new(first);
            c.args(rest);
            (c, first.as_str())
        }
    };
    cmd.env_clear();
    for (k, v) in spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(ProcessError::BadEnv(k.chars().take(64).collect()));
        }
        cmd.env(k, v);
    }
    let cwd = spec.cwd.map(Path::new).unwrap_or(spec.default_cwd);
    let seen_cwd: std::borrow::Cow<'_, Path> = match spec.root {
        Some(root) => root.join(cwd.strip_prefix("/").unwrap_or(cwd)).into(),
        None => cwd.into(),
    };
    // Checked here so that a failed exec's ENOENT can only be the program's.
    match std::fs::metadata(&seen_cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(ProcessError::Cwd {
                path: cwd.display().to_string(),
                source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
            });
        }
        Err(source) => {
            return Err(ProcessError::Cwd {
                path: cwd.display().to_string(),
                source,
            });
        }
    }
    // In a root (or a container's namespace) the directory is entered after the pivot
    // (std's own chdir comes before it).
    let (enter_root, confined) = match (spec.confine, spec.root) {
        (Some(c), _) => (None, Some((c.child.clone(), cstring_of(cwd)?))),
        (None, Some(root)) => (Some((cstring_of(root)?, cstring_of(cwd)?)), None),
        (None, None) => {
            cmd.current_dir(cwd);
            (None, None)
        }
    };
    cmd.stdin(if spec.with_stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut combined_read = None;
    let terminal = matches!(spec.output, OutputMode::Terminal(_));
    match spec.output {
        OutputMode::Terminal(tty) => {
            let slave = || tty.try_clone_to_owned().map(Stdio::from);
            cmd.stdin(slave().map_err(ProcessError::Pipe)?);
            cmd.stdout(slave().map_err(ProcessError::Pipe)?);
            cmd.stderr(slave().map_err(ProcessError::Pipe)?);
        }
        OutputMode::Combined => {
            let (r, w) = make_pipe().map_err(ProcessError::Pipe)?;
            let w2 = w.try_clone().map_err(ProcessError::Pipe)?;
            cmd.stdout(Stdio::from(w));
            cmd.stderr(Stdio::from(w2));
            combined_read = Some(r);
        }
        OutputMode::Separate => {
            cmd.stdout(Stdio::piped());
            cmd.stderr(Stdio::piped());
        }
    }
    let cgroup = match cgroups {
        Some(c) => Some(
            c.create_in(spec.group, spec.name)
                .map_err(ProcessError::Cgroup)?,
        ),
        None => None,
    };
    let procs = cgroup.as_ref().map(|c| c.procs_path().clone());
    let ids = spec.user.cloned();
    let pre_exec = move || {
        sys::setsid()?;
        // Undo the agent's own -1000 so the OOM killer picks the workload, never the agent.
        sys::write_file_raw(c"/proc/self/oom_score_adj", b"0");
        if let Some(p) = &procs
            && !sys::write_file_raw(p, b"0")
        {
            // errno from the failed open/write; no allocation between fork and exec.
            return Err(std::io::Error::last_os_error());
        }
        if terminal {
            super::sys::take_stdin_as_controlling_tty()?;
        }
        // A container's process: its namespaces, identity, capabilities and filter.
        if let Some((steps, cwd)) = &confined {
            return steps.run(cwd);
        }
        // Into the member's root once the agent's paths (the cgroup) are done with.
        if let Some((root, cwd)) = &enter_root {
            super::sys::fs::pivot_into(root, cwd)?;
        }
        // The identity switch comes last: joining the cgroup needs root.
        if let Some(ids) = &ids {
            // The groups vector was allocated before fork.
            sys::set_ids(&ids.groups, ids.gid, ids.uid)?;
            // Work run as a user stays that user: setuid binaries of the image cannot raise
            // it (no_new_privs is inherited by everything it starts).
            if ids.uid != 0 {
                sys::set_no_new_privs()?;
            }
        }
        Ok(())
    };
    // SAFETY: the closure only makes async-signal-safe syscalls (setsid, open, write, close,
    // unshare, setns, mount, statfs, chdir, pivot_root, umount2, ioctl, setgroups, setgid,
    // setuid, capset, prctl, seccomp) and allocates nothing.
    unsafe { cmd.pre_exec(pre_exec) };
    let spawned = match spec.confine {
        Some(c) => c.spawn(reaper, &mut cmd),
        None => reaper.spawn(&mut cmd),
    };
    drop(cmd); // closes our copies of the child's pipe ends
    let (mut child, exit) = match spawned {
        Ok(x) => x,
        Err(e) => {
            if let Some(cg) = cgroup {
                tokio::spawn(cg.remove());
            }
            return Err(ProcessError::from_exec(program, e));
        }
    };
    let pid = child.id() as i32;
    let stdin = child
        .stdin
        .take()
        .and_then(|s| pipe::Sender::from_owned_fd(OwnedFd::from(s)).ok());
    let (out, err) = match combined_read {
        Some(r) => (pipe::Receiver::from_owned_fd(r).ok(), None),
        None => (
            child
                .stdout
                .take()
                .and_then(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s)).ok()),
            child
                .stderr
                .take()
                .and_then(|s| pipe::Receiver::from_owned_fd(OwnedFd::from(s)).ok()),
        ),
    };
    Ok(Proc {
        pid,
        exit,
        stdin,
        out,
        err,
        cgroup,
    })
}

impl Proc {
    /// SIGKILL the whole tree: the leaf cgroup (if any) and the process group.
    pub fn kill_tree(&self) {
        kill_tree(self.pid, self.cgroup.as_ref());
    }

    /// Deliver `signal` to the process (`all`: to its process group, which it leads).
    pub fn signal(&self, signal: i32, all: bool) {
        // pid is our child (not yet reaped) and the leader of its group (setsid).
        let r = match all {
            true => sys::killpg(self.pid, signal),
            false => sys::kill(self.pid, signal),
        };
        if let Err(error) = r {
            tracing::debug!(pid = self.pid, signal, %error, "signal");
        }
    }
}

/// SIGKILL the tree rooted at session leader `pid`.
pub fn kill_tree(pid: i32, cgroup: Option<&CgroupDir>) {
    if let Some(c) = cgroup {
        c.kill();
    }
    // pid is the group id set by setsid; a group already gone (ESRCH) is fine.
    let _ = sys::killpg(pid, libc::SIGKILL);
}
