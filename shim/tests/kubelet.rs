//! The writable mounts kubelet gives every container, under a real containerd (the same
//! harness as `containerd.rs`), given with `ctr run --mount` exactly as kubelet's bundle has
//! them (`type=bind,…,options=rbind:rw`): `/etc/hosts` is a writable copy in the guest and
//! the host file stays byte for byte; what a container writes to `/dev/termination-log` is
//! read back when it exits (its last 4 KiB, reported in the shim's log; a user that is not
//! root can write it, as kubelet's 0666 file allows); an `emptyDir` bind
//! and a `tmpfs` mount are tmpfs in the guest and the host directory stays empty; the CRI's
//! pod-sandbox shm bind at `/dev/shm` is the guest's own tmpfs.

#[macro_use]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{Containerd, entries};

/// A host path shaped like kubelet's pod directory (`…/pods/<uid>/…`).
fn pod_path(cd: &Containerd, rel: &str) -> PathBuf {
    let p = cd.dir.path().join("pods/0c5e-uid").join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    p
}

fn rw_bind(src: &Path, dst: &str) -> String {
    format!("type=bind,src={},dst={dst},options=rbind:rw", src.display())
}

#[test]
fn etc_hosts_is_a_writable_copy_and_the_host_file_is_untouched() {
    preflight!("etc_hosts_is_a_writable_copy_and_the_host_file_is_untouched");
    let cd = Containerd::start();
    let hosts = pod_path(&cd, "etc-hosts");
    let original = b"# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.0.0.5\tweb-0\n";
    std::fs::write(&hosts, original).unwrap();
    // containerd's CRI gives resolv.conf from the pod's sandbox directory; read-only here
    // (no CRI annotations name a sandbox), as the CRI's sandbox container has it.
    let resolv = pod_path(&cd, "resolv.conf");
    std::fs::write(&resolv, b"nameserver 10.96.0.10\n").unwrap();
    let before = std::fs::metadata(&hosts).unwrap().modified().unwrap();
    let out = cd.run(
        &[
            "--rm",
            "--mount",
            &rw_bind(&hosts, "/etc/hosts"),
            "--mount",
            &format!(
                "type=bind,src={},dst=/etc/resolv.conf,options=rbind:ro",
                resolv.display()
            ),
        ],
        "hosts",
        &[
            "sh",
            "-c",
            "echo '10.0.0.9 added' >> /etc/hosts && cat /etc/hosts /etc/resolv.conf",
        ],
    );
    let want = format!(
        "{}10.0.0.9 added\nnameserver 10.96.0.10\n",
        String::from_utf8_lossy(original)
    );
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, want.as_str()),
        "{out:?}\n{}",
        cd.log()
    );
    assert_eq!(
        std::fs::read(&hosts).unwrap(),
        original,
        "host file changed"
    );
    assert_eq!(
        std::fs::metadata(&hosts).unwrap().modified().unwrap(),
        before
    );
    // Any other writable host bind is still refused, naming the mount.
    let data = pod_path(&cd, "volumes/kubernetes.io~host-path/data");
    std::fs::create_dir(&data).unwrap();
    let out = cd.run(
        &["--rm", "--mount", &rw_bind(&data, "/data")],
        "rw",
        &["true"],
    );
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("refused: mounts[")
            && out.stderr.contains("(/data): writable host bind mount of"),
        "{out:?}"
    );
}

/// Issue 39, as it was found: a writable bind of a host file that is not kubelet's, at
/// kubelet's destinations (`ctr run --mount type=bind,src=HOSTFILE,dst=/dev/termination-log,
/// options=rbind:rw … sh -c 'echo X > /dev/termination-log'`): the root shim used to write the
/// guest's bytes into it when the container ended. Now refused at create naming the mount, and
/// the host file keeps its bytes. A kubelet file that is a symlink to a secret is refused too,
/// never read as root.
#[test]
fn a_host_file_at_kubelets_destinations_is_refused_and_never_written() {
    preflight!("a_host_file_at_kubelets_destinations_is_refused_and_never_written");
    let cd = Containerd::start();
    let victim = cd.dir.path().join("authorized_keys");
    let original = b"ssh-ed25519 AAAAC3Nza admin@node\n";
    std::fs::write(&victim, original).unwrap();
    for (i, dest) in ["/dev/termination-log", "/etc/hostname"].iter().enumerate() {
        let out = cd.run(
            &["--rm", "--mount", &rw_bind(&victim, dest)],
            &format!("hostfile-{i}"),
            &["sh", "-c", &format!("echo X > {dest}")],
        );
        assert_ne!(out.code, 0, "{out:?}\n{}", cd.log());
        assert!(
            out.stderr.contains(&format!(
                "({dest}): writable host bind mount of {}",
                victim.display()
            )),
            "{out:?}"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), original, "{dest}");
    }
    let secret = cd.dir.path().join("shadow");
    std::fs::write(&secret, b"root:$6$secret:19000::::::\n").unwrap();
    let hosts = pod_path(&cd, "etc-hosts");
    std::os::unix::fs::symlink(&secret, &hosts).unwrap();
    let out = cd.run(
        &["--rm", "--mount", &rw_bind(&hosts, "/etc/hosts")],
        "hosts-link",
        &["cat", "/etc/hosts"],
    );
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("is or passes through a symlink") && !out.stdout.contains("secret"),
        "{out:?}"
    );
}

