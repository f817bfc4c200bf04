//! The shim under Kubernetes' CRI: a real containerd 1.6 with its CRI plugin, CNI from
//! Debian's `containernetworking-plugins` (a bridge network in a network namespace the test
//! creates), the `vm` runtime configured with the snippet of `docs/containerd.md`, and a real
//! CRI client (the `k8s-cri` crate's gRPC client) making kubelet's calls in kubelet's order:
//! `Version`, `RunPodSandbox` (with the RuntimeClass's handler), `ImageStatus` (the image is
//! imported, not pulled: there is no registry offline), `CreateContainer`, `StartContainer`,
//! `ExecSync`, `ContainerStatus`, `ListContainers`, `ContainerStats`, `StopContainer`,
//! `RemoveContainer`, `StopPodSandbox`, `RemovePodSandbox`.
//!
//! - a one-container pod runs, `ExecSync` and a streaming `Exec` (a websocket to the CRI's
//!   streaming server, as kubectl opens it) return stdout, stderr and the exit code, the
//!   `/etc/hosts` it writes is the guest's copy (kubelet's host file unchanged), the
//!   container's status goes RUNNING → EXITED with its code, its log has both streams, and
//!   removing the pod leaves no VM process, shim, run dir, root reference or socket;
//! - the termination message a container writes is what kubelet reports (kubelet reads the
//!   host file it mounted; containerd's `ContainerStatus.message` is only a start error);
//! - a privileged container, a hostNetwork pod and a writable hostPath mount are refused
//!   through the CRI with the field named;
//! - a two-container pod (an httpd and a client fetching it over localhost, an `emptyDir`
//!   written by one and read by the other) runs in exactly one VM; its declared port
//!   (`vm.shim/ports`) reaches the httpd from the node at the pod's IP, and the guest has no
//!   interface but `lo` and reaches nothing outside.
//!
//! Skipped (counted) without containerd, ctr, mkfs.erofs, root, `unshare`, `ip` or the CNI
//! plugins; no guest driver fails, as elsewhere.

#[macro_use]
mod common;
#[path = "cri/client.rs"]
mod client;
#[path = "cri/harness.rs"]
mod harness;
#[path = "cri/steps.rs"]
mod steps;
#[path = "cri/stream.rs"]
mod stream;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use client::{Cri, container_config, kubelet_termination_message, pod_config, rw_mount};
use harness::{CriContainerd, IMAGE};
use k8s_cri::v1::{ContainerState, LinuxContainerSecurityContext};
use steps::{BOOT_SECS, cri_log, log_lines, remove_pod_leaves_nothing, run_pod, start, wait_state};

/// Skips (host facts) or fails (no driver: the no-driver rule) before any containerd starts.
macro_rules! cri_preflight {
    ($name:expr) => {
        if let Some(why) = harness::host_cannot() {
            vm_test_support::skip($name, &why);
            return;
        }
        if let Some(why) = common::guest_unavailable() {
            return vm_test_support::no_guest_driver($name, &why);
        }
    };
}

