//! `ExecContainer`: a container's process, confined as the OCI bundle asks (the wire types
//! and their bounds: [`vm_agent_protocol::container`]).
//!
//! The container's first process makes its namespaces: a mount namespace (entered at the
//! container's root by `pivot_root`, or the VM's own root for a container that has the VM
//! to itself or a pod's sandbox) with the root read-only, the masked and read-only paths and
//! a `/proc` of its PID namespace when it asked for them, and a PID namespace of its own in
//! which it is PID 1 (or the pod sandbox's, or the VM's). The agent keeps both namespaces
//! open ([`Namespaces`]) and every later process of the container joins them, so an exec
//! sees what the first process sees. Before the first process runs, the agent writes the
//! pod's sysctls and hostname into the VM, whose IPC, network and UTS namespaces are the
//! pod's.
//!
//! Every process then gets, between `fork` and `exec` ([`ChildSteps`]): its OOM score
//! adjustment, resource limits and umask, the bounding set cut
//! to the one asked for, its user, group and exactly the supplementary groups asked for
//! (the permitted set kept across `setuid`), its effective, permitted and inheritable sets,
//! its ambient capabilities, `no_new_privs` when asked, and the seccomp filter. As runc
//! does, a process without `no_new_privs` gets its filter before it drops `CAP_SYS_ADMIN`
//! (installing a filter needs one or the other), so such a profile must allow what the
//! switch of identity calls (`setgroups`, `setgid`, `setuid`, `capset`, `prctl`).

pub mod seccomp;

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use vm_sync::Lock;

use super::Agent;
use super::reaper::{Reaper, ReaperError};
use super::sys::{proc as sys_proc, secure};
use super::user::Ids;
use vm_agent_protocol::container::{
    CAP_LAST, CapSets, Confine, ConfineError, ContainerInit, PidNamespace, Rlimit,
};
use vm_agent_protocol::protocol::ErrorKind;

/// The key of the container that runs in the VM's own root.
const VM_ROOT: &str = "/";

/// Why a container's process cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("a container's process runs only where the agent is PID 1")]
    NotPid1,
    #[error("confinement")]
    Confine(#[source] ConfineError),
    #[error("confinement")]
    Seccomp(#[source] seccomp::SeccompError),
    #[error("the container at {0:?} has no first process yet: start it before an exec")]
    NotStarted(String),
    #[error("the pod's PID namespace: the pod's sandbox has not started")]
    NoPod,
    #[error("the pod's sandbox runs in the VM's own root: it cannot share its own namespace")]
    PodOfItself,
    #[error("sysctl {name}")]
    Sysctl {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("hostname {name:?}")]
    Hostname {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0:?} holds a NUL byte")]
    Nul(String),
    #[error("reading the flags of the container's root {path}")]
    RootFlags {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl ContainerError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ContainerError::NotPid1 => ErrorKind::Unsupported,
            ContainerError::Confine(_)
            | ContainerError::Seccomp(_)
            | ContainerError::PodOfItself
            | ContainerError::Nul(_) => ErrorKind::BadRequest,
            ContainerError::NotStarted(_) | ContainerError::NoPod => ErrorKind::NotFound,
            ContainerError::Sysctl { .. }
            | ContainerError::Hostname { .. }
            | ContainerError::RootFlags { .. } => ErrorKind::Io,
        }
    }
}

/// A container's namespaces, open while the agent keeps the container.
#[derive(Debug)]
pub struct ContainerNs {
    mnt: OwnedFd,
    /// `None`: the VM's own PID namespace.
    pid: Option<OwnedFd>,
}

/// The containers' namespaces, by root (see the module docs).
#[derive(Debug, Default)]
pub struct Namespaces(Mutex<HashMap<String, Arc<ContainerNs>>>);

impl Namespaces {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ContainerNs>>> {
        self.0.locked()
    }

    fn get(&self, key: &str) -> Option<Arc<ContainerNs>> {
        self.map().get(key).cloned()
    }

    /// Forgets the container at `root` (its namespaces close with its last process).
    pub fn remove(&self, root: &str) {
        self.map().remove(root);
    }

    /// Records the namespaces of `pid`, the container's first process, just started (still
    /// unreaped: the reaper's lock is held).
    fn record(&self, key: &str, pid: i32, with_pid_ns: bool) {
        let open =
            |ns: &str| std::fs::File::open(format!("/proc/{pid}/ns/{ns}")).map(OwnedFd::from);
        let opened = open("mnt").and_then(|mnt| {
            let pid = with_pid_ns.then(|| open("pid")).transpose()?;
            Ok(ContainerNs { mnt, pid })
        });
        match opened {
            Ok(ns) => {
                self.map().insert(key.to_string(), Arc::new(ns));
            }
            Err(error) => {
                // It already ended: its execs find no container, as they should.
                tracing::debug!(key, pid, %error, "container namespaces");
                self.map().remove(key);
            }
        }
    }
}

/// Where the process is born for PIDs (done on the spawning thread, before the fork).
#[derive(Debug)]
enum PidStep {
    Stay,
    New,
    Join(Arc<ContainerNs>),
}

