//! What a container's processes are confined by inside the guest: the wire types of
//! [`crate::protocol::Request::ExecContainer`] and their bounds.
//!
//! A container runtime (the shim) turns an OCI bundle's security fields into a [`Confine`]:
//! the capability sets, `noNewPrivileges`, the supplementary groups and the seccomp profile
//! apply to every process; the container's first process ([`Confine::init`]) also makes the
//! container's mount namespace (read-only root, masked and read-only paths, a `/proc` of its
//! PID namespace) and its PID namespace, which every later process of the container joins.
//! Every list is bounded ([`Confine::check`]): the agent refuses a request past the bounds
//! before anything runs.

use serde::{Deserialize, Serialize};

/// The highest capability number the agent knows (`CAP_CHECKPOINT_RESTORE`, Linux 5.9).
pub const CAP_LAST: u32 = 40;
/// Most syscall rules in one seccomp profile.
pub const MAX_SECCOMP_RULES: usize = 1024;
/// Most syscall names in one seccomp profile (all rules together).
pub const MAX_SECCOMP_NAMES: usize = 4096;
/// Most argument conditions of one seccomp rule (a syscall has six arguments).
pub const MAX_SECCOMP_ARGS: usize = 6;
/// Longest syscall name.
pub const MAX_SYSCALL_NAME: usize = 64;
/// Most masked or read-only paths (each list), writable files and sysctls.
pub const MAX_PATHS: usize = 256;
/// Most supplementary groups.
pub const MAX_GROUPS: usize = 256;
/// Longest sysctl value.
pub const MAX_SYSCTL_VALUE: usize = 4096;
/// Longest hostname (the kernel's `__NEW_UTS_LEN`).
pub const MAX_HOSTNAME: usize = 64;

/// One process of a container: an interactive exec (as `ExecInteractiveIn`) run confined.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerExec {
    /// The container's root (a pod member's, set up by `PodMount::Root`) as `/`; `None`:
    /// the VM's own root (a container with a VM of its own, or a pod's sandbox).
    pub root: Option<String>,
    pub request: crate::protocol::InteractiveRequest,
    pub confine: Confine,
}

/// The five capability sets, one bit per capability number (`1 << CAP_NET_RAW`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapSets {
    pub bounding: u64,
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
    pub ambient: u64,
}

/// How a process is confined (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confine {
    pub caps: CapSets,
    /// `PR_SET_NO_NEW_PRIVS`: set-id bits and file capabilities stop working.
    pub no_new_privs: bool,
    /// The supplementary groups, exactly (OCI `process.user.additionalGids`).
    pub groups: Vec<u32>,
    /// The container's seccomp profile (`None`: unconfined).
    pub seccomp: Option<SeccompProfile>,
    /// Resource limits (`setrlimit`), at most one per resource.
    pub rlimits: Vec<Rlimit>,
    /// The file mode creation mask (`None`: the agent's, 022).
    pub umask: Option<u32>,
    /// The OOM killer's adjustment (-1000..=1000; `None`: 0).
    pub oom_score_adj: Option<i32>,
    /// `Some` for the container's first process: it makes the container's namespaces.
    pub init: Option<ContainerInit>,
}

/// One resource limit: `resource` is an `RLIMIT_*` number (below [`RLIMIT_COUNT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimit {
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
}

/// The number of resource limits Linux has (`RLIM_NLIMITS`).
pub const RLIMIT_COUNT: u32 = 16;

/// Where a container's processes live for PIDs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PidNamespace {
    /// A PID namespace of its own, its first process PID 1 in it.
    #[default]
    Own,
    /// The pod's: the namespace of the container that runs in the VM's own root (the pod's
    /// sandbox), as `shareProcessNamespace: true` asks.
    Pod,
    /// The VM's own, where the agent is PID 1 (a `hostPID` pod: the pod's VM is its host).
    Vm,
}