#[test]
fn one_container_pod_runs_execs_and_leaves_nothing() {
    cri_preflight!("one_container_pod_runs_execs_and_leaves_nothing");
    let (cd, mut cri, handler) = start();
    assert_eq!(handler, "vm", "the documented RuntimeClass's handler");
    let (pod, pod_cfg, dir) = run_pod(&cd, &mut cri, &handler, "solo", |_| {});
    let status = cri.pod_status(&pod).expect("PodSandboxStatus");
    assert_eq!(status.state, 0, "SANDBOX_READY: {status:?}");
    let ip = status.network.map(|n| n.ip).unwrap_or_default();
    assert!(ip.starts_with("10.99.0."), "the pod's CNI address: {ip:?}");

    // Runs until an exec tells it to end, then exits 4 with a line on each stream.
    let script = "echo started; while [ ! -e /done ]; do sleep 0.2; done; \
                  echo finishing >&2; exit 4";
    // Kubelet's own /etc/hosts for the pod (`<pod dir>/etc-hosts`, a writable bind).
    let hosts = dir.join("etc-hosts");
    let original = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.99.0.2\tsolo\n";
    std::fs::write(&hosts, original).expect("etc-hosts");
    let mounts = vec![rw_mount(&hosts, "/etc/hosts")];
    let config = container_config("main", IMAGE, &["sh", "-c", script], mounts);
    let id = cri
        .create(&pod, &config, &pod_cfg)
        .unwrap_or_else(|e| panic!("CreateContainer: {e:?}\n{}", cd.log_tail()));
    cri.start(&id)
        .unwrap_or_else(|e| panic!("StartContainer: {e:?}\n{}", cd.log_tail()));
    wait_state(
        &cd,
        &mut cri,
        &id,
        ContainerState::ContainerRunning,
        BOOT_SECS,
    );

    let out = cri
        .exec_sync(&id, &["sh", "-c", "echo out; echo err >&2; exit 3"], 60)
        .unwrap_or_else(|e| panic!("ExecSync: {e:?}\n{}", cd.log_tail()));
    assert_eq!(
        (
            String::from_utf8_lossy(&out.stdout).as_ref(),
            String::from_utf8_lossy(&out.stderr).as_ref(),
            out.exit_code
        ),
        ("out\n", "err\n", 3),
        "{out:?}"
    );
    // The streaming `Exec`, through the CRI's streaming server as kubectl reaches it.
    let url = cri
        .exec(&id, &["sh", "-c", "echo streamed; echo to-err >&2; exit 5"])
        .unwrap_or_else(|e| panic!("Exec: {e:?}\n{}", cd.log_tail()));
    let streamed = stream::exec(cd.pid(), &url);
    assert_eq!(
        (streamed.stdout.as_slice(), streamed.stderr.as_slice()),
        (b"streamed\n".as_slice(), b"to-err\n".as_slice()),
        "{streamed:?}"
    );
    assert!(
        streamed.status.contains("NonZeroExitCode") && streamed.status.contains("\"5\""),
        "the exit code in the stream's status: {streamed:?}"
    );

    let status = cri.status(&id).expect("ContainerStatus");
    assert_eq!(
        status.state,
        ContainerState::ContainerRunning as i32,
        "{status:?}"
    );
    assert!(
        status.started_at > 0 && status.finished_at == 0,
        "{status:?}"
    );
    assert_eq!(
        status.metadata.as_ref().map(|m| m.name.as_str()),
        Some("main")
    );

    let listed = cri.list(&pod).expect("ListContainers");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, id);
    assert_eq!(listed[0].state, ContainerState::ContainerRunning as i32);

    // The container writes its /etc/hosts (the guest's copy); the host file stays as it was.
    let out = cri
        .exec_sync(
            &id,
            &[
                "sh",
                "-c",
                "echo '10.0.0.9 added' >> /etc/hosts && cat /etc/hosts",
            ],
            60,
        )
        .expect("ExecSync");
    assert_eq!(
        (String::from_utf8_lossy(&out.stdout), out.exit_code),
        (format!("{original}10.0.0.9 added\n").into(), 0),
        "{out:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&hosts).expect("etc-hosts"),
        original,
        "the host file was written"
    );

    let stats = cri
        .stats(&id)
        .unwrap_or_else(|e| panic!("ContainerStats: {e:?}\n{}", cd.log_tail()));
    assert_eq!(
        stats.attributes.as_ref().map(|a| a.id.as_str()),
        Some(id.as_str())
    );
    let cpu = stats
        .cpu
        .and_then(|c| c.usage_core_nano_seconds)
        .map(|v| v.value);
    let mem = stats
        .memory
        .and_then(|m| m.working_set_bytes)
        .map(|v| v.value);
    // The container's own cgroup in the pod's VM: some CPU time, and memory charged to it
    // that is far below the VM's (a shell loop, not the guest kernel and agent).
    assert!(
        cpu.unwrap_or(0) > 0 && (1..64 << 20).contains(&mem.unwrap_or(0)),
        "the container's CPU time and memory: cpu {cpu:?} memory {mem:?}"
    );
    assert!(!cd.vm_pids().is_empty(), "no VM process");

    // The container ends by itself: EXITED with its code, both streams in its log.
    let out = cri
        .exec_sync(&id, &["sh", "-c", "echo > /done"], 60)
        .expect("ExecSync");
    assert_eq!(out.exit_code, 0, "{out:?}");
    wait_state(&cd, &mut cri, &id, ContainerState::ContainerExited, 60);
    let status = cri.status(&id).expect("ContainerStatus");
    assert_eq!(
        (
            status.exit_code,
            status.reason.as_str(),
            status.message.as_str()
        ),
        (4, "Error", ""),
        "{status:?}"
    );
    assert!(status.finished_at >= status.started_at, "{status:?}");
    let log = cri_log(&dir, "main");
    assert_eq!(log_lines(&log, "stdout"), ["started"], "{log}");
    assert_eq!(log_lines(&log, "stderr"), ["finishing"], "{log}");

    cri.stop(&id, 10).expect("StopContainer");
    cri.remove(&id).expect("RemoveContainer");
    assert_eq!(cri.list(&pod).expect("ListContainers"), vec![]);
    remove_pod_leaves_nothing(&cd, &mut cri, &pod, &[&id]);
}