/// The mount namespace steps of the child.
#[derive(Debug, Clone)]
enum MountSteps {
    /// The container's first process: a namespace of its own (see the module docs).
    Init {
        root: Option<CString>,
        proc_: bool,
        /// The root's flags to keep, when it is to be read-only.
        readonly_root: Option<libc::c_ulong>,
        writable: Vec<CString>,
        readonly: Vec<CString>,
        masked: Vec<CString>,
    },
    /// A later process: the first one's namespace.
    Join(Arc<ContainerNs>),
}

/// What the child does between `fork` and `exec`; allocated before the fork.
#[derive(Clone)]
pub struct ChildSteps {
    mounts: MountSteps,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
    caps: CapSets,
    no_new_privs: bool,
    filters: Vec<Vec<libc::sock_filter>>,
    rlimits: Vec<Rlimit>,
    umask: Option<u32>,
    /// The decimal `oom_score_adj` to write, when one was asked for.
    oom_score_adj: Option<Vec<u8>>,
}

impl std::fmt::Debug for ChildSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildSteps")
            .field("mounts", &self.mounts)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("groups", &self.groups)
            .field("caps", &self.caps)
            .field("no_new_privs", &self.no_new_privs)
            .field("filters", &self.filters.len())
            .field("rlimits", &self.rlimits)
            .field("umask", &self.umask)
            .finish_non_exhaustive()
    }
}

/// A container's process, prepared (see the module docs).
#[derive(Debug)]
pub struct Prepared {
    pub child: ChildSteps,
    pid: PidStep,
    /// The first process: its namespaces are recorded under this key once it runs.
    record: Option<(Arc<Namespaces>, String)>,
}

fn cstring(s: &str) -> Result<CString, ContainerError> {
    CString::new(s).map_err(|_| ContainerError::Nul(s.chars().take(128).collect()))
}

fn cstrings(list: &[String]) -> Result<Vec<CString>, ContainerError> {
    list.iter().map(|s| cstring(s)).collect()
}