/// What the container's first process sets up for the whole container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerInit {
    pub pid: PidNamespace,
    /// Remount the container's root read-only (its other mounts keep their own flags).
    pub readonly_root: bool,
    /// Files of the root that stay writable when it is read-only (kubelet's `/etc/hosts`,
    /// `/etc/hostname`, `/etc/resolv.conf` copies): each is bound onto itself first.
    pub writable: Vec<String>,
    /// Hidden: `/dev/null` bound over a file, an empty read-only tmpfs over a directory.
    pub masked: Vec<String>,
    /// Bound onto themselves read-only.
    pub readonly: Vec<String>,
    /// Namespaced sysctls (`kernel.shm_rmid_forced`, `fs.mqueue.*`, `net.*`, …) written in
    /// the VM before the process starts: the pod's IPC and network namespaces are the VM's.
    pub sysctls: Vec<(String, String)>,
    /// The pod's hostname, set in the VM (the pod's UTS namespace is the VM's).
    pub hostname: Option<String>,
}

/// A seccomp profile as OCI gives it (`linux.seccomp`), for the native architecture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompProfile {
    pub default_action: SeccompAction,
    pub rules: Vec<SeccompRule>,
}

/// What a seccomp rule does with a matching call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SeccompAction {
    Allow,
    Errno(u32),
    KillThread,
    KillProcess,
    Trap,
    Trace(u32),
    Log,
}

/// The calls `names` (with every condition of `args` true) get `action`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompRule {
    pub names: Vec<String>,
    pub action: SeccompAction,
    pub args: Vec<SeccompArg>,
}

/// A comparison of argument `index` (0–5) with `value` (`MaskedEq`: `arg & value ==
/// value_two`), on all 64 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompArg {
    pub index: u8,
    pub op: SeccompOp,
    pub value: u64,
    pub value_two: u64,
}

/// A seccomp argument comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SeccompOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    MaskedEq,
}