/// The `termination_message` of the shim's log line for container `id`, once it is there.
fn termination_line(cd: &Containerd, id: &str) -> String {
    let mut line = String::new();
    cd.wait_for(30, "the termination message in the shim's log", || {
        let log = cd.log();
        match log
            .lines()
            .find(|l| l.contains("termination message") && l.contains(&format!("container={id} ")))
        {
            Some(l) => {
                line = l.to_string();
                true
            }
            None => false,
        }
    });
    line
}

#[test]
fn termination_log_is_read_back_when_the_container_exits() {
    preflight!("termination_log_is_read_back_when_the_container_exits");
    let cd = Containerd::start();
    let log = pod_path(&cd, "containers/job/termination-log");
    std::fs::write(&log, b"").unwrap();
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mount = rw_bind(&log, "/dev/termination-log");
    let out = cd.run(
        &["--rm", "--mount", &mount],
        "term-short",
        &[
            "sh",
            "-c",
            "printf 'job failed: bad input' > /dev/termination-log; exit 2",
        ],
    );
    assert_eq!(out.code, 2, "{out:?}\n{}", cd.log());
    let line = termination_line(&cd, "term-short");
    eprintln!("    shim log: {line}");
    assert!(
        line.contains("truncated=false")
            && line.contains("termination_message=\"job failed: bad input\""),
        "{line}"
    );
    // A longer message keeps its last 4 KiB, as kubelet does: HEAD + 4096 y + TAIL.
    let script = "s=y; for i in 1 2 3 4 5 6 7 8 9 10 11 12; do s=$s$s; done; \
                  printf 'HEAD%sTAIL' \"$s\" > /dev/termination-log";
    let out = cd.run(
        &["--rm", "--mount", &mount],
        "term-long",
        &["sh", "-c", script],
    );
    assert_eq!(out.code, 0, "{out:?}\n{}", cd.log());
    let line = termination_line(&cd, "term-long");
    let want = format!("termination_message=\"{}TAIL\"", "y".repeat(4092));
    assert!(
        line.contains("truncated=true") && line.contains(&want) && !line.contains("HEAD"),
        "{line}"
    );
    // A container user that is not root writes it too: kubelet makes the file 0666, and the
    // copy keeps the host file's mode. The init process ends by SIGTERM, not SIGKILL.
    cd.run_detached_with(&["--mount", &mount], "term-user");
    let out = cd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "w",
        "--user",
        "1000",
        "term-user",
        "sh",
        "-c",
        "id -u; printf 'written by 1000' > /dev/termination-log",
    ]);
    assert_eq!((out.code, out.stdout.as_str()), (0, "1000\n"), "{out:?}");
    assert_eq!(cd.ctr(&["task", "kill", "term-user"]).code, 0);
    let line = termination_line(&cd, "term-user");
    assert!(
        line.contains("termination_message=\"written by 1000\""),
        "{line}"
    );
    cd.wait_for(30, "the task to stop", || {
        cd.task_status("term-user").as_deref() == Some("STOPPED")
    });
    assert_eq!(cd.ctr(&["task", "delete", "term-user"]).code, 0);
    // Kubelet reads the message from its host file: the last one is written back there.
    assert_eq!(std::fs::read(&log).unwrap(), b"written by 1000");
}

#[test]
fn empty_dir_and_tmpfs_mounts_are_guest_tmpfs() {
    preflight!("empty_dir_and_tmpfs_mounts_are_guest_tmpfs");
    let cd = Containerd::start();
    let cache = pod_path(&cd, "volumes/kubernetes.io~empty-dir/cache");
    std::fs::create_dir(&cache).unwrap();
    let out = cd.run(
        &[
            "--rm",
            "--mount",
            &rw_bind(&cache, "/cache"),
            "--mount",
            "type=tmpfs,src=tmpfs,dst=/scratch,options=size=1m",
        ],
        "empty",
        &[
            "sh",
            "-c",
            "echo data > /cache/f && echo more > /scratch/g && cat /cache/f /scratch/g && \
             grep -E ' /(cache|scratch) ' /proc/mounts",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}\n{}", cd.log());
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[..2], ["data", "more"], "{out:?}");
    let mounts = &lines[2..];
    assert!(
        mounts.len() == 2
            && mounts
                .iter()
                .all(|l| l.starts_with("tmpfs ") && l.contains("nosuid,nodev"))
            && mounts[0].contains(" /cache ")
            && mounts[0].contains("size=65536k")
            && mounts[1].contains(" /scratch ")
            && mounts[1].contains("size=1024k"),
        "{out:?}"
    );
    assert_eq!(entries(&cache), Vec::<String>::new(), "written on the host");
}

/// containerd's CRI gives every container the pod sandbox's shm directory at `/dev/shm`: the
/// container runs, its `/dev/shm` is the guest's own tmpfs, and nothing reaches the host
/// directory.
#[test]
fn the_cri_sandbox_shm_is_the_guests_own_dev_shm() {
    preflight!("the_cri_sandbox_shm_is_the_guests_own_dev_shm");
    let cd = Containerd::start();
    let shm = cd
        .dir
        .path()
        .join("state/io.containerd.grpc.v1.cri/sandboxes/5f0c7a/shm");
    std::fs::create_dir_all(&shm).unwrap();
    let out = cd.run(
        &["--rm", "--mount", &rw_bind(&shm, "/dev/shm")],
        "shm",
        &[
            "sh",
            "-c",
            "echo x > /dev/shm/seg && cat /dev/shm/seg && grep ' /dev/shm ' /proc/mounts",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}\n{}", cd.log());
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines.len() == 2 && lines[0] == "x" && lines[1].starts_with("tmpfs /dev/shm "),
        "{out:?}"
    );
    assert_eq!(entries(&shm), Vec::<String>::new(), "written on the host");
}
