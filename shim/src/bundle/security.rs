//! The bundle's security fields → how the guest confines the container's processes
//! ([`Confine`], enforced by the agent), or a refusal naming the field: nothing is accepted
//! and dropped.
//!
//! Per process (`process`, the container's or an exec's): the five capability sets (within
//! containerd's default set: more is privileged, refused by design), `noNewPrivileges`,
//! `user.additionalGids`, `user.umask`, `rlimits`, `oomScoreAdj`; `apparmorProfile` and
//! `selinuxLabel` are refused (the guest has neither). Per container: `linux.seccomp`
//! (compiled by the agent; a notify action or listener is refused), `root.readonly`,
//! `linux.maskedPaths`, `linux.readonlyPaths`, the PID namespace, and the pod-wide
//! `linux.sysctl` (namespaced ones only: the VM's IPC and network namespaces are the pod's)
//! and `hostname`; the host's IPC or UTS namespace, user namespaces, `mountLabel`,
//! `intelRdt`, `personality` and shared root propagation are refused.

use serde_json::Value;
use vm_sandbox::agent::container::{
    CapSets, Confine, ContainerInit, PidNamespace, Rlimit, SeccompAction, SeccompArg, SeccompOp,
    SeccompProfile, SeccompRule,
};

use super::pod::PodRole;
use super::{bad, refused, strings};
use crate::error::ShimError;

/// Capabilities containerd gives a container by default; more is refused.
pub const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Linux's capability names, by number (`capability.h`).
const CAP_NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// Sysctls that live in a namespace the pod's VM has for the pod alone (runc's list): the
/// IPC namespace's, the network namespace's (`net.*`) and the UTS namespace's.
const IPC_SYSCTLS: &[&str] = &[
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
    "kernel.shmall",
    "kernel.shmmax",
    "kernel.shmmni",
    "kernel.shm_rmid_forced",
    "kernel.hostname",
    "kernel.domainname",
];

/// `RLIMIT_*` names, by number.
const RLIMITS: [&str; 16] = [
    "RLIMIT_CPU",
    "RLIMIT_FSIZE",
    "RLIMIT_DATA",
    "RLIMIT_STACK",
    "RLIMIT_CORE",
    "RLIMIT_RSS",
    "RLIMIT_NPROC",
    "RLIMIT_NOFILE",
    "RLIMIT_MEMLOCK",
    "RLIMIT_AS",
    "RLIMIT_LOCKS",
    "RLIMIT_SIGPENDING",
    "RLIMIT_MSGQUEUE",
    "RLIMIT_NICE",
    "RLIMIT_RTPRIO",
    "RLIMIT_RTTIME",
];

