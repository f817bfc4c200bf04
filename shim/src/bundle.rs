//! The OCI bundle's `config.json` → what one container's VM runs, with the refusals.
//!
//! Honoured: `process.args`, `env`, `cwd`, `user.uid`/`gid`, `terminal`; read-only bind
//! mounts (→ read-only disks); kubelet's files (writable, or the CRI sandbox's read-only
//! `/etc/resolv.conf`), `emptyDir` binds, the CRI's pod shm and `tmpfs` mounts (→ copies and
//! tmpfs in the guest, the guest's own `/dev/shm`, see [`kubelet`]); `linux.resources.memory.limit` (→ guest
//! memory), `cpu.quota`/`period` (→ vCPUs), `pids.limit`; `root.path` when containerd gives no
//! rootfs mounts. Refused at create, naming the field: no network namespace (the host's
//! network: a hostNetwork pod), any other bind mount without `ro` (kubelet's files are known by
//! their source, not their destination), a mount type the VM cannot provide,
//! capabilities beyond the default set (privileged, `--cap-add`), host devices
//! (`linux.devices`), hooks (host code the runtime would run). Everything else (seccomp,
//! AppArmor, sysctls, rlimits, masked paths, the guest's own `/proc`, `/sys`, `/dev` mounts) is
//! ignored: the guest kernel is the boundary. docs/containerd.md's table lists each field.

use std::path::{Path, PathBuf};

use serde_json::Value;
use vm_spec::Mount;

use crate::error::ShimError;

pub mod kubelet;
pub mod pod;

pub use kubelet::{GuestFile, GuestTmpfs};

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

/// Mount types the guest provides itself (its own kernel's), so the bundle's are ignored.
const GUEST_MOUNT_TYPES: &[&str] = &[
    "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2",
];

/// Cap on `config.json`'s size.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// What a process runs: from `process` (the container's, or an exec's spec).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// `UID:GID`; `None` = root.
    pub user: Option<String>,
    pub terminal: bool,
}

/// What a container's VM is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    pub process: ProcessSpec,
    /// Read-only binds (→ read-only disks).
    pub mounts: Vec<Mount>,
    /// Kubelet's writable files, copied into the guest before the process runs.
    pub files: Vec<GuestFile>,
    /// Guest tmpfs mounts (`emptyDir` volumes, `tmpfs` mounts).
    pub tmpfs: Vec<GuestTmpfs>,
    /// Kubelet's termination message file (a writable bind of its own): the message the
    /// container writes at its destination is written back into it when the init process
    /// ends (kubelet reads it there).
    pub termination_host: Option<kubelet::HostFile>,
    pub mem_mib: Option<i64>,
    pub vcpus: Option<i64>,
    /// `cpu.quota`/`period` as given, microseconds (a pod's app container's `cpu.max`).
    pub cpu_max: Option<(u64, u64)>,
    pub pids: Option<i64>,
    /// `root.path`, resolved against the bundle.
    pub root_path: PathBuf,
    /// Where it runs: a VM of its own, or a pod's VM ([`pod::PodRole`]).
    pub role: pod::PodRole,
    /// Guest ports forwarded from its network namespace ([`pod::PORTS`]).
    pub ports: Vec<u16>,
    /// The network namespace it was given (`linux.namespaces` network `path`), if any.
    pub netns: Option<PathBuf>,
}

fn refused(field: impl std::fmt::Display, why: impl std::fmt::Display) -> ShimError {
    ShimError::Refused(format!("{field}: {why}"))
}

fn bad(field: &str, why: &str) -> ShimError {
    ShimError::Bundle {
        what: "config.json",
        detail: format!("{field}: {why}"),
    }
}

/// Reads `<bundle>/config.json` (bounded) and turns it into a [`ContainerSpec`]; kubelet's
/// files are taken only from below `kubelet_root` ([`kubelet::Owners`]).
pub fn load(bundle: &Path, kubelet_root: &Path) -> Result<ContainerSpec, ShimError> {
    let path = bundle.join("config.json");
    let meta = std::fs::metadata(&path).map_err(ShimError::io(format!("{}", path.display())))?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(bad("config.json", "larger than 4 MiB"));
    }
    let text = std::fs::read(&path).map_err(ShimError::io(format!("{}", path.display())))?;
    let doc: Value = serde_json::from_slice(&text).map_err(|e| ShimError::Bundle {
        what: "config.json",
        detail: e.to_string(),
    })?;
    container(&doc, bundle, kubelet_root)
}