/// What a kubelet reports as the termination message of a container that wrote
/// `/dev/termination-log`: kubelet reads the host file it mounted there (found through
/// `ContainerStatus.mounts`), and containerd 1.6's `ContainerStatus.message` is empty for a
/// container that ran (it holds only a start error). Passes once the shim writes the guest's
/// message (its last 4 KiB) back into that host file when the container exits, before the
/// exit is reported: the file is read at the first `ContainerStatus` that says EXITED
/// (containerd's CRI deletes the task before it marks the container EXITED, and the shim's
/// delete waits for the init process's exit handling, the termination log's read included).
#[test]
fn termination_message_is_what_kubelet_reports() {
    cri_preflight!("termination_message_is_what_kubelet_reports");
    let (cd, mut cri, handler) = start();
    let (pod, pod_cfg, dir) = run_pod(&cd, &mut cri, &handler, "term", |_| {});
    // Kubelet's file: `<pod dir>/containers/<name>/<id>`, empty, 0666.
    let host = dir.join("containers/job/3f2a");
    std::fs::create_dir_all(host.parent().expect("a parent")).expect("the containers dir");
    std::fs::write(&host, b"").expect("the termination log");
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let script = "printf 'job failed: bad input' > /dev/termination-log; exit 2";
    let config = container_config(
        "job",
        IMAGE,
        &["sh", "-c", script],
        vec![rw_mount(&host, client::TERMINATION_LOG)],
    );
    let id = cri
        .create(&pod, &config, &pod_cfg)
        .expect("CreateContainer");
    cri.start(&id)
        .unwrap_or_else(|e| panic!("StartContainer: {e:?}\n{}", cd.log_tail()));
    // Kubelet's view at the first ContainerStatus that says EXITED (polled closely).
    let mut exited = None;
    let ended = harness::poll_every(Duration::from_millis(10), BOOT_SECS, || {
        exited = cri
            .status(&id)
            .ok()
            .filter(|s| s.state == ContainerState::ContainerExited as i32);
        exited.is_some()
    });
    assert!(ended, "the container did not exit; {}", cd.log_tail());
    let status = exited.expect("an EXITED status");
    assert_eq!((status.exit_code, status.reason.as_str()), (2, "Error"));
    eprintln!(
        "    containerd's ContainerStatus.message: {:?}",
        status.message
    );
    // Kubelet reads the file as soon as the CRI says EXITED: so does this test, without
    // waiting for anything else (the message must be there before the exit is reported).
    let seen = kubelet_termination_message(&status);
    // The shim read the guest's message back (its log line).
    cd.wait_for(30, "the shim's termination message line", || {
        cd.log().lines().any(|l| {
            l.contains("termination message")
                && l.contains("termination_message=\"job failed: bad input\"")
        })
    });
    assert_eq!(
        seen,
        "job failed: bad input",
        "what kubelet reports (the host file it mounted at {} holds {:?} now; containerd's \
         message {:?})",
        client::TERMINATION_LOG,
        std::fs::read_to_string(&host),
        status.message
    );
    cri.remove(&id).expect("RemoveContainer");
    remove_pod_leaves_nothing(&cd, &mut cri, &pod, &[&id]);
}

/// The CRI error of a container that is refused at `StartContainer` (containerd creates the
/// task there), also kept as the container's `ContainerStatus.message` (reason StartError),
/// which is what kubelet shows.
fn refused_at_start(cd: &CriContainerd, cri: &mut Cri, id: &str) -> String {
    let err = match cri.start(id) {
        Ok(()) => panic!("StartContainer of {id} was not refused\n{}", cd.log_tail()),
        Err(e) => e.message().to_string(),
    };
    let status = cri.status(id).expect("ContainerStatus");
    assert_eq!(
        (status.state, status.reason.as_str()),
        (ContainerState::ContainerExited as i32, "StartError"),
        "{status:?}"
    );
    assert!(status.message.contains("refused: "), "{status:?}");
    err
}

