//! Which VM a container runs in, from the annotations containerd's CRI puts on every bundle:
//! `io.kubernetes.cri.container-type` (`sandbox` for a pod's sandbox, `container` for each of
//! its app containers) and `io.kubernetes.cri.sandbox-id` (the pod's sandbox). A sandbox boots
//! the pod's VM; an app container runs in its sandbox's VM; a bundle without them (`ctr run`)
//! gets a VM of its own.

use std::path::Path;

use serde_json::Value;

use crate::error::ShimError;

/// The annotation naming a CRI container's kind.
pub const CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// The annotation naming a CRI container's pod sandbox.
pub const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// The annotation listing the TCP ports a VM's guest serves that are forwarded to it from
/// the container's network namespace (comma-separated; on a pod, the sandbox's, which
/// containerd's CRI passes through with `pod_annotations`).
pub const PORTS: &str = "vm.shim/ports";
/// Longest sandbox id taken (containerd's are 64 hex digits).
const MAX_ID: usize = 128;
/// Most ports one VM forwards.
pub const MAX_PORTS: usize = 64;

/// Where a container runs (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodRole {
    /// No CRI annotations: a VM of its own.
    Alone,
    /// A pod's sandbox: it boots the pod's VM.
    Sandbox,
    /// An app container of the pod whose sandbox is `sandbox`: it runs in that VM.
    Member { sandbox: String },
}

fn annotation<'a>(doc: &'a Value, key: &str) -> Result<Option<&'a str>, ShimError> {
    match &doc["annotations"][key] {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        _ => Err(bad(key, "not a string")),
    }
}

fn bad(key: &str, why: &str) -> ShimError {
    ShimError::Bundle {
        what: "config.json",
        detail: format!("annotations.{key:?}: {why}"),
    }
}

/// The role `doc`'s annotations give (an unknown container type or a malformed sandbox id
/// is refused, naming the annotation).
pub fn role(doc: &Value) -> Result<PodRole, ShimError> {
    let Some(kind) = annotation(doc, CONTAINER_TYPE)? else {
        return Ok(PodRole::Alone);
    };
    match kind {
        "sandbox" => Ok(PodRole::Sandbox),
        "container" => {
            let id = annotation(doc, SANDBOX_ID)?
                .ok_or_else(|| bad(SANDBOX_ID, "missing for a container of a pod"))?;
            let ok = !id.is_empty()
                && id.len() <= MAX_ID
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            match ok {
                true => Ok(PodRole::Member {
                    sandbox: id.to_string(),
                }),
                false => Err(bad(SANDBOX_ID, "not a container id")),
            }
        }
        other => Err(bad(
            CONTAINER_TYPE,
            &format!("{other:?} is neither \"sandbox\" nor \"container\""),
        )),
    }
}

/// The pod's memory (bytes) that containerd 1.7+ puts on the sandbox: the sum of its
/// containers' limits.
pub const SANDBOX_MEMORY: &str = "io.kubernetes.cri.sandbox-memory";
/// The pod's CPU quota and period that containerd 1.7+ puts on the sandbox.
pub const SANDBOX_CPU_QUOTA: &str = "io.kubernetes.cri.sandbox-cpu-quota";
pub const SANDBOX_CPU_PERIOD: &str = "io.kubernetes.cri.sandbox-cpu-period";

fn positive(doc: &Value, key: &str) -> Result<Option<u64>, ShimError> {
    match annotation(doc, key)? {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(0) => Ok(None),
            Ok(n) => Ok(Some(n)),
            Err(_) => Err(bad(key, &format!("{v:?} is not a number"))),
        },
    }
}

/// The pod's size from the sandbox's annotations, when containerd gives them (1.7+; 1.6 does
/// not): memory in MiB (rounded up) and vCPUs (⌈quota / period⌉).
pub fn pod_size(doc: &Value) -> Result<(Option<i64>, Option<i64>), ShimError> {
    let mem = positive(doc, SANDBOX_MEMORY)?.map(|b| b.div_ceil(1 << 20) as i64);
    let cpus = match (
        positive(doc, SANDBOX_CPU_QUOTA)?,
        positive(doc, SANDBOX_CPU_PERIOD)?,
    ) {
        (Some(q), Some(p)) => Some(q.div_ceil(p) as i64),
        _ => None,
    };
    Ok((mem, cpus))
}