/// The container described by `doc` (see the module docs for what is refused).
pub fn container(
    doc: &Value,
    bundle: &Path,
    kubelet_root: &Path,
) -> Result<ContainerSpec, ShimError> {
    refuse_hooks(doc)?;
    refuse_host_network(doc)?;
    let role = pod::role(doc)?;
    let ports = pod::ports(doc)?;
    let process = process(
        doc.get("process")
            .ok_or_else(|| bad("process", "missing"))?,
    )?;
    // Capabilities before devices: a privileged bundle is named by its capabilities.
    refuse_caps(&doc["process"])?;
    refuse_devices(doc)?;
    let GuestMounts {
        disks: mounts,
        files,
        tmpfs,
        termination_host,
    } = mounts(doc, &owners(doc, bundle, &role, kubelet_root))?;
    let res = &doc["linux"]["resources"];
    let mem_mib = match res["memory"]["limit"].as_i64() {
        Some(b) if b > 0 => Some((b + (1 << 20) - 1) >> 20),
        _ => None,
    };
    let cpu_max = match (res["cpu"]["quota"].as_i64(), res["cpu"]["period"].as_u64()) {
        (Some(q), Some(p)) if q > 0 && p > 0 => Some((q as u64, p)),
        _ => None,
    };
    let vcpus = cpu_max.map(|(q, p)| q.div_ceil(p) as i64);
    let pids = res["pids"]["limit"].as_i64().filter(|p| *p > 0);
    // A pod's VM is sized by the pod, when containerd says how big it is.
    let (mem_mib, vcpus) = match role {
        pod::PodRole::Sandbox => {
            let (mem, cpus) = pod::pod_size(doc)?;
            (mem.or(mem_mib), cpus.or(vcpus))
        }
        _ => (mem_mib, vcpus),
    };
    let root = doc["root"]["path"].as_str().unwrap_or("rootfs");
    Ok(ContainerSpec {
        process,
        mounts,
        files,
        tmpfs,
        termination_host,
        mem_mib,
        vcpus,
        cpu_max,
        pids,
        root_path: bundle.join(root),
        role,
        ports,
        netns: netns_path(doc),
    })
}

/// A `process` object (the container's, or an exec's) → [`ProcessSpec`].
pub fn process(p: &Value) -> Result<ProcessSpec, ShimError> {
    let args: Vec<String> = strings(&p["args"], "process.args")?;
    if args.is_empty() {
        return Err(bad("process.args", "empty"));
    }
    let mut env = Vec::new();
    for (i, kv) in strings(&p["env"], "process.env")?.into_iter().enumerate() {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(bad(&format!("process.env[{i}]"), "not NAME=VALUE"));
        };
        env.push((k.to_string(), v.to_string()));
    }
    let cwd = p["cwd"].as_str().unwrap_or("/").to_string();
    let uid = p["user"]["uid"].as_u64().unwrap_or(0);
    let gid = p["user"]["gid"].as_u64().unwrap_or(0);
    let user = (uid != 0 || gid != 0).then(|| format!("{uid}:{gid}"));
    Ok(ProcessSpec {
        args,
        env,
        cwd,
        user,
        terminal: p["terminal"].as_bool().unwrap_or(false),
    })
}

fn strings(v: &Value, field: &str) -> Result<Vec<String>, ShimError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad(field, "not a list of strings"))
            })
            .collect(),
        _ => Err(bad(field, "not a list of strings")),
    }
}

fn refuse_hooks(doc: &Value) -> Result<(), ShimError> {
    if let Some(hooks) = doc["hooks"].as_object()
        && let Some((name, _)) = hooks
            .iter()
            .find(|(_, v)| v.as_array().is_some_and(|a| !a.is_empty()))
    {
        return Err(refused(
            format!("hooks.{name}"),
            "hooks would run host programs; not supported",
        ));
    }
    Ok(())
}

fn refuse_host_network(doc: &Value) -> Result<(), ShimError> {
    let has_netns = doc["linux"]["namespaces"]
        .as_array()
        .is_some_and(|ns| ns.iter().any(|n| n["type"] == "network"));
    if !has_netns {
        return Err(refused(
            "linux.namespaces",
            "no network namespace means the host's network (a hostNetwork pod, ctr --net-host); \
             untrusted work gets no network",
        ));
    }
    Ok(())
}

/// The `path` of the network namespace entry, if it names one.
fn netns_path(doc: &Value) -> Option<PathBuf> {
    doc["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["type"] == "network")?["path"]
        .as_str()
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

fn refuse_devices(doc: &Value) -> Result<(), ShimError> {
    if let Some(d) = doc["linux"]["devices"].as_array().and_then(|d| d.first()) {
        let path = d["path"].as_str().unwrap_or("?");
        return Err(refused(
            "linux.devices[0]",
            format!("host device {path} cannot be given to the guest"),
        ));
    }
    Ok(())
}

pub fn refuse_caps(process: &Value) -> Result<(), ShimError> {
    for set in [
        "bounding",
        "effective",
        "permitted",
        "inheritable",
        "ambient",
    ] {
        for (i, cap) in strings(&process["capabilities"][set], "process.capabilities")?
            .iter()
            .enumerate()
        {
            if !DEFAULT_CAPS.contains(&cap.as_str()) {
                return Err(refused(
                    format!("process.capabilities.{set}[{i}]"),
                    format!("{cap} is beyond the default set (privileged or an added capability)"),
                ));
            }
        }
    }
    Ok(())
}

/// What the bundle's `mounts` become in the VM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestMounts {
    /// Read-only binds: read-only disks.
    pub disks: Vec<Mount>,
    /// Kubelet's writable files, copied in ([`kubelet::GuestFile`]).
    pub files: Vec<GuestFile>,
    /// `emptyDir` binds and `tmpfs` mounts: a tmpfs in the guest.
    pub tmpfs: Vec<GuestTmpfs>,
    /// Kubelet's termination message file, held open ([`kubelet::HostFile`]).
    pub termination_host: Option<kubelet::HostFile>,
}

/// The annotation naming the pod's UID (containerd's CRI sets it).
pub const SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";

/// Where kubelet's and containerd's own files for this bundle's pod are ([`kubelet::Owners`]).
fn owners<'a>(
    doc: &'a Value,
    bundle: &'a Path,
    role: &'a pod::PodRole,
    kubelet_root: &'a Path,
) -> kubelet::Owners<'a> {
    let sandbox_id = match role {
        pod::PodRole::Alone => None,
        pod::PodRole::Member { sandbox } => Some(sandbox.as_str()),
        // The sandbox container's id is the pod's sandbox id (its bundle is named by it).
        pod::PodRole::Sandbox => bundle.file_name().and_then(|n| n.to_str()),
    };
    kubelet::Owners {
        kubelet_root,
        pod_uid: doc["annotations"][SANDBOX_UID]
            .as_str()
            .filter(|u| !u.is_empty()),
        sandbox_id,
    }
}

