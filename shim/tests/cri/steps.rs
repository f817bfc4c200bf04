//! The steps every CRI test takes, as kubelet takes them: start containerd and make the
//! first calls, run a pod, wait for a container's state, read its CRI log, and remove the pod
//! checking that nothing of it is left.

use std::path::{Path, PathBuf};

use k8s_cri::v1::{ContainerConfig, ContainerState, PodSandboxConfig};

use crate::client::{Cri, pod_config};
use crate::common;
use crate::harness::{self, CriContainerd, IMAGE, doc_runtime_handler};

/// How long a VM may take to boot and answer (TCG on two shared cores).
pub const BOOT_SECS: u64 = 120;

/// A started containerd, a CRI client that has made kubelet's first call, and the handler.
pub fn start() -> (CriContainerd, Cri, String) {
    let cd = CriContainerd::start();
    let mut cri = Cri::connect(&cd.socket());
    let mut version = None;
    cd.wait_for(60, "the CRI to answer Version", || {
        assert!(
            !cd.log()
                .contains("failed to load plugin io.containerd.grpc.v1.cri"),
            "containerd's CRI did not load; {}",
            cd.log_tail()
        );
        version = cri.version().ok();
        version.is_some()
    });
    let v = version.expect("a Version answer");
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("containerd", "v1"),
        "{v:?}"
    );
    // Kubelet asks for the image before it pulls: here it was imported.
    let image = cri.image_status(IMAGE).expect("ImageStatus");
    assert!(image.is_some(), "{IMAGE} is not in the CRI's image store");
    (cd, cri, doc_runtime_handler())
}

/// `RunPodSandbox` of a pod `name` with kubelet's pod directory; the pod id, its config and
/// its directory.
pub fn run_pod(
    cd: &CriContainerd,
    cri: &mut Cri,
    handler: &str,
    name: &str,
    tweak: impl FnOnce(&mut PodSandboxConfig),
) -> (String, PodSandboxConfig, PathBuf) {
    let uid = format!("{name}-uid");
    let dir = cd.pod_dir(&uid);
    let mut config = pod_config(name, &uid, &dir.join("logs"), false);
    tweak(&mut config);
    let pod = cri
        .run_pod(&config, handler)
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}\n{}", cd.log_tail()));
    (pod, config, dir)
}

/// `StopPodSandbox` + `RemovePodSandbox`, then nothing of the pod is left: no VM process, no
/// shim, no run directory, no root reference, no shim socket, nothing mounted.
pub fn remove_pod_leaves_nothing(cd: &CriContainerd, cri: &mut Cri, pod: &str, ids: &[&str]) {
    let vms = cd.vm_pids();
    let shims = cd.shim_pids();
    cri.stop_pod(pod)
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e:?}\n{}", cd.log_tail()));
    cri.remove_pod(pod)
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e:?}\n{}", cd.log_tail()));
    cd.wait_for(60, "the pod's shims to exit", || cd.shim_pids().is_empty());
    cd.wait_for(30, "the pod's VM processes to end", || {
        vms.iter().chain(&shims).all(|p| !common::alive(*p))
    });
    assert_eq!(cd.vm_pids(), Vec::<u32>::new(), "VM processes left");
    assert_eq!(
        common::entries(&cd.run_dir()),
        Vec::<String>::new(),
        "run dirs left"
    );
    assert_eq!(
        common::entries(&cd.root_refs()),
        Vec::<String>::new(),
        "root references left"
    );
    let mut all = vec![pod];
    all.extend_from_slice(ids);
    assert_eq!(
        cd.leftover_sockets(&all),
        Vec::<String>::new(),
        "shim sockets left"
    );
    let state = cd.dir.path().join("state");
    assert_eq!(
        harness::mounts_under(&state),
        Vec::<String>::new(),
        "sandbox mounts left"
    );
}

/// The container's state, waiting up to `secs` for `want`.
pub fn wait_state(cd: &CriContainerd, cri: &mut Cri, id: &str, want: ContainerState, secs: u64) {
    let mut last = None;
    cd.wait_for(secs, &format!("container {id} to be {want:?}"), || {
        last = cri.status(id).ok().map(|s| s.state);
        last == Some(want as i32)
    });
}

/// Creates and starts a container of `pod` from `config` and waits for it to run; its id.
pub fn start_running(
    cd: &CriContainerd,
    cri: &mut Cri,
    pod: &str,
    config: &ContainerConfig,
    pod_cfg: &PodSandboxConfig,
) -> String {
    let id = cri
        .create(pod, config, pod_cfg)
        .unwrap_or_else(|e| panic!("CreateContainer: {e:?}\n{}", cd.log_tail()));
    cri.start(&id)
        .unwrap_or_else(|e| panic!("StartContainer: {e:?}\n{}", cd.log_tail()));
    wait_state(cd, cri, &id, ContainerState::ContainerRunning, BOOT_SECS);
    id
}

/// The pod's IP on the CNI bridge (`PodSandboxStatus`), empty if it has none.
pub fn pod_ip(cri: &mut Cri, pod: &str) -> String {
    cri.pod_status(pod)
        .expect("PodSandboxStatus")
        .network
        .map(|n| n.ip)
        .unwrap_or_default()
}

/// The CRI log file of a container (`<pod log dir>/<log_path>`): kubelet's `kubectl logs`.
pub fn cri_log(pod_dir: &Path, name: &str) -> String {
    std::fs::read_to_string(pod_dir.join("logs").join(name).join("0.log")).unwrap_or_default()
}

/// The lines of a CRI log (`TIMESTAMP STREAM P|F TEXT`) of `stream`, their text.
pub fn log_lines(log: &str, stream: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| {
            let mut f = l.splitn(4, ' ');
            let (_ts, s, _tag) = (f.next()?, f.next()?, f.next()?);
            (s == stream).then(|| f.next().unwrap_or("").to_string())
        })
        .collect()
}
