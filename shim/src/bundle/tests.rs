//! The bundle's `config.json` → [`ContainerSpec`], and each refusal naming its field.

use std::os::unix::fs::PermissionsExt;

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

fn push_mount(d: &mut Value, m: Value) {
    d["mounts"].as_array_mut().unwrap().push(m);
}

fn rw_bind(src: &Path, dst: &str) -> Value {
    json!({"destination": dst, "type": "bind", "source": src.to_str().unwrap(), "options": ["rbind", "rw"]})
}

#[test]
fn kubelet_files_are_copied_in_and_empty_dirs_and_tmpfs_are_guest_tmpfs() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("etc-hosts");
    std::fs::write(&hosts, b"127.0.0.1 localhost\n").unwrap();
    std::fs::set_permissions(&hosts, std::fs::Permissions::from_mode(0o644)).unwrap();
    let log = dir.path().join("termination-log");
    std::fs::write(&log, b"").unwrap();
    // Kubelet makes the termination log writable by any user: the copy keeps its mode.
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).unwrap();
    let empty = dir
        .path()
        .join("pods/u1/volumes/kubernetes.io~empty-dir/cache");
    std::fs::create_dir_all(&empty).unwrap();
    let mut d = base();
    push_mount(&mut d, rw_bind(&hosts, "/etc/hosts"));
    push_mount(&mut d, rw_bind(&log, "/dev/termination-log"));
    push_mount(&mut d, rw_bind(&empty, "/cache"));
    push_mount(
        &mut d,
        json!({"destination": "/scratch", "type": "tmpfs", "source": "tmpfs", "options": ["size=1m"]}),
    );
    let c = container(&d, Path::new("/b")).unwrap();
    assert_eq!(
        c.files,
        [
            GuestFile {
                dest: "/etc/hosts".into(),
                data: b"127.0.0.1 localhost\n".to_vec(),
                mode: 0o644
            },
            GuestFile {
                dest: "/dev/termination-log".into(),
                data: Vec::new(),
                mode: 0o666
            }
        ]
    );
    assert_eq!(
        c.tmpfs,
        [
            GuestTmpfs {
                dest: "/cache".into(),
                size_bytes: kubelet::TMPFS_BYTES,
                shared_as: Some(empty.display().to_string()),
            },
            GuestTmpfs {
                dest: "/scratch".into(),
                size_bytes: 1 << 20,
                shared_as: None,
            }
        ]
    );
    assert!(c.mounts.is_empty(), "no host disk: {:?}", c.mounts);
    // The guest's own /dev and /run stay the guest's (containerd's default tmpfs mounts).
    assert_eq!(container(&base(), Path::new("/b")).unwrap().tmpfs, []);
}

/// The pod's sandbox container under containerd's CRI has a read-only `/etc/resolv.conf`
/// bind: a copy too (a disk there would shadow the guest's `/etc`), without write bits.
#[test]
fn the_cri_sandbox_read_only_resolv_conf_is_copied_in_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, b"nameserver 10.96.0.10\n").unwrap();
    std::fs::set_permissions(&resolv, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut d = base();
    push_mount(
        &mut d,
        json!({"destination": "/etc/resolv.conf", "type": "bind",
               "source": resolv.to_str().unwrap(), "options": ["rbind", "ro"]}),
    );
    let c = container(&d, Path::new("/b")).unwrap();
    assert_eq!(
        c.files,
        [GuestFile {
            dest: "/etc/resolv.conf".into(),
            data: b"nameserver 10.96.0.10\n".to_vec(),
            mode: 0o444
        }]
    );
    assert!(c.mounts.is_empty(), "no host disk: {:?}", c.mounts);
}

#[test]
fn oversized_or_odd_kubelet_file_is_refused_naming_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("resolv.conf");
    std::fs::write(&big, vec![b'#'; kubelet::MAX_FILE_BYTES as usize + 1]).unwrap();
    let mut d = base();
    push_mount(&mut d, rw_bind(&big, "/etc/resolv.conf"));
    assert_eq!(
        refusal(&d),
        format!(
            "refused: mounts[3] (/etc/resolv.conf): {} is larger than 64 KiB; kubelet's files are copied into the guest only up to that",
            big.display()
        )
    );
    // At the cap it is copied.
    std::fs::write(&big, vec![b'#'; kubelet::MAX_FILE_BYTES as usize]).unwrap();
    assert_eq!(container(&d, Path::new("/b")).unwrap().files.len(), 1);
    // A directory (or a FIFO) where kubelet's file should be is refused, never read.
    let mut d = base();
    push_mount(&mut d, rw_bind(dir.path(), "/etc/hostname"));
    assert!(
        refusal(&d).starts_with("refused: mounts[3] (/etc/hostname): ")
            && refusal(&d).ends_with("is not a regular file; only a file is copied into the guest"),
        "{}",
        refusal(&d)
    );
}

#[test]
fn termination_tail_keeps_the_last_4_kib() {
    let mut t = kubelet::TerminationTail::default();
    t.push(b"short");
    assert_eq!((t.message().as_str(), t.truncated()), ("short", false));
    let mut t = kubelet::TerminationTail::default();
    t.push(&[b'x'; 904]);
    t.push(&[b'y'; 3000]);
    t.push(&[b'z'; 1096]);
    let m = t.message();
    assert_eq!(m.len(), kubelet::MAX_TERMINATION_BYTES);
    assert!(t.truncated());
    assert_eq!(m, "y".repeat(3000) + &"z".repeat(1096));
    // One chunk larger than the cap keeps its own tail.
    let mut t = kubelet::TerminationTail::default();
    t.push(&[b'a'; 10_000]);
    assert_eq!(t.message(), "a".repeat(4096));
    assert_eq!(t.total, 10_000);
}