fn mounts(doc: &Value, owners: &kubelet::Owners<'_>) -> Result<GuestMounts, ShimError> {
    let mut out = GuestMounts::default();
    let Some(list) = doc["mounts"].as_array() else {
        return Ok(out);
    };
    for (i, m) in list.iter().enumerate() {
        let field = format!("mounts[{i}]");
        let dest = m["destination"]
            .as_str()
            .ok_or_else(|| bad(&field, "no destination"))?;
        let options = strings(&m["options"], &format!("{field}.options"))?;
        let ty = m["type"].as_str().unwrap_or("");
        let is_bind = ty == "bind" || options.iter().any(|o| o == "bind" || o == "rbind");
        let named = format!("{field} ({dest})");
        if !is_bind {
            if ty == "tmpfs" && !kubelet::GUEST_TMPFS_DESTINATIONS.contains(&dest) {
                out.tmpfs.push(guest_tmpfs(&named, dest, &options, None)?);
                continue;
            }
            if GUEST_MOUNT_TYPES.contains(&ty) {
                continue;
            }
            return Err(refused(
                named,
                format!("mount type {ty:?} is not supported in the VM"),
            ));
        }
        let source = m["source"]
            .as_str()
            .ok_or_else(|| bad(&field, "bind mount without a source"))?;
        let read_only = options.iter().any(|o| o == "ro");
        if kubelet::is_sandbox_shm(source, dest) {
            // The CRI's pod shm: `rw` in every container, `ro` in the pod's sandbox container.
            continue;
        }
        // Kubelet's and the CRI's own files, known by their source (whatever the
        // destination): copied in, writable. A read-only bind at one of kubelet's destinations
        // (the CRI sandbox container's `/etc/resolv.conf`) is copied too, without write bits,
        // where a disk would shadow the guest's `/etc`.
        let origin = kubelet::origin(source, owners);
        if origin.is_some() || (read_only && kubelet::KUBELET_FILES.contains(&dest)) {
            check_guest_path(&named, "file", dest)?;
            let read = kubelet::read_host_file(
                &named,
                source,
                dest,
                origin.as_ref().map(|o| (o, owners)),
            )?;
            if !read_only && read.termination.is_some() {
                out.termination_host = read.termination;
            }
            out.files.push(GuestFile {
                dest: dest.to_string(),
                data: read.data,
                mode: if read_only {
                    read.mode & !0o222
                } else {
                    read.mode
                },
            });
        } else if read_only {
            out.disks.push(Mount::read_only(source, dest));
        } else if kubelet::is_empty_dir(source) {
            out.tmpfs
                .push(guest_tmpfs(&named, dest, &options, Some(source))?);
        } else {
            return Err(refused(
                named,
                format!("writable host bind mount of {source}; only read-only (ro) is allowed"),
            ));
        }
    }
    Ok(out)
}

/// Refuses a guest path the agent could not place a `what` (file, tmpfs) at: relative, `/`,
/// or holding `..`.
fn check_guest_path(named: &str, what: &str, dest: &str) -> Result<(), ShimError> {
    if !dest.starts_with('/') || dest == "/" || dest.split('/').any(|c| c == "..") {
        return Err(refused(
            named,
            format!("a {what} destination must be an absolute path below / without .."),
        ));
    }
    Ok(())
}

/// A guest tmpfs at `dest` (absolute, without `..`: the agent mounts it there).
fn guest_tmpfs(
    named: &str,
    dest: &str,
    options: &[String],
    shared_as: Option<&str>,
) -> Result<GuestTmpfs, ShimError> {
    check_guest_path(named, "tmpfs", dest)?;
    Ok(GuestTmpfs {
        dest: dest.to_string(),
        size_bytes: kubelet::tmpfs_size(options),
        shared_as: shared_as.map(str::to_string),
    })
}

#[cfg(test)]
mod tests;