/// Writes the pod's sysctls and hostname into the VM (see the module docs).
fn set_pod_wide(init: &ContainerInit) -> Result<(), ContainerError> {
    for (name, value) in &init.sysctls {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, value.as_bytes()))
            .map_err(|source| ContainerError::Sysctl {
                name: name.clone(),
                source,
            })?;
    }
    if let Some(name) = &init.hostname {
        sys_proc::set_hostname(name).map_err(|source| ContainerError::Hostname {
            name: name.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Prepares the process `confine` describes, in the container at `root` (`None`: the VM's
/// own root), for the identity `ids` (`None`: root).
pub fn prepare(
    agent: &Agent,
    root: Option<&str>,
    confine: &Confine,
    ids: Option<&Ids>,
) -> Result<Prepared, ContainerError> {
    if !agent.is_pid1() {
        return Err(ContainerError::NotPid1);
    }
    confine.check().map_err(ContainerError::Confine)?;
    let filters = match &confine.seccomp {
        Some(profile) => seccomp::compile(profile)
            .map_err(ContainerError::Seccomp)?
            .iter()
            .map(seccomp::to_kernel)
            .collect(),
        None => Vec::new(),
    };
    let key = root.unwrap_or(VM_ROOT);
    let namespaces = agent.namespaces();
    let (mounts, pid, record) = match &confine.init {
        None => {
            let ns = namespaces
                .get(key)
                .ok_or_else(|| ContainerError::NotStarted(key.to_string()))?;
            let pid = match ns.pid {
                Some(_) => PidStep::Join(ns.clone()),
                None => PidStep::Stay,
            };
            (MountSteps::Join(ns), pid, None)
        }
        Some(init) => {
            let pid = match (init.pid, root) {
                (PidNamespace::Own, _) => PidStep::New,
                (PidNamespace::Vm, _) => PidStep::Stay,
                (PidNamespace::Pod, None) => return Err(ContainerError::PodOfItself),
                (PidNamespace::Pod, Some(_)) => {
                    let pod = namespaces.get(VM_ROOT).ok_or(ContainerError::NoPod)?;
                    match pod.pid {
                        Some(_) => PidStep::Join(pod),
                        None => PidStep::Stay,
                    }
                }
            };
            let root_c = root.map(cstring).transpose()?;
            let readonly_root = match init.readonly_root {
                false => None,
                true => {
                    let at = root_c.clone().unwrap_or_else(|| c"/".into());
                    let flags =
                        secure::mount_flags(&at).map_err(|source| ContainerError::RootFlags {
                            path: key.to_string(),
                            source,
                        })?;
                    Some(flags)
                }
            };
            set_pod_wide(init)?;
            let mounts = MountSteps::Init {
                root: root_c,
                proc_: !matches!(pid, PidStep::Stay),
                readonly_root,
                writable: cstrings(&init.writable)?,
                readonly: cstrings(&init.readonly)?,
                masked: cstrings(&init.masked)?,
            };
            (mounts, pid, Some((namespaces, key.to_string())))
        }
    };
    let (uid, gid) = ids.map_or((0, 0), |i| (i.uid, i.gid));
    Ok(Prepared {
        child: ChildSteps {
            mounts,
            uid,
            gid,
            groups: confine.groups.clone(),
            caps: confine.caps,
            no_new_privs: confine.no_new_privs,
            filters,
            rlimits: confine.rlimits.clone(),
            umask: confine.umask,
            oom_score_adj: confine.oom_score_adj.map(|a| a.to_string().into_bytes()),
        },
        pid,
        record,
    })
}

/// `r`, except that `ENOENT` (the path is not in this root) is fine.
fn unless_missing(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

impl ChildSteps {
    /// Runs in the child between `fork` and `exec`, after it joined its cgroup: the mount
    /// namespace, the working directory `cwd` (inside the container), then the identity,
    /// capabilities and seccomp filter. Async-signal-safe: it only makes system calls on
    /// what was allocated before the fork.
    pub fn run(&self, cwd: &std::ffi::CStr) -> std::io::Result<()> {
        match &self.mounts {
            MountSteps::Init {
                root,
                proc_,
                readonly_root,
                writable,
                readonly,
                masked,
            } => {
                secure::private_mounts()?;
                if let Some(root) = root {
                    secure::pivot_here(root)?;
                }
                if *proc_ {
                    secure::mount_proc()?;
                }
                if let Some(keep) = readonly_root {
                    for w in writable {
                        unless_missing(secure::bind_self(w, false))?;
                    }
                    secure::remount_read_only(c"/", *keep)?;
                }
                for p in readonly {
                    match secure::bind_self(p, true) {
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                        r => r?,
                    }
                    secure::remount_read_only(p, secure::mount_flags(p)?)?;
                }
                for p in masked {
                    secure::mask(p)?;
                }
            }
            MountSteps::Join(ns) => secure::setns(ns.mnt.as_fd(), libc::CLONE_NEWNS)?,
        }
        secure::chdir(cwd)?;
        // As root still: lowering the OOM score and raising a hard limit need it.
        if let Some(adj) = &self.oom_score_adj
            && !sys_proc::write_file_raw(c"/proc/self/oom_score_adj", adj)
        {
            return Err(std::io::Error::last_os_error());
        }
        for r in &self.rlimits {
            secure::set_rlimit(r.resource, r.soft, r.hard)?;
        }
        if let Some(mask) = self.umask {
            secure::set_umask(mask);
        }
        if !self.no_new_privs {
            self.install_filters()?;
        }
        let caps = &self.caps;
        for cap in 0..=CAP_LAST {
            if caps.bounding & (1 << cap) == 0 {
                match sys_proc::drop_bounding_cap(libc::c_ulong::from(cap)) {
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    r => r?,
                }
            }
        }
        secure::keep_caps(true)?;
        sys_proc::set_ids(&self.groups, self.gid, self.uid)?;
        secure::keep_caps(false)?;
        secure::capset(caps.effective, caps.permitted, caps.inheritable)?;
        for cap in 0..=CAP_LAST {
            if caps.ambient & (1 << cap) != 0 {
                secure::raise_ambient(cap)?;
            }
        }
        if self.no_new_privs {
            sys_proc::set_no_new_privs()?;
            self.install_filters()?;
        }
        Ok(())
    }

    fn install_filters(&self) -> std::io::Result<()> {
        for f in &self.filters {
            secure::install_filter(f)?;
        }
        Ok(())
    }
}

impl Prepared {
    /// Spawns `cmd` (whose `pre_exec` runs [`ChildSteps::run`]) in the PID namespace asked
    /// for: on a thread of its own that first enters it (`unshare`/`setns` of a PID namespace
    /// only change where the thread's children are born), then records the first process's
    /// namespaces before the reaper can reap it.
    pub fn spawn(
        &self,
        reaper: &Reaper,
        cmd: &mut std::process::Command,
    ) -> Result<super::reaper::Spawned, ReaperError> {
        let with_pid_ns = !matches!(self.pid, PidStep::Stay);
        let mut go = || {
            match &self.pid {
                PidStep::Stay => {}
                PidStep::New => secure::unshare(libc::CLONE_NEWPID).map_err(ReaperError::Spawn)?,
                PidStep::Join(ns) => {
                    if let Some(fd) = &ns.pid {
                        secure::setns(fd.as_fd(), libc::CLONE_NEWPID)
                            .map_err(ReaperError::Spawn)?;
                    }
                }
            }
            reaper.spawn_then(cmd, |pid| {
                if let Some((table, key)) = &self.record {
                    table.record(key, pid, with_pid_ns);
                }
            })
        };
        match self.pid {
            PidStep::Stay => go(),
            _ => std::thread::scope(|s| s.spawn(go).join()).unwrap_or_else(|_| {
                Err(ReaperError::Spawn(std::io::Error::other(
                    "the spawning thread panicked",
                )))
            }),
        }
    }
}