#[test]
fn privileged_host_network_and_writable_host_path_are_refused_naming_the_field() {
    cri_preflight!("privileged_host_network_and_writable_host_path_are_refused_naming_the_field");
    let (cd, mut cri, handler) = start();

    // A hostNetwork pod: refused at RunPodSandbox, naming the network namespace.
    let uid = "hostnet-uid";
    let config = pod_config("hostnet", uid, &cd.pod_dir(uid).join("logs"), true);
    let err = cri
        .run_pod(&config, &handler)
        .expect_err("a hostNetwork pod was not refused");
    eprintln!("    hostNetwork: {}", err.message());
    assert!(
        err.message()
            .contains("refused: linux.namespaces: no network namespace")
            && err.message().contains("hostNetwork"),
        "{err:?}"
    );
    assert_eq!(
        cd.vm_pids(),
        Vec::<u32>::new(),
        "a VM runs for a refused pod"
    );

    // A privileged pod (kubelet allows privileged containers only in one), in which a
    // privileged container and a writable hostPath mount are each refused.
    let (pod, pod_cfg, dir) = run_pod(&cd, &mut cri, &handler, "priv", |c| {
        if let Some(sc) = c.linux.as_mut().and_then(|l| l.security_context.as_mut()) {
            sc.privileged = true;
        }
    });
    let mut config = container_config("root", IMAGE, &["true"], vec![]);
    if let Some(l) = config.linux.as_mut() {
        l.security_context = Some(LinuxContainerSecurityContext {
            privileged: true,
            ..l.security_context.clone().unwrap_or_default()
        });
    }
    let privileged = cri
        .create(&pod, &config, &pod_cfg)
        .expect("CreateContainer");
    let err = refused_at_start(&cd, &mut cri, &privileged);
    eprintln!("    privileged: {err}");
    assert!(
        err.contains("refused: process.capabilities.") && err.contains("privileged"),
        "{err}"
    );

    let data = dir.join("hostdata");
    std::fs::create_dir(&data).expect("the hostPath directory");
    let config = container_config("hp", IMAGE, &["true"], vec![rw_mount(&data, "/data")]);
    let host_path = cri
        .create(&pod, &config, &pod_cfg)
        .expect("CreateContainer");
    let err = refused_at_start(&cd, &mut cri, &host_path);
    eprintln!("    hostPath: {err}");
    let want = format!(
        "(/data): writable host bind mount of {}; only read-only (ro) is allowed",
        data.display()
    );
    assert!(
        err.contains("refused: mounts[") && err.contains(&want),
        "{err}"
    );
    assert_eq!(common::entries(&data), Vec::<String>::new());

    // Issue 39: a writable hostPath of a host file at kubelet's `/dev/termination-log` (a pod
    // may mount a volume there) is a hostPath like any other: refused, never written. Before,
    // the root shim copied it in and wrote the container's bytes back into the host file.
    let victim = dir.join("authorized_keys");
    std::fs::write(&victim, b"ssh-ed25519 AAAA admin\n").expect("the host file");
    let config = container_config(
        "tl",
        IMAGE,
        &["sh", "-c", "echo X > /dev/termination-log"],
        vec![rw_mount(&victim, "/dev/termination-log")],
    );
    let term_path = cri
        .create(&pod, &config, &pod_cfg)
        .expect("CreateContainer");
    let err = refused_at_start(&cd, &mut cri, &term_path);
    eprintln!("    hostPath at /dev/termination-log: {err}");
    assert!(
        err.contains(&format!(
            "(/dev/termination-log): writable host bind mount of {}",
            victim.display()
        )),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&victim).expect("the host file"),
        b"ssh-ed25519 AAAA admin\n"
    );

    for id in [&privileged, &host_path, &term_path] {
        cri.remove(id).expect("RemoveContainer");
    }
    remove_pod_leaves_nothing(&cd, &mut cri, &pod, &[&privileged, &host_path, &term_path]);
}