/// The ports [`PORTS`] lists (each 1–65535, no repeats, at most [`MAX_PORTS`]).
pub fn ports(doc: &Value) -> Result<Vec<u16>, ShimError> {
    let Some(list) = annotation(doc, PORTS)? else {
        return Ok(Vec::new());
    };
    let mut out: Vec<u16> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let port = item
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad(PORTS, &format!("{item:?} is not a TCP port")))?;
        if out.contains(&port) {
            return Err(bad(PORTS, &format!("port {port} is listed twice")));
        }
        out.push(port);
    }
    if out.len() > MAX_PORTS {
        return Err(bad(PORTS, &format!("more than {MAX_PORTS} ports")));
    }
    Ok(out)
}

/// The shim a bundle is served by: its pod's (the sandbox id), or its own (`id`). containerd's
/// `start` of an app container then finds the pod's shim already serving and uses it. The
/// bundle's `config.json` is read bounded; one that cannot be read groups by `id` (its
/// `create` reports the error).
pub fn grouping(bundle: &Path, id: &str) -> String {
    let doc = std::fs::metadata(bundle.join("config.json"))
        .ok()
        .filter(|m| m.len() <= super::MAX_CONFIG_BYTES)
        .and_then(|_| std::fs::read(bundle.join("config.json")).ok())
        .and_then(|t| serde_json::from_slice::<Value>(&t).ok());
    match doc.as_ref().map(role) {
        Some(Ok(PodRole::Member { sandbox })) => sandbox,
        _ => id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn with(annotations: Value) -> Value {
        json!({ "annotations": annotations })
    }

    #[test]
    fn cri_annotations_give_the_role() {
        assert_eq!(role(&json!({})).unwrap(), PodRole::Alone);
        let sb = with(json!({CONTAINER_TYPE: "sandbox", SANDBOX_ID: "abc"}));
        assert_eq!(role(&sb).unwrap(), PodRole::Sandbox);
        let c = with(json!({CONTAINER_TYPE: "container", SANDBOX_ID: "abc"}));
        let member = PodRole::Member {
            sandbox: "abc".into(),
        };
        assert_eq!(role(&c).unwrap(), member);
    }

    #[test]
    fn bad_annotations_are_refused_by_name() {
        for (doc, named) in [
            (with(json!({CONTAINER_TYPE: "pod"})), CONTAINER_TYPE),
            (with(json!({CONTAINER_TYPE: 3})), CONTAINER_TYPE),
            (with(json!({CONTAINER_TYPE: "container"})), SANDBOX_ID),
            (
                with(json!({CONTAINER_TYPE: "container", SANDBOX_ID: "../x"})),
                SANDBOX_ID,
            ),
            (
                with(json!({CONTAINER_TYPE: "container", SANDBOX_ID: ""})),
                SANDBOX_ID,
            ),
        ] {
            let e = role(&doc).unwrap_err().to_string();
            assert!(e.contains(named), "{doc}: {e}");
        }
    }

    #[test]
    fn the_pods_size_comes_from_the_sandbox_annotations() {
        assert_eq!(pod_size(&json!({})).unwrap(), (None, None));
        let doc = with(json!({
            SANDBOX_MEMORY: "805306368",
            SANDBOX_CPU_QUOTA: "150000",
            SANDBOX_CPU_PERIOD: "100000",
        }));
        assert_eq!(pod_size(&doc).unwrap(), (Some(768), Some(2)));
        let e = pod_size(&with(json!({SANDBOX_MEMORY: "lots"}))).unwrap_err();
        assert!(e.to_string().contains(SANDBOX_MEMORY), "{e}");
    }

    #[test]
    fn ports_are_listed_tcp_ports() {
        assert!(ports(&json!({})).unwrap().is_empty());
        assert_eq!(
            ports(&with(json!({PORTS: "8080, 9090"}))).unwrap(),
            [8080, 9090]
        );
        for bad in ["0", "65536", "http", "80,80", "-1"] {
            let e = ports(&with(json!({PORTS: bad}))).unwrap_err().to_string();
            assert!(e.contains(PORTS), "{bad}: {e}");
        }
        let many: Vec<String> = (1..=65).map(|p| p.to_string()).collect();
        assert!(ports(&with(json!({PORTS: many.join(",")}))).is_err());
    }

    #[test]
    fn a_member_is_served_by_its_pods_shim() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(grouping(dir.path(), "c1"), "c1", "no config.json");
        let doc = with(json!({CONTAINER_TYPE: "container", SANDBOX_ID: "pod1"}));
        std::fs::write(dir.path().join("config.json"), doc.to_string()).unwrap();
        assert_eq!(grouping(dir.path(), "c1"), "pod1");
        let doc = with(json!({CONTAINER_TYPE: "sandbox", SANDBOX_ID: "pod1"}));
        std::fs::write(dir.path().join("config.json"), doc.to_string()).unwrap();
        assert_eq!(grouping(dir.path(), "pod1"), "pod1");
    }
}
