//! One microVM per pod, under a real containerd (the harness of `containerd.rs`), with the
//! annotations containerd's CRI puts on a pod's bundles given through `ctr run --annotation`:
//! the sandbox boots the pod's VM; the app containers run inside it, each in its own root
//! (one container's files are not another's), sharing the VM's loopback (a client reaches
//! its neighbour's httpd on `localhost`) and the pod's `emptyDir`; `exec` runs in the
//! container's root; a deleted container's disks serve the next one; deleting the sandbox
//! leaves no VM, shim or pod disk behind.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};

use common::{Containerd, Out, entries};

const SANDBOX: &str = "io.kubernetes.cri.container-type=sandbox";
const MEMBER: &str = "io.kubernetes.cri.container-type=container";

fn sandbox_of(id: &str) -> String {
    format!("io.kubernetes.cri.sandbox-id={id}")
}

fn rw_bind(src: &Path, dst: &str) -> String {
    format!("type=bind,src={},dst={dst},options=rbind:rw", src.display())
}

/// An `emptyDir` host directory shaped like kubelet's.
fn empty_dir(cd: &Containerd, name: &str) -> PathBuf {
    let p = cd
        .dir
        .path()
        .join("pods/7f3a-uid/volumes/kubernetes.io~empty-dir")
        .join(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// `ctr run` flags that make `id`… a member of pod `pod`.
fn member(pod: &str) -> Vec<String> {
    vec![
        "--annotation".into(),
        MEMBER.into(),
        "--annotation".into(),
        sandbox_of(pod),
    ]
}

fn run(cd: &Containerd, flags: &[String], id: &str, argv: &[&str]) -> Out {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    cd.run(&flags, id, argv)
}

#[test]
fn a_pod_is_one_vm_whose_containers_share_localhost_and_an_empty_dir() {
    preflight!("a_pod_is_one_vm_whose_containers_share_localhost_and_an_empty_dir");
    let cd = Containerd::start();
    let shared = empty_dir(&cd, "shared");
    let sandbox = ["--annotation", SANDBOX, "--annotation", &sandbox_of("pod1")];
    cd.run_detached_with(&sandbox, "pod1");
    assert_eq!(entries(&cd.run_dir()).len(), 1, "the pod's VM");

    let mut web = member("pod1");
    web.extend(["-d".into(), "--mount".into(), rw_bind(&shared, "/shared")]);
    let out = run(
        &cd,
        &web,
        "web",
        &[
            "sh",
            "-c",
            "echo from-web > /shared/note && echo web-only > /mine && \
             mkdir /www && echo '<p>pod page</p>' > /www/index.html && \
             exec busybox httpd -f -p 127.0.0.1:8080 -h /www",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}\n{}", cd.log());

    // kubelet's /etc/hosts names localhost (the image has none); the container's copy is its
    // own.
    let hosts = cd.dir.path().join("pods/7f3a-uid/etc-hosts");
    std::fs::write(&hosts, "127.0.0.1\tlocalhost\n").unwrap();
    let mut client = member("pod1");
    client.extend([
        "--rm".into(),
        "--mount".into(),
        rw_bind(&shared, "/shared"),
        "--mount".into(),
        rw_bind(&hosts, "/etc/hosts"),
    ]);
    let out = run(
        &cd,
        &client,
        "client",
        &[
            "sh",
            "-c",
            "for i in $(busybox seq 100); do busybox wget -q -O - http://localhost:8080/ \
             2>/dev/null && break; sleep 0.1; done; echo '10.0.0.7 added' >> /etc/hosts; \
             cat /shared/note; test -e /mine && echo shared-root || echo own-root",
        ],
    );
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "<p>pod page</p>\nfrom-web\nown-root\n"),
        "{out:?}\n{}",
        cd.log()
    );
    assert_eq!(std::fs::read(&hosts).unwrap(), b"127.0.0.1\tlocalhost\n");
    assert_eq!(entries(&cd.run_dir()).len(), 1, "still one VM for the pod");
    assert_eq!(cd.shim_pids().len(), 1, "one shim serves the pod");
    assert_eq!(
        cd.task_pids("web"),
        cd.task_pids("pod1"),
        "web runs in the pod's VM"
    );
    assert!(
        entries(&shared).is_empty(),
        "the emptyDir is the guest's tmpfs"
    );

    // An exec runs in the container's own root.
    let out = cd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "e1",
        "web",
        "sh",
        "-c",
        "cat /mine; echo to-stderr >&2; exit 3",
    ]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (3, "web-only\n"),
        "{out:?}"
    );
    assert!(out.stderr.contains("to-stderr"), "{out:?}");
    // In a mount namespace of its own (its root pivoted in, the VM's detached), not the
    // sandbox's (its own PID namespace hides the sandbox's processes, so the two execs each
    // say theirs; namespace ids are the kernel's, one space for the whole VM).
    let mnt_ns = |task: &str, exec_id: &str| {
        let out = cd.ctr(&[
            "task",
            "exec",
            "--exec-id",
            exec_id,
            task,
            "sh",
            "-c",
            "busybox readlink /proc/self/ns/mnt",
        ]);
        assert_eq!(out.code, 0, "{task}: {out:?}");
        out.stdout
    };
    let (own, sandbox) = (mnt_ns("web", "e2"), mnt_ns("pod1", "e2s"));
    assert!(own.starts_with("mnt:["), "{own:?}");
    assert!(sandbox.starts_with("mnt:["), "{sandbox:?}");
    assert_ne!(
        own, sandbox,
        "the app container's exec is in the sandbox's mount namespace"
    );

    // Its stats are its own cgroup's in the guest: its processes (httpd, none of the VM's host
    // processes), the memory charged to it (far below the VM's resident memory), CPU time.
    let metrics = |id: &str| -> serde_json::Value {
        let out = cd.ctr(&["task", "metrics", "--format", "json", id]);
        assert_eq!(out.code, 0, "{out:?}");
        serde_json::from_str(&out.stdout).expect("metrics JSON")
    };
    let (web_m, pod_m) = (metrics("web"), metrics("pod1"));
    let memory = |m: &serde_json::Value| m["memory"]["usage"]["usage"].as_u64().unwrap_or(0);
    assert_eq!(web_m["pids"]["current"].as_u64(), Some(1), "{web_m}");
    assert!(
        memory(&web_m) > 0 && memory(&web_m) < memory(&pod_m) / 4,
        "web {web_m}\npod {pod_m}"
    );
    assert!(
        web_m["cpu"]["usage"]["total"].as_u64().unwrap_or(0) > 0,
        "{web_m}"
    );

    // A deleted container gives its disk back: more containers than the pod has disks run
    // one after another.
    cd.kill_and_delete("web");
    for i in 0..14 {
        let id = format!("again{i}");
        let mut flags = member("pod1");
        flags.push("--rm".into());
        let out = run(
            &cd,
            &flags,
            &id,
            &["sh", "-c", "test -e /mine || echo clean"],
        );
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (0, "clean\n"),
            "{id}: {out:?}\n{}",
            cd.log()
        );
    }

    let pods = cd.snapshots().join("pods");
    assert_eq!(entries(&pods).len(), 1, "the pod's disks");
    cd.kill_and_delete("pod1");
    let _ = cd.ctr(&["container", "delete", "pod1"]);
    cd.wait_for(30, "the pod's shim to exit", || cd.shim_pids().is_empty());
    assert!(entries(&cd.run_dir()).is_empty(), "a VM run dir is left");
    assert!(entries(&pods).is_empty(), "the pod's disks are left");
}