#[test]
fn the_termination_message_is_written_back_only_into_the_file_read_at_create() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("termination-log");
    std::fs::write(&log, b"old").unwrap();
    let mut d = base();
    push_mount(&mut d, rw_bind(&log, "/dev/termination-log"));
    let host = container(&d, Path::new("/b"))
        .unwrap()
        .termination_host
        .expect("the host file is kept");
    assert_eq!(host.path, log);
    let long = [b"HEAD".as_slice(), &[b'y'; 4096]].concat();
    kubelet::write_termination_message(&host, &long).unwrap();
    assert_eq!(
        std::fs::read(&log).unwrap(),
        vec![b'y'; 4096],
        "its last 4 KiB"
    );
    kubelet::write_termination_message(&host, b"short").unwrap();
    assert_eq!(
        std::fs::read(&log).unwrap(),
        b"short",
        "replaced, not appended"
    );
    // Replaced by a symlink or another file since create: not written. (A link keeps the
    // original inode, so that the replacement cannot reuse its number.)
    std::fs::hard_link(&log, dir.path().join("kept")).unwrap();
    let other = dir.path().join("other");
    std::fs::write(&other, b"").unwrap();
    std::fs::remove_file(&log).unwrap();
    std::os::unix::fs::symlink(&other, &log).unwrap();
    assert!(kubelet::write_termination_message(&host, b"x").is_err());
    std::fs::remove_file(&log).unwrap();
    std::fs::write(&log, b"").unwrap();
    assert!(kubelet::write_termination_message(&host, b"x").is_err());
    assert_eq!(std::fs::read(&other).unwrap(), b"");
    assert_eq!(std::fs::read(&log).unwrap(), b"");
    // A read-only bind there (not kubelet's) keeps no host file.
    let mut d = base();
    push_mount(
        &mut d,
        json!({"destination": "/dev/termination-log", "type": "bind",
               "source": log.to_str().unwrap(), "options": ["rbind", "ro"]}),
    );
    assert_eq!(
        container(&d, Path::new("/b")).unwrap().termination_host,
        None
    );
}

#[test]
fn tmpfs_size_is_bounded() {
    let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(kubelet::tmpfs_size(&o(&[])), kubelet::TMPFS_BYTES);
    assert_eq!(kubelet::tmpfs_size(&o(&["size=65536k"])), 64 << 20);
    assert_eq!(kubelet::tmpfs_size(&o(&["size=10g"])), kubelet::TMPFS_BYTES);
    assert_eq!(kubelet::tmpfs_size(&o(&["size=1"])), 4096);
    assert_eq!(
        kubelet::tmpfs_size(&o(&["size=99999999999999999999g"])),
        kubelet::TMPFS_BYTES
    );
    let mut d = base();
    push_mount(
        &mut d,
        json!({"destination": "/a/../etc", "type": "tmpfs", "source": "tmpfs"}),
    );
    assert!(refusal(&d).starts_with("refused: mounts[3] (/a/../etc): a tmpfs destination"));
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
    assert_eq!(
        refusal(&d),
        "refused: linux.namespaces: no network namespace means the host's network (a \
         hostNetwork pod, ctr --net-host); untrusted work gets no network"
    );

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

#[test]
fn the_cri_sandbox_shm_is_the_guests_own_and_the_hosts_dev_shm_is_refused() {
    let shm = "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/5f0c7a/shm";
    let mut d = base();
    push_mount(&mut d, rw_bind(Path::new(shm), "/dev/shm"));
    let c = container(&d, Path::new("/b")).unwrap();
    assert!(c.mounts.is_empty() && c.files.is_empty() && c.tmpfs.is_empty());
    // The pod's sandbox container gets the same directory read-only: not a disk either (a
    // disk at /dev/shm would shadow the guest's /dev).
    let mut d = base();
    push_mount(
        &mut d,
        json!({"destination": "/dev/shm", "type": "bind", "source": shm, "options": ["rbind", "ro"]}),
    );
    let c = container(&d, Path::new("/b")).unwrap();
    assert!(c.mounts.is_empty() && c.files.is_empty() && c.tmpfs.is_empty());
    // A hostIPC sandbox's read-only host /dev/shm stays a read-only disk (which the spec then
    // refuses: it would shadow the guest's /dev).
    let mut d = base();
    push_mount(
        &mut d,
        json!({"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "ro"]}),
    );
    let c = container(&d, Path::new("/b")).unwrap();
    assert_eq!(c.mounts, [Mount::read_only("/dev/shm", "/dev/shm")]);
    // Anything else at /dev/shm is a writable host bind: a hostIPC pod's /dev/shm, another
    // directory of the sandbox, one that climbs out of it.
    for source in [
        "/dev/shm",
        "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/5f0c7a/hostname",
        "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/../shm",
        "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/5f0c7a/x/shm",
    ] {
        let mut d = base();
        push_mount(&mut d, rw_bind(Path::new(source), "/dev/shm"));
        assert_eq!(
            refusal(&d),
            format!(
                "refused: mounts[3] (/dev/shm): writable host bind mount of {source}; only \
                 read-only (ro) is allowed"
            )
        );
    }
    // The sandbox's shm anywhere but /dev/shm is not absorbed either.
    let mut d = base();
    push_mount(&mut d, rw_bind(Path::new(shm), "/data"));
    assert!(refusal(&d).starts_with("refused: mounts[3] (/data): writable host bind mount"));
}