/// A pod of two containers in one VM: a busybox httpd on 8080 and a client that fetches
/// `http://127.0.0.1:8080/` (the pod's localhost) in a loop; the client's log shows the page;
/// exactly one VM process runs for the pod; an `emptyDir` written by the server is read by
/// the client.
#[test]
fn two_container_pod_shares_one_vm_localhost_and_empty_dir() {
    cri_preflight!("two_container_pod_shares_one_vm_localhost_and_empty_dir");
    let (cd, mut cri, handler) = start();
    let (pod, pod_cfg, dir) = run_pod(&cd, &mut cri, &handler, "web", |c| {
        c.annotations.insert("vm.shim/ports".into(), "8080".into());
    });
    let shared = dir.join("volumes/kubernetes.io~empty-dir/shared");
    std::fs::create_dir_all(&shared).expect("the emptyDir");
    let server = container_config(
        "server",
        IMAGE,
        &[
            "sh",
            "-c",
            "echo 'hello from the pod' > /index.html && \
             echo 'written by the server' > /shared/note && exec httpd -f -p 8080 -h /",
        ],
        vec![rw_mount(&shared, "/shared")],
    );
    let client = container_config(
        "client",
        IMAGE,
        &[
            "sh",
            "-c",
            "while true; do wget -q -O - http://127.0.0.1:8080/ && cat /shared/note; \
             sleep 1; done",
        ],
        vec![rw_mount(&shared, "/shared")],
    );
    let mut ids = Vec::new();
    for config in [&server, &client] {
        let id = cri
            .create(&pod, config, &pod_cfg)
            .unwrap_or_else(|e| panic!("CreateContainer: {e:?}\n{}", cd.log_tail()));
        cri.start(&id)
            .unwrap_or_else(|e| panic!("StartContainer: {e:?}\n{}", cd.log_tail()));
        ids.push(id);
    }
    for id in &ids {
        wait_state(
            &cd,
            &mut cri,
            id,
            ContainerState::ContainerRunning,
            BOOT_SECS,
        );
    }
    // The server answers in its own container first (this holds with a VM per container too).
    let mut own = None;
    let answered = harness::poll(30, || {
        own = cri
            .exec_sync(
                &ids[0],
                &["wget", "-q", "-O", "-", "http://127.0.0.1:8080/"],
                20,
            )
            .ok();
        own.as_ref()
            .is_some_and(|o| o.stdout == b"hello from the pod\n")
    });
    assert!(
        answered,
        "the httpd did not answer in its own container: {own:?}"
    );
    let vms = cd.vm_pids();
    let mut log = String::new();
    // The page, then (the loop's next command) the note: wait for both, as the client writes
    // them one after the other.
    let served = harness::poll(60, || {
        log = cri_log(&dir, "client");
        let lines = log_lines(&log, "stdout");
        lines.contains(&"hello from the pod".to_string())
            && lines.contains(&"written by the server".to_string())
    });
    assert!(
        served,
        "the client's log never showed the server's page over the pod's localhost ({} VM \
         processes for the pod: {vms:?}); the client's log ends:\n{}\n{}",
        vms.len(),
        common::tail(&log, 1500),
        cd.log_tail()
    );
    assert_eq!(vms.len(), 1, "one VM process for the pod: {vms:?}");
    let lines = log_lines(&log, "stdout");
    assert!(
        lines.iter().any(|l| l == "written by the server"),
        "the emptyDir written by the server, read by the client: {log}"
    );
    assert_eq!(
        common::entries(&shared),
        Vec::<String>::new(),
        "the emptyDir reached the host directory"
    );
    // The pod's declared port, from the node to the pod's IP (as a Service's traffic comes):
    // the shim listens in the pod's network namespace and forwards into the VM.
    let ip = cri
        .pod_status(&pod)
        .expect("PodSandboxStatus")
        .network
        .map(|n| n.ip)
        .unwrap_or_default();
    let url = format!("http://{ip}:8080/");
    let mut page = None;
    let reached = harness::poll(30, || {
        let out = cd.in_node_net(&["curl", "-sS", "--max-time", "3", &url]);
        page = Some(out);
        page.as_ref()
            .is_some_and(|o| o.stdout == "hello from the pod\n")
    });
    assert!(reached, "{url} from the node: {page:?}\n{}", cd.log_tail());
    // And nothing in the guest reaches out: its only interface is lo, and the node's
    // gateway address on the pod network is unreachable.
    let probe = cri
        .exec_sync(
            &ids[1],
            &[
                "sh",
                "-c",
                "busybox awk -F: 'NR>2 {gsub(/ /, \"\", $1); print $1}' /proc/net/dev; \
                 busybox nc -w 2 10.99.0.1 8080 </dev/null; echo nc=$?",
            ],
            30,
        )
        .expect("ExecSync");
    assert_eq!(
        String::from_utf8_lossy(&probe.stdout),
        "lo\nnc=1\n",
        "{probe:?}"
    );
    for id in &ids {
        cri.stop(id, 10).expect("StopContainer");
        cri.remove(id).expect("RemoveContainer");
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    remove_pod_leaves_nothing(&cd, &mut cri, &pod, &ids);
}
