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

/// Kubelet's root directory where no test file lives.
const NO_KUBELET: &str = "/nonexistent/kubelet";

/// `doc` as a container of a VM of its own (no kubelet files).
fn spec(doc: &Value) -> Result<ContainerSpec, ShimError> {
    container(doc, Path::new("/b"), Path::new(NO_KUBELET))
}

/// A kubelet root in a temp dir: `pods/<uid>/` holds the pod's files.
struct Kubelet {
    dir: tempfile::TempDir,
}

impl Kubelet {
    fn new() -> Kubelet {
        Kubelet {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// `pods/u1/<rel>` with `data` and `mode`.
    fn file(&self, rel: &str, data: &[u8], mode: u32) -> std::path::PathBuf {
        let p = self.dir.path().join("pods/u1").join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn spec(&self, doc: &Value) -> Result<ContainerSpec, ShimError> {
        container(doc, Path::new("/b"), self.dir.path())
    }
}

fn refusal(doc: &Value) -> String {
    spec(doc).unwrap_err().to_string()
}

#[test]
fn default_spec_becomes_the_vm_spec() {
    let c = spec(&base()).unwrap();
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
    let c = spec(&d).unwrap();
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
    let k = Kubelet::new();
    let hosts = k.file("etc-hosts", b"127.0.0.1 localhost\n", 0o644);
    // Kubelet makes the termination log writable by any user: the copy keeps its mode.
    let log = k.file("containers/job/5d1e0c2a", b"", 0o666);
    let empty = k
        .dir
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
    let c = k.spec(&d).unwrap();
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
        c.termination_host
            .as_ref()
            .map(|h| (h.dest.as_str(), h.path.as_path())),
        Some(("/dev/termination-log", log.as_path()))
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
    assert_eq!(spec(&base()).unwrap().tmpfs, []);
}

/// Issue 39: a writable host bind is a kubelet file by its source, never by its
/// destination. A pod's writable hostPath at `/dev/termination-log` or `/etc/hostname` is
/// refused like one anywhere else (before, the root shim wrote guest bytes into it).
#[test]
fn a_writable_bind_at_a_kubelet_destination_from_elsewhere_is_refused() {
    let k = Kubelet::new();
    let victim = k.dir.path().join("authorized_keys");
    std::fs::write(&victim, b"ssh-ed25519 AAAA admin\n").unwrap();
    for dest in kubelet::KUBELET_FILES {
        let mut d = base();
        push_mount(&mut d, rw_bind(&victim, dest));
        let e = k.spec(&d).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "refused: mounts[3] ({dest}): writable host bind mount of {}; only read-only",
                victim.display()
            )),
            "{e}"
        );
    }
    // Kubelet's own files of another shape, or of another pod when containerd names the
    // pod's UID, are not taken either.
    let vol = k.file("volumes/kubernetes.io~host-path/x", b"", 0o644);
    let log = k.file("containers/job/5d1e0c2a", b"", 0o666);
    let mut d = base();
    push_mount(&mut d, rw_bind(&vol, "/dev/termination-log"));
    assert!(
        k.spec(&d)
            .unwrap_err()
            .to_string()
            .contains("writable host bind mount")
    );
    let mut d = base();
    d["annotations"] = json!({SANDBOX_UID: "u2"});
    push_mount(&mut d, rw_bind(&log, "/dev/termination-log"));
    assert!(
        k.spec(&d)
            .unwrap_err()
            .to_string()
            .contains("writable host bind mount")
    );
    d["annotations"] = json!({SANDBOX_UID: "u1"});
    assert!(k.spec(&d).unwrap().termination_host.is_some());
    // A custom terminationMessagePath: kubelet's file, wherever it is mounted.
    let mut d = base();
    push_mount(&mut d, rw_bind(&log, "/tmp/last-words"));
    let c = k.spec(&d).unwrap();
    assert_eq!(c.termination_host.unwrap().dest, "/tmp/last-words");
    assert_eq!(std::fs::read(&victim).unwrap(), b"ssh-ed25519 AAAA admin\n");
}

/// Kubelet's files are opened beneath kubelet's `pods/` without following a symlink: one
/// planted at the file or on the way (a pod directory swapped for a link to `/etc`) is
/// refused, never read as root.
#[test]
fn a_kubelet_file_behind_a_symlink_is_refused_not_followed() {
    let k = Kubelet::new();
    let secret = k.dir.path().join("shadow");
    std::fs::write(&secret, b"root:$6$secret\n").unwrap();
    let hosts = k.dir.path().join("pods/u1/etc-hosts");
    std::fs::create_dir_all(hosts.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&secret, &hosts).unwrap();
    let mut d = base();
    push_mount(&mut d, rw_bind(&hosts, "/etc/hosts"));
    let e = k.spec(&d).unwrap_err().to_string();
    assert!(e.contains("is or passes through a symlink"), "{e}");
    let real = k.dir.path().join("real-pod");
    std::fs::create_dir_all(real.join("containers/job")).unwrap();
    std::fs::write(real.join("containers/job/log"), b"").unwrap();
    std::os::unix::fs::symlink(&real, k.dir.path().join("pods/u2")).unwrap();
    let mut d = base();
    push_mount(
        &mut d,
        rw_bind(
            &k.dir.path().join("pods/u2/containers/job/log"),
            "/dev/termination-log",
        ),
    );
    let e = k.spec(&d).unwrap_err().to_string();
    assert!(e.contains("is or passes through a symlink"), "{e}");
}