/// The per-process part of the confinement of `p` (a `process` object): see the module docs.
pub fn process(p: &Value) -> Result<Confine, ShimError> {
    for field in ["apparmorProfile", "selinuxLabel"] {
        if p[field].as_str().is_some_and(|s| !s.is_empty()) {
            return Err(refused(
                format!("process.{field}"),
                "the guest kernel has no AppArmor or SELinux",
            ));
        }
    }
    let groups = match &p["user"]["additionalGids"] {
        Value::Null => Vec::new(),
        Value::Array(list) => list
            .iter()
            .map(|g| g.as_u64().and_then(|g| u32::try_from(g).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("process.user.additionalGids", "not a list of group ids"))?,
        _ => return Err(bad("process.user.additionalGids", "not a list")),
    };
    let umask = match &p["user"]["umask"] {
        Value::Null => None,
        v => Some(
            v.as_u64()
                .filter(|m| *m <= 0o777)
                .ok_or_else(|| bad("process.user.umask", "not a mode"))? as u32,
        ),
    };
    let oom_score_adj = match &p["oomScoreAdj"] {
        Value::Null => None,
        v => Some(
            v.as_i64()
                .filter(|a| (-1000..=1000).contains(a))
                .ok_or_else(|| bad("process.oomScoreAdj", "not in -1000..=1000"))?
                as i32,
        ),
    };
    Ok(Confine {
        caps: caps(p)?,
        no_new_privs: p["noNewPrivileges"].as_bool().unwrap_or(false),
        groups,
        rlimits: rlimits(&p["rlimits"])?,
        umask,
        oom_score_adj,
        ..Confine::default()
    })
}

/// The capability sets of `p` (a `process` object), each within [`DEFAULT_CAPS`].
fn caps(p: &Value) -> Result<CapSets, ShimError> {
    let mut sets = CapSets::default();
    for (set, bits) in [
        ("bounding", &mut sets.bounding),
        ("effective", &mut sets.effective),
        ("permitted", &mut sets.permitted),
        ("inheritable", &mut sets.inheritable),
        ("ambient", &mut sets.ambient),
    ] {
        let field = format!("process.capabilities.{set}");
        for (i, cap) in strings(&p["capabilities"][set], &field)?.iter().enumerate() {
            if !DEFAULT_CAPS.contains(&cap.as_str()) {
                let why = match CAP_NAMES.contains(&cap.as_str()) {
                    true => format!(
                        "{cap} is beyond the default set (privileged or an added capability)"
                    ),
                    false => format!("{cap} is not a Linux capability"),
                };
                return Err(refused(format!("{field}[{i}]"), why));
            }
            if let Some(n) = CAP_NAMES.iter().position(|c| c == cap) {
                *bits |= 1 << n;
            }
        }
    }
    Ok(sets)
}

fn rlimits(v: &Value) -> Result<Vec<Rlimit>, ShimError> {
    let Some(list) = v.as_array() else {
        return match v {
            Value::Null => Ok(Vec::new()),
            _ => Err(bad("process.rlimits", "not a list")),
        };
    };
    let mut out: Vec<Rlimit> = Vec::new();
    for (i, r) in list.iter().enumerate() {
        let field = format!("process.rlimits[{i}]");
        let ty = r["type"].as_str().unwrap_or("");
        let resource = RLIMITS
            .iter()
            .position(|n| *n == ty)
            .ok_or_else(|| refused(&field, format!("{ty:?} is not a Linux resource limit")))?
            as u32;
        let (Some(soft), Some(hard)) = (r["soft"].as_u64(), r["hard"].as_u64()) else {
            return Err(bad(&field, "soft and hard must be numbers"));
        };
        if soft > hard || out.iter().any(|o| o.resource == resource) {
            return Err(bad(&field, "soft above hard, or a resource listed twice"));
        }
        out.push(Rlimit {
            resource,
            soft,
            hard,
        });
    }
    Ok(out)
}

/// What the container's first process sets up ([`ContainerInit`]) for a bundle of `role`
/// (that passed [`refuse_unsupported`]); `writable` are the files copied into its root that
/// stay writable.
pub fn container(
    doc: &Value,
    role: &PodRole,
    writable: Vec<String>,
) -> Result<ContainerInit, ShimError> {
    let linux = &doc["linux"];
    let paths = |field: &str| -> Result<Vec<String>, ShimError> {
        let name = format!("linux.{field}");
        let list = strings(&linux[field], &name)?;
        if let Some(p) = list
            .iter()
            .find(|p| !vm_sandbox::agent::container::plain_path(p))
        {
            return Err(refused(
                name,
                format!("{p:?} is not an absolute path without .."),
            ));
        }
        Ok(list)
    };
    let hostname = match doc["hostname"].as_str() {
        None | Some("") => None,
        Some(h) => Some(h.to_string()),
    };
    Ok(ContainerInit {
        pid: pid_namespace(doc, role)?,
        readonly_root: doc["root"]["readonly"].as_bool().unwrap_or(false),
        writable,
        masked: paths("maskedPaths")?,
        readonly: paths("readonlyPaths")?,
        sysctls: sysctls(&linux["sysctl"])?,
        hostname,
    })
}

/// The namespace entry of `ty`, if the bundle lists one: `Some(path)` (`""` without one).
fn namespace<'a>(doc: &'a Value, ty: &str) -> Option<&'a str> {
    let ns = doc["linux"]["namespaces"].as_array()?;
    let entry = ns.iter().find(|n| n["type"] == ty)?;
    Some(entry["path"].as_str().unwrap_or(""))
}