/// Why a [`Confine`] is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfineError {
    #[error("{what}: more than {max}")]
    TooMany { what: &'static str, max: usize },
    #[error("capability bit {0} is beyond CAP_LAST ({CAP_LAST})")]
    UnknownCap(u32),
    #[error("{what} {value:?} is not valid")]
    Invalid { what: &'static str, value: String },
}

fn at_most<T>(list: &[T], what: &'static str, max: usize) -> Result<(), ConfineError> {
    match list.len() > max {
        true => Err(ConfineError::TooMany { what, max }),
        false => Ok(()),
    }
}

fn invalid(what: &'static str, value: &str) -> ConfineError {
    ConfineError::Invalid {
        what,
        value: value.chars().take(128).collect(),
    }
}

/// An absolute path without `..`, empty components or NUL (where a container path goes).
pub fn plain_path(p: &str) -> bool {
    p.starts_with('/')
        && p.len() > 1
        && p.len() <= crate::protocol::MAX_PATH_BYTES
        && !p.contains('\0')
        && p[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// A sysctl name: dot-separated parts of letters, digits, `_` and `-`.
pub fn sysctl_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

impl Confine {
    /// Every bound and shape the agent relies on (see the constants).
    pub fn check(&self) -> Result<(), ConfineError> {
        let c = &self.caps;
        let all = c.bounding | c.effective | c.permitted | c.inheritable | c.ambient;
        if all >> (CAP_LAST + 1) != 0 {
            return Err(ConfineError::UnknownCap(63 - all.leading_zeros()));
        }
        at_most(&self.groups, "supplementary groups", MAX_GROUPS)?;
        at_most(&self.rlimits, "rlimits", RLIMIT_COUNT as usize)?;
        if let Some(r) = self
            .rlimits
            .iter()
            .find(|r| r.resource >= RLIMIT_COUNT || r.soft > r.hard)
        {
            return Err(invalid("rlimit", &format!("{r:?}")));
        }
        if let Some(m) = self.umask.filter(|m| *m > 0o777) {
            return Err(invalid("umask", &format!("{m:o}")));
        }
        if let Some(a) = self.oom_score_adj.filter(|a| !(-1000..=1000).contains(a)) {
            return Err(invalid("oom_score_adj", &a.to_string()));
        }
        if let Some(s) = &self.seccomp {
            at_most(&s.rules, "seccomp rules", MAX_SECCOMP_RULES)?;
            let names: usize = s.rules.iter().map(|r| r.names.len()).sum();
            if names > MAX_SECCOMP_NAMES {
                return Err(ConfineError::TooMany {
                    what: "seccomp syscall names",
                    max: MAX_SECCOMP_NAMES,
                });
            }
            for r in &s.rules {
                at_most(&r.args, "seccomp rule arguments", MAX_SECCOMP_ARGS)?;
                if let Some(a) = r.args.iter().find(|a| a.index > 5) {
                    return Err(invalid("seccomp argument index", &a.index.to_string()));
                }
                if let Some(n) = r.names.iter().find(|n| !syscall_name(n)) {
                    return Err(invalid("syscall name", n));
                }
            }
        }
        if let Some(init) = &self.init {
            init.check()?;
        }
        Ok(())
    }
}

fn syscall_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= MAX_SYSCALL_NAME
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl ContainerInit {
    fn check(&self) -> Result<(), ConfineError> {
        for (list, what) in [
            (&self.writable, "writable files"),
            (&self.masked, "masked paths"),
            (&self.readonly, "read-only paths"),
        ] {
            at_most(list, what, MAX_PATHS)?;
            if let Some(p) = list.iter().find(|p| !plain_path(p)) {
                return Err(invalid(what, p));
            }
        }
        at_most(&self.sysctls, "sysctls", MAX_PATHS)?;
        for (name, value) in &self.sysctls {
            if !sysctl_name(name) {
                return Err(invalid("sysctl name", name));
            }
            if value.len() > MAX_SYSCTL_VALUE || value.contains(['\n', '\0']) {
                return Err(invalid("sysctl value", value));
            }
        }
        if let Some(h) = &self.hostname {
            let ok = !h.is_empty()
                && h.len() <= MAX_HOSTNAME
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
            if !ok {
                return Err(invalid("hostname", h));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init() -> ContainerInit {
        ContainerInit {
            masked: vec!["/proc/kcore".into()],
            readonly: vec!["/proc/sys".into()],
            sysctls: vec![("kernel.shm_rmid_forced".into(), "1".into())],
            hostname: Some("web-1".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_well_formed_confinement_passes() {
        let c = Confine {
            caps: CapSets {
                bounding: 1 << CAP_LAST,
                ..Default::default()
            },
            init: Some(init()),
            ..Default::default()
        };
        c.check().unwrap();
    }

    #[test]
    fn malformed_fields_are_refused_by_name() {
        let caps = Confine {
            caps: CapSets {
                ambient: 1 << 41,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(caps.check(), Err(ConfineError::UnknownCap(41)));
        for (edit, named) in [
            (
                (|i: &mut ContainerInit| i.masked.push("rel".into())) as fn(&mut ContainerInit),
                "masked paths",
            ),
            (|i| i.readonly.push("/a/../b".into()), "read-only paths"),
            (
                |i| i.sysctls.push(("a/b".into(), "1".into())),
                "sysctl name",
            ),
            (
                |i| i.sysctls.push(("a.b".into(), "1\n".into())),
                "sysctl value",
            ),
            (|i| i.hostname = Some("a b".into()), "hostname"),
            (
                |i| i.writable = vec!["/etc/hosts".into(); MAX_PATHS + 1],
                "writable files",
            ),
        ] {
            let mut i = init();
            edit(&mut i);
            let c = Confine {
                init: Some(i),
                ..Default::default()
            };
            let e = c.check().unwrap_err().to_string();
            assert!(e.contains(named), "{named}: {e}");
        }
        let seccomp = |rule: SeccompRule| Confine {
            seccomp: Some(SeccompProfile {
                default_action: SeccompAction::Allow,
                rules: vec![rule],
            }),
            ..Default::default()
        };
        let e = seccomp(SeccompRule {
            names: vec!["chmod;".into()],
            action: SeccompAction::Errno(1),
            args: vec![],
        })
        .check()
        .unwrap_err();
        assert!(e.to_string().contains("syscall name"), "{e}");
        let arg = SeccompArg {
            index: 6,
            op: SeccompOp::Eq,
            value: 0,
            value_two: 0,
        };
        let e = seccomp(SeccompRule {
            names: vec!["chmod".into()],
            action: SeccompAction::Errno(1),
            args: vec![arg],
        })
        .check()
        .unwrap_err();
        assert!(e.to_string().contains("argument index"), "{e}");
    }
}