#[test]
fn a_container_of_a_pod_that_is_not_running_is_refused() {
    preflight!("a_container_of_a_pod_that_is_not_running_is_refused");
    let cd = Containerd::start();
    let mut flags = member("nopod");
    flags.push("--rm".into());
    let out = run(&cd, &flags, "orphan", &["true"]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("io.kubernetes.cri.sandbox-id") && out.stderr.contains("nopod"),
        "{out:?}"
    );
    assert!(entries(&cd.run_dir()).is_empty(), "no VM booted");
}

/// A network namespace made for one test (`ip netns add`), with its loopback up; deleted
/// when dropped.
struct NetNs(String);

impl NetNs {
    fn new(tag: &str) -> NetNs {
        let name = format!("vmshim-{tag}-{}", std::process::id());
        let ip = |args: &[&str]| {
            let out = Out::from(
                std::process::Command::new("ip")
                    .args(args)
                    .output()
                    .expect("running ip"),
            );
            assert_eq!(out.code, 0, "ip {args:?}: {out:?}");
        };
        ip(&["netns", "add", &name]);
        let ns = NetNs(name);
        ip(&["netns", "exec", &ns.0, "ip", "link", "set", "lo", "up"]);
        ns
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }

    /// `argv` run inside the namespace.
    fn exec(&self, argv: &[&str]) -> Out {
        Out::from(
            std::process::Command::new("ip")
                .args(["netns", "exec", &self.0])
                .args(argv)
                .output()
                .expect("running ip netns exec"),
        )
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

#[test]
fn a_pods_port_is_reached_from_its_network_namespace_and_its_guest_reaches_nothing() {
    preflight!("a_pods_port_is_reached_from_its_network_namespace_and_its_guest_reaches_nothing");
    if !common::oci_common::have("ip") || !common::oci_common::have("curl") {
        return vm_test_support::skip(
            "a_pods_port_is_reached_from_its_network_namespace_and_its_guest_reaches_nothing",
            "ip (iproute2) or curl is not installed",
        );
    }
    let cd = Containerd::start();
    let ns = NetNs::new("ports");
    let with_ns = format!("network:{}", ns.path());
    let sandbox = [
        "--with-ns",
        &with_ns,
        "--annotation",
        SANDBOX,
        "--annotation",
        &sandbox_of("pod2"),
        "--annotation",
        "vm.shim/ports=8080",
    ];
    cd.run_detached_with(&sandbox, "pod2");
    let mut web = member("pod2");
    web.push("-d".into());
    let out = run(
        &cd,
        &web,
        "web2",
        &[
            "sh",
            "-c",
            "mkdir /www && echo 'served in the VM' > /www/index.html && \
             exec busybox httpd -f -p 127.0.0.1:8080 -h /www",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}\n{}", cd.log());

    // From the pod's namespace, as a Service or port-forward reaches it.
    let mut page = None;
    for _ in 0..100 {
        let out = ns.exec(&["curl", "-sS", "--max-time", "3", "http://127.0.0.1:8080/"]);
        if out.code == 0 {
            page = Some(out.stdout);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(page.as_deref(), Some("served in the VM\n"), "{}", cd.log());

    // The guest has no network device but its loopback, and reaches no address outside.
    let mut probe = member("pod2");
    probe.push("--rm".into());
    let out = run(
        &cd,
        &probe,
        "probe",
        &[
            "sh",
            "-c",
            "busybox awk -F: 'NR>2 {gsub(/ /, \"\", $1); print $1}' /proc/net/dev; \
             busybox nc -w 2 192.0.2.1 80 </dev/null; echo nc=$?",
        ],
    );
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "lo\nnc=1\n"),
        "{out:?}"
    );

    cd.kill_and_delete("web2");
    cd.kill_and_delete("pod2");
    cd.wait_for(30, "the pod's shim to exit", || cd.shim_pids().is_empty());
    // curl's 7: the connection was refused (nothing listens in the namespace any more).
    let out = ns.exec(&["curl", "-sS", "--max-time", "3", "http://127.0.0.1:8080/"]);
    assert_eq!(out.code, 7, "the port is still served: {out:?}");
}

#[test]
fn a_containers_limits_are_its_own_cgroups_in_the_pods_vm() {
    preflight!("a_containers_limits_are_its_own_cgroups_in_the_pods_vm");
    let cd = Containerd::start();
    let sandbox = ["--annotation", SANDBOX, "--annotation", &sandbox_of("pod3")];
    cd.run_detached_with(&sandbox, "pod3");
    // Every process of a container is in one cgroup of its own (its leaf's parent), whose
    // memory.max and cpu.max are the container's limits: a memory limit below the 64 MiB a
    // VM needs, as a container's may be, and half a CPU.
    let show = [
        "sh",
        "-c",
        "g=$(busybox cut -d: -f3 /proc/self/cgroup); g=${g%/*}; echo ${g%/*}; \
         cat /sys/fs/cgroup$g/memory.max /sys/fs/cgroup$g/cpu.max",
    ];
    let mut capped = member("pod3");
    capped.extend([
        "--rm".into(),
        "--memory-limit".into(),
        (48u64 << 20).to_string(),
        "--cpus".into(),
        "0.5".into(),
    ]);
    let out = run(&cd, &capped, "capped", &show);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "/work\n50331648\n50000 100000\n"),
        "{out:?}\n{}",
        cd.log()
    );
    let mut free = member("pod3");
    free.push("--rm".into());
    let out = run(&cd, &free, "free", &show);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "/work\nmax\nmax 100000\n"),
        "{out:?}"
    );
    cd.kill_and_delete("pod3");
}