/// Where the container's processes live for PIDs: a namespace of their own (a `pid` entry
/// without a path), the pod sandbox's (a pod member's entry with the sandbox's path:
/// `shareProcessNamespace`), or the VM's (no entry: `hostPID`; the pod's VM is its host).
fn pid_namespace(doc: &Value, role: &PodRole) -> Result<PidNamespace, ShimError> {
    match (namespace(doc, "pid"), role) {
        (None, _) => Ok(PidNamespace::Vm),
        (Some(""), _) => Ok(PidNamespace::Own),
        (Some(_), PodRole::Member { .. }) => Ok(PidNamespace::Pod),
        (Some(path), _) => Err(refused(
            "linux.namespaces (pid)",
            format!("{path}: a host PID namespace cannot be joined from the VM"),
        )),
    }
}

fn sysctls(v: &Value) -> Result<Vec<(String, String)>, ShimError> {
    let Some(map) = v.as_object() else {
        return match v {
            Value::Null => Ok(Vec::new()),
            _ => Err(bad("linux.sysctl", "not a map")),
        };
    };
    let mut out = Vec::new();
    for (name, value) in map {
        let field = format!("linux.sysctl.{name}");
        let namespaced = IPC_SYSCTLS.contains(&name.as_str())
            || name.starts_with("fs.mqueue.")
            || name.starts_with("net.");
        if !namespaced || !vm_sandbox::agent::container::sysctl_name(name) {
            return Err(refused(
                field,
                "not a namespaced sysctl (only the IPC, network and UTS ones are the pod's)",
            ));
        }
        let value = value.as_str().ok_or_else(|| bad(&field, "not a string"))?;
        out.push((name.clone(), value.to_string()));
    }
    Ok(out)
}

/// The fields whose meaning the guest cannot give, refused by name.
pub fn refuse_unsupported(doc: &Value) -> Result<(), ShimError> {
    let linux = &doc["linux"];
    for (ty, what) in [
        ("ipc", "the host's IPC namespace (a hostIPC pod)"),
        ("uts", "the host's UTS namespace (its hostname)"),
    ] {
        if namespace(doc, ty).is_none() {
            return Err(refused(
                format!("linux.namespaces ({ty})"),
                format!("no {ty} namespace means {what}; untrusted work gets the VM's own"),
            ));
        }
    }
    if namespace(doc, "user").is_some() || !linux["uidMappings"].is_null() {
        return Err(refused(
            "linux.namespaces (user)",
            "user namespaces are not supported in the guest",
        ));
    }
    for field in ["mountLabel", "intelRdt", "personality"] {
        let set = match &linux[field] {
            Value::Null => false,
            Value::String(s) => !s.is_empty(),
            _ => true,
        };
        if set {
            return Err(refused(
                format!("linux.{field}"),
                "not supported in the guest",
            ));
        }
    }
    if let Some(p) = linux["rootfsPropagation"].as_str()
        && p.contains("shared")
    {
        return Err(refused(
            "linux.rootfsPropagation",
            format!("{p}: nothing propagates between the host and the VM"),
        ));
    }
    Ok(())
}

