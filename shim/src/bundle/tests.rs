//! The bundle's `config.json` → [`ContainerSpec`], and each refusal naming its field.

use super::*;
use serde_json::json;

/// What containerd 1.6's default spec looks like for `ctr run` (trimmed).
fn base() -> Value {
    json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": ["sh", "-c", "echo hi"],
            "env": ["PATH=/usr/bin:/bin", "A=b=c"],
            "cwd": "/",
            "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"], "effective": ["CAP_KILL"]},
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro"]}
        ],
        "linux": {
            "resources": {"memory": {"limit": 200 * 1024 * 1024 + 1}, "cpu": {"quota": 150000, "period": 100000}, "pids": {"limit": 64}},
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}]
        }
    })
}

fn refusal(doc: &Value) -> String {
    container(doc, Path::new("/b")).unwrap_err().to_string()
}

#[test]
fn default_spec_becomes_the_vm_spec() {
    let c = container(&base(), Path::new("/b")).unwrap();
    assert_eq!(c.process.args, ["sh", "-c", "echo hi"]);
    assert_eq!(
        c.process.env,
        [
            ("PATH".to_string(), "/usr/bin:/bin".to_string()),
            ("A".to_string(), "b=c".to_string())
        ]
    );
    assert_eq!(c.process.cwd, "/");
    assert_eq!(c.process.user, None);
    assert_eq!(c.mem_mib, Some(201), "rounded up to whole MiB");
    assert_eq!(c.vcpus, Some(2), "1.5 CPUs of quota round up");
    assert_eq!(c.pids, Some(64));
    assert!(c.mounts.is_empty(), "the guest's own /proc, /dev, /sys");
    assert_eq!(c.root_path, Path::new("/b/rootfs"));
    let mut d = base();
    d["process"]["user"] = json!({"uid": 1000, "gid": 100});
    d["mounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"destination": "/data", "type": "bind", "source": "/srv/d", "options": ["rbind", "ro"]}));
    let c = container(&d, Path::new("/b")).unwrap();
    assert_eq!(c.process.user.as_deref(), Some("1000:100"));
    assert_eq!(c.mounts, [Mount::read_only("/srv/d", "/data")]);
}

#[test]
fn writable_bind_mount_is_refused_with_its_field() {
    let mut d = base();
    d["mounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"destination": "/data", "type": "bind", "source": "/srv/d", "options": ["rbind", "rw"]}));
    let e = refusal(&d);
    assert_eq!(
        e,
        "refused: mounts[3] (/data): writable host bind mount of /srv/d; only read-only (ro) is allowed"
    );
}

#[test]
fn host_network_devices_caps_and_hooks_are_refused() {
    let mut d = base();
    d["linux"]["namespaces"] = json!([{"type": "pid"}, {"type": "mount"}]);
    assert!(refusal(&d).starts_with("refused: linux.namespaces: no network namespace"));

    let mut d = base();
    d["linux"]["devices"] = json!([{"path": "/dev/kvm", "type": "c", "major": 10, "minor": 232}]);
    assert_eq!(
        refusal(&d),
        "refused: linux.devices[0]: host device /dev/kvm cannot be given to the guest"
    );

    let mut d = base();
    d["process"]["capabilities"]["bounding"] = json!(["CAP_CHOWN", "CAP_SYS_ADMIN"]);
    assert_eq!(
        refusal(&d),
        "refused: process.capabilities.bounding[1]: CAP_SYS_ADMIN is beyond the default set (privileged or an added capability)"
    );

    let mut d = base();
    d["hooks"] = json!({"prestart": [{"path": "/usr/bin/x"}]});
    assert!(refusal(&d).starts_with("refused: hooks.prestart:"));

    let mut d = base();
    d["mounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"destination": "/n", "type": "nfs", "source": "h:/x"}));
    assert_eq!(
        refusal(&d),
        "refused: mounts[3] (/n): mount type \"nfs\" is not supported in the VM"
    );
}

#[test]
fn malformed_process_is_a_bundle_error() {
    let mut d = base();
    d["process"]["args"] = json!([]);
    assert_eq!(refusal(&d), "bundle config.json: process.args: empty");
    let mut d = base();
    d["process"]["env"] = json!(["NOEQUALS"]);
    assert_eq!(
        refusal(&d),
        "bundle config.json: process.env[0]: not NAME=VALUE"
    );
}