/// containerd's CRI gives a pod's containers its `hosts`, `hostname` and `resolv.conf` from
/// the pod's sandbox directory: taken for that pod alone (another sandbox's are refused).
#[test]
fn the_cri_sandbox_files_of_this_pod_are_copied_in() {
    let dir = tempfile::tempdir().unwrap();
    let sandboxes = dir.path().join("root/io.containerd.grpc.v1.cri/sandboxes");
    for id in ["abc123", "other9"] {
        std::fs::create_dir_all(sandboxes.join(id)).unwrap();
        std::fs::write(sandboxes.join(id).join("hostname"), format!("{id}\n")).unwrap();
    }
    let member = |sandbox: &str| {
        let mut d = base();
        d["annotations"] = json!({
            pod::CONTAINER_TYPE: "container",
            pod::SANDBOX_ID: "abc123",
        });
        push_mount(
            &mut d,
            rw_bind(&sandboxes.join(sandbox).join("hostname"), "/etc/hostname"),
        );
        spec(&d)
    };
    assert_eq!(member("abc123").unwrap().files[0].data, b"abc123\n");
    assert!(
        member("other9")
            .unwrap_err()
            .to_string()
            .contains("writable host bind mount")
    );
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
    let c = spec(&d).unwrap();
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
    let k = Kubelet::new();
    let big = k.file(
        "etc-hosts",
        &vec![b'#'; kubelet::MAX_FILE_BYTES as usize + 1],
        0o644,
    );
    let mut d = base();
    push_mount(&mut d, rw_bind(&big, "/etc/hosts"));
    assert_eq!(
        k.spec(&d).unwrap_err().to_string(),
        format!(
            "refused: mounts[3] (/etc/hosts): {} is larger than 64 KiB; kubelet's files are copied into the guest only up to that",
            big.display()
        )
    );
    // At the cap it is copied.
    std::fs::write(&big, vec![b'#'; kubelet::MAX_FILE_BYTES as usize]).unwrap();
    assert_eq!(k.spec(&d).unwrap().files.len(), 1);
    // A directory (or a FIFO) where kubelet's file should be is refused, never read.
    std::fs::remove_file(&big).unwrap();
    std::fs::create_dir(&big).unwrap();
    let e = k.spec(&d).unwrap_err().to_string();
    assert!(
        e.starts_with("refused: mounts[3] (/etc/hosts): ")
            && e.ends_with("is not a regular file; only a file is copied into the guest"),
        "{e}"
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
fn the_termination_message_is_written_back_only_into_the_file_opened_at_create() {
    let k = Kubelet::new();
    let log = k.file("containers/job/5d1e0c2a", b"old", 0o666);
    let mut d = base();
    push_mount(&mut d, rw_bind(&log, "/dev/termination-log"));
    let host = k
        .spec(&d)
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
    // Replaced by a symlink to another file since create: the file opened at create is
    // written (through its descriptor), never what the path names now.
    let kept = k.dir.path().join("kept");
    std::fs::hard_link(&log, &kept).unwrap();
    let other = k.dir.path().join("other");
    std::fs::write(&other, b"").unwrap();
    std::fs::remove_file(&log).unwrap();
    std::os::unix::fs::symlink(&other, &log).unwrap();
    kubelet::write_termination_message(&host, b"x").unwrap();
    assert_eq!(std::fs::read(&other).unwrap(), b"");
    assert_eq!(std::fs::read(&kept).unwrap(), b"x");
    // A read-only bind there keeps no host file.
    let mut d = base();
    push_mount(
        &mut d,
        json!({"destination": "/dev/termination-log", "type": "bind",
               "source": kept.to_str().unwrap(), "options": ["rbind", "ro"]}),
    );
    assert_eq!(spec(&d).unwrap().termination_host, None);
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
    let c = spec(&d).unwrap();
    assert!(c.mounts.is_empty() && c.files.is_empty() && c.tmpfs.is_empty());
    // The pod's sandbox container gets the same directory read-only: not a disk either (a
    // disk at /dev/shm would shadow the guest's /dev).
    let mut d = base();
    push_mount(
        &mut d,
        json!({"destination": "/dev/shm", "type": "bind", "source": shm, "options": ["rbind", "ro"]}),
    );
    let c = spec(&d).unwrap();
    assert!(c.mounts.is_empty() && c.files.is_empty() && c.tmpfs.is_empty());
    // A hostIPC sandbox's read-only host /dev/shm stays a read-only disk (which the spec then
    // refuses: it would shadow the guest's /dev).
    let mut d = base();
    push_mount(
        &mut d,
        json!({"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "ro"]}),
    );
    let c = spec(&d).unwrap();
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