/// The container's seccomp profile (`linux.seccomp`), if it has one.
pub fn seccomp(doc: &Value) -> Result<Option<SeccompProfile>, ShimError> {
    let s = &doc["linux"]["seccomp"];
    if s.is_null() {
        return Ok(None);
    }
    if s["listenerPath"].as_str().is_some_and(|p| !p.is_empty()) {
        return Err(refused(
            "linux.seccomp.listenerPath",
            "seccomp notification needs a host agent; not supported",
        ));
    }
    let arches = strings(&s["architectures"], "linux.seccomp.architectures")?;
    if !arches.is_empty() && !arches.iter().any(|a| a == "SCMP_ARCH_X86_64") {
        return Err(refused(
            "linux.seccomp.architectures",
            "the guest is x86-64 and the profile does not name SCMP_ARCH_X86_64",
        ));
    }
    for (i, flag) in strings(&s["flags"], "linux.seccomp.flags")?
        .iter()
        .enumerate()
    {
        // TSYNC: the filter is installed before the process has a second thread; SPEC_ALLOW:
        // the guest kernel has no speculation mitigations to keep.
        if ![
            "SECCOMP_FILTER_FLAG_TSYNC",
            "SECCOMP_FILTER_FLAG_SPEC_ALLOW",
        ]
        .contains(&flag.as_str())
        {
            return Err(refused(
                format!("linux.seccomp.flags[{i}]"),
                format!("{flag} is not supported"),
            ));
        }
    }
    let errno = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    let default_action = action(
        s["defaultAction"].as_str().unwrap_or(""),
        errno(&s["defaultErrnoRet"]),
        "linux.seccomp.defaultAction",
    )?;
    let mut rules = Vec::new();
    for (i, r) in s["syscalls"].as_array().into_iter().flatten().enumerate() {
        let field = format!("linux.seccomp.syscalls[{i}]");
        let names = strings(&r["names"], &format!("{field}.names"))?;
        let action = action(
            r["action"].as_str().unwrap_or(""),
            errno(&r["errnoRet"]),
            &format!("{field}.action"),
        )?;
        let mut args = Vec::new();
        for (j, a) in r["args"].as_array().into_iter().flatten().enumerate() {
            args.push(arg(a, &format!("{field}.args[{j}]"))?);
        }
        rules.push(SeccompRule {
            names,
            action,
            args,
        });
    }
    let profile = SeccompProfile {
        default_action,
        rules,
    };
    let check = Confine {
        seccomp: Some(profile),
        ..Confine::default()
    };
    check
        .check()
        .map_err(|e| refused("linux.seccomp", e.to_string()))?;
    Ok(check.seccomp)
}

fn action(name: &str, errno: Option<u32>, field: &str) -> Result<SeccompAction, ShimError> {
    const EPERM: u32 = 1;
    Ok(match name {
        "SCMP_ACT_ALLOW" => SeccompAction::Allow,
        "SCMP_ACT_ERRNO" => SeccompAction::Errno(errno.unwrap_or(EPERM)),
        "SCMP_ACT_KILL" | "SCMP_ACT_KILL_THREAD" => SeccompAction::KillThread,
        "SCMP_ACT_KILL_PROCESS" => SeccompAction::KillProcess,
        "SCMP_ACT_TRAP" => SeccompAction::Trap,
        "SCMP_ACT_TRACE" => SeccompAction::Trace(errno.unwrap_or(EPERM)),
        "SCMP_ACT_LOG" => SeccompAction::Log,
        "SCMP_ACT_NOTIFY" => {
            return Err(refused(
                field,
                "SCMP_ACT_NOTIFY needs a host agent; not supported",
            ));
        }
        other => return Err(refused(field, format!("{other:?} is not a seccomp action"))),
    })
}

fn arg(a: &Value, field: &str) -> Result<SeccompArg, ShimError> {
    let op = match a["op"].as_str().unwrap_or("") {
        "SCMP_CMP_EQ" => SeccompOp::Eq,
        "SCMP_CMP_NE" => SeccompOp::Ne,
        "SCMP_CMP_LT" => SeccompOp::Lt,
        "SCMP_CMP_LE" => SeccompOp::Le,
        "SCMP_CMP_GT" => SeccompOp::Gt,
        "SCMP_CMP_GE" => SeccompOp::Ge,
        "SCMP_CMP_MASKED_EQ" => SeccompOp::MaskedEq,
        other => return Err(refused(field, format!("{other:?} is not a comparison"))),
    };
    let index = a["index"]
        .as_u64()
        .filter(|i| *i <= 5)
        .ok_or_else(|| bad(field, "index is not 0..=5"))? as u8;
    Ok(SeccompArg {
        index,
        op,
        value: a["value"].as_u64().unwrap_or(0),
        value_two: a["valueTwo"].as_u64().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn caps_of(list: &[&str]) -> Value {
        json!({"capabilities": {"bounding": list, "effective": list, "permitted": list}})
    }

    #[test]
    fn the_default_capabilities_are_the_bits_of_their_numbers() {
        let c = process(&caps_of(DEFAULT_CAPS)).unwrap().caps;
        assert_eq!(c.bounding, 0xa804_25fb, "Docker's default set");
        assert_eq!((c.effective, c.inheritable, c.ambient), (0xa804_25fb, 0, 0));
        let c = process(&caps_of(&["CAP_KILL"])).unwrap().caps;
        assert_eq!(c.bounding, 1 << 5);
        assert_eq!(
            process(&json!({})).unwrap().caps,
            CapSets::default(),
            "none"
        );
    }

    #[test]
    fn more_than_the_default_capabilities_is_refused_by_name() {
        let e = process(&caps_of(&["CAP_KILL", "CAP_SYS_ADMIN"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("process.capabilities.bounding[1]: CAP_SYS_ADMIN is beyond the default set"),
            "{e}"
        );
        let e = process(&json!({"capabilities": {"ambient": ["CAP_FLY"]}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ambient[0]: CAP_FLY is not a Linux capability"),
            "{e}"
        );
    }

    #[test]
    fn process_fields_become_the_confinement() {
        let p = json!({
            "noNewPrivileges": true,
            "user": {"uid": 1000, "gid": 1000, "additionalGids": [1234, 5678], "umask": 0o27},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 512}],
            "oomScoreAdj": 500,
        });
        let c = process(&p).unwrap();
        assert!(c.no_new_privs);
        assert_eq!(c.groups, [1234, 5678]);
        assert_eq!((c.umask, c.oom_score_adj), (Some(0o27), Some(500)));
        assert_eq!(
            c.rlimits,
            [Rlimit {
                resource: 7,
                soft: 512,
                hard: 1024
            }]
        );
        assert!(!process(&json!({})).unwrap().no_new_privs, "as given: off");
        for (p, named) in [
            (json!({"apparmorProfile": "x"}), "process.apparmorProfile"),
            (json!({"selinuxLabel": "x"}), "process.selinuxLabel"),
            (
                json!({"rlimits": [{"type": "RLIMIT_FOO", "hard": 1, "soft": 1}]}),
                "rlimits[0]",
            ),
            (
                json!({"rlimits": [{"type": "RLIMIT_CPU", "hard": 1, "soft": 2}]}),
                "rlimits[0]",
            ),
            (json!({"user": {"additionalGids": [-1]}}), "additionalGids"),
            (json!({"oomScoreAdj": 1001}), "oomScoreAdj"),
        ] {
            let e = process(&p).unwrap_err().to_string();
            assert!(e.contains(named), "{p}: {e}");
        }
    }

    fn with_ns(ns: Value) -> Value {
        json!({"linux": {"namespaces": ns}})
    }

    fn all_ns() -> Value {
        json!([{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "network", "path": "/n"}])
    }

    #[test]
    fn the_pid_namespace_is_own_the_pods_or_the_vms() {
        let member = PodRole::Member {
            sandbox: "s".into(),
        };
        let init = |doc: &Value, role: &PodRole| container(doc, role, vec![]).map(|i| i.pid);
        assert_eq!(
            init(&with_ns(all_ns()), &PodRole::Sandbox).unwrap(),
            PidNamespace::Own
        );
        let shared =
            json!([{"type": "pid", "path": "/proc/9/ns/pid"}, {"type": "ipc"}, {"type": "uts"}]);
        assert_eq!(
            init(&with_ns(shared.clone()), &member).unwrap(),
            PidNamespace::Pod
        );
        let host = json!([{"type": "ipc"}, {"type": "uts"}]);
        assert_eq!(init(&with_ns(host), &member).unwrap(), PidNamespace::Vm);
        let e = init(&with_ns(shared), &PodRole::Alone)
            .unwrap_err()
            .to_string();
        assert!(e.contains("linux.namespaces (pid)"), "{e}");
    }

    #[test]
    fn the_hosts_ipc_uts_and_user_namespaces_are_refused_by_name() {
        for (ns, named) in [
            (json!([{"type": "uts"}]), "linux.namespaces (ipc)"),
            (json!([{"type": "ipc"}]), "linux.namespaces (uts)"),
            (
                json!([{"type": "ipc"}, {"type": "uts"}, {"type": "user"}]),
                "linux.namespaces (user)",
            ),
        ] {
            let e = refuse_unsupported(&with_ns(ns)).unwrap_err().to_string();
            assert!(e.contains(named), "{e}");
        }
        let mut doc = with_ns(all_ns());
        doc["linux"]["rootfsPropagation"] = json!("rshared");
        let e = refuse_unsupported(&doc).unwrap_err().to_string();
        assert!(e.contains("linux.rootfsPropagation"), "{e}");
        refuse_unsupported(&with_ns(all_ns())).unwrap();
    }

    #[test]
    fn container_fields_become_what_its_first_process_sets_up() {
        let mut doc = with_ns(all_ns());
        doc["root"] = json!({"readonly": true});
        doc["hostname"] = json!("web-1");
        doc["linux"]["maskedPaths"] = json!(["/proc/kcore"]);
        doc["linux"]["readonlyPaths"] = json!(["/proc/sys"]);
        doc["linux"]["sysctl"] =
            json!({"kernel.shm_rmid_forced": "1", "net.core.somaxconn": "1024"});
        let i = container(&doc, &PodRole::Sandbox, vec!["/etc/hosts".into()]).unwrap();
        assert!(i.readonly_root);
        assert_eq!(i.hostname.as_deref(), Some("web-1"));
        assert_eq!(
            (i.masked.len(), i.readonly.len(), i.sysctls.len()),
            (1, 1, 2)
        );
        assert_eq!(i.writable, ["/etc/hosts"]);
        doc["linux"]["sysctl"] = json!({"vm.swappiness": "10"});
        let e = container(&doc, &PodRole::Sandbox, vec![])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("linux.sysctl.vm.swappiness: not a namespaced sysctl"),
            "{e}"
        );
        doc["linux"]["sysctl"] = json!({});
        doc["linux"]["maskedPaths"] = json!(["proc/kcore"]);
        let e = container(&doc, &PodRole::Sandbox, vec![])
            .unwrap_err()
            .to_string();
        assert!(e.contains("linux.maskedPaths"), "{e}");
    }

    fn seccomp_doc(s: Value) -> Value {
        json!({"linux": {"seccomp": s}})
    }

    #[test]
    fn a_seccomp_profile_is_translated_rule_by_rule() {
        assert_eq!(seccomp(&json!({})).unwrap(), None);
        let doc = seccomp_doc(json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "defaultErrnoRet": 1,
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "flags": ["SECCOMP_FILTER_FLAG_TSYNC"],
            "syscalls": [
                {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
                {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                 "args": [{"index": 0, "value": 131072, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
            ],
        }));
        let p = seccomp(&doc).unwrap().unwrap();
        assert_eq!(p.default_action, SeccompAction::Errno(1));
        assert_eq!(p.rules[1].action, SeccompAction::Errno(38));
        assert_eq!(p.rules[2].args[0].op, SeccompOp::Eq);
        assert_eq!(p.rules[2].args[0].value, 131_072);
        let plain = seccomp_doc(json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["chmod"], "action": "SCMP_ACT_ERRNO"}]}));
        let p = seccomp(&plain).unwrap().unwrap();
        assert_eq!(
            p.rules[0].action,
            SeccompAction::Errno(1),
            "EPERM by default"
        );
    }

    #[test]
    fn a_seccomp_profile_the_guest_cannot_honour_is_refused_by_name() {
        for (s, named) in [
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
                    {"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]}),
                "linux.seccomp.syscalls[0].action: SCMP_ACT_NOTIFY",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_NOTIFY"}),
                "linux.seccomp.defaultAction",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/l.sock"}),
                "linux.seccomp.listenerPath",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_AARCH64"]}),
                "linux.seccomp.architectures",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_LOG"]}),
                "linux.seccomp.flags[0]",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["x"],
                    "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "op": "SCMP_CMP_SOME"}]}]}),
                "linux.seccomp.syscalls[0].args[0]",
            ),
        ] {
            let e = seccomp(&seccomp_doc(s.clone())).unwrap_err().to_string();
            assert!(e.contains(named), "{s}: {e}");
        }
    }
}
