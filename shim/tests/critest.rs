//! Kubernetes' CRI conformance suite (`critest`, cri-tools v1.32.0) against the shim, on the
//! node `cri.rs` makes (its harness: a real containerd 1.6 with its CRI in a network
//! namespace of its own, CNI bridge, the `vm` runtime as `docs/containerd.md` gives it) plus
//! what critest's own specs need: its test images served by a plain-HTTP registry in that
//! namespace (Debian's `docker-registry`, filled by the kit's `mkimages.py`) that containerd
//! pulls `registry.k8s.io/…` and `gcr.io/…` through, the static `pause:3.6` as the sandbox
//! image, and CNI's `portmap` for `hostPort`.
//!
//! Run by `ci/critest.sh` (which builds critest and the images from `../shared/critest`), not
//! in the default set: it needs `VM_CRITEST` (the critest binary), `VM_CRITEST_IMAGES` (the
//! images `mkimages.py build` wrote) and `VM_CRITEST_MKIMAGES` (the script, to push them).
//! It fails on any spec that fails outside [`EXPECTED`] (the refusals by design, each with
//! the field its message must name, and the four failures that are not the runtime's), on
//! an expected failure that did not fail so, and below [`MIN_PASSED`] passed; it prints the
//! totals.

#[macro_use]
mod common;
#[allow(dead_code)]
#[macro_use]
#[path = "cri/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use harness::{CriContainerd, Node};

/// Specs that fail on purpose, and what the failure must say. Refused by design
/// (docs/containerd.md, "Refused by design"), naming the field:
const EXPECTED: &[(&str, &str)] = &[
    // Privileged or added capabilities: `process.capabilities` beyond the default set.
    (
        "Container Mount Propagation / runtime should support mount propagation / mount with 'rprivate' should not support propagation",
        "refused: process.capabilities.",
    ),
    (
        "Container Mount Propagation / runtime should support mount propagation / mount with 'rshared' should support propagation from host to container and vice versa",
        "refused: process.capabilities.",
    ),
    (
        "Container Mount Propagation / runtime should support mount propagation / mount with 'rslave' should support propagation from host to container",
        "refused: process.capabilities.",
    ),
    (
        "Security Context / bucket / runtime should support Privileged is true",
        "refused: process.capabilities.",
    ),
    (
        "Security Context / bucket / runtime should support adding capability",
        "refused: process.capabilities.",
    ),
    (
        "Security Context / bucket / runtime should support adding ALL capabilities",
        "refused: process.capabilities.",
    ),
    (
        "Security Context / SeccompProfilePath / runtime should not block setting host name with unconfined seccomp and SYS_ADMIN",
        "refused: process.capabilities.",
    ),
    (
        "Security Context / SeccompProfilePath / runtime should support an seccomp profile that blocks setting hostname with SYS_ADMIN",
        "refused: process.capabilities.",
    ),
    (
        "Security Context / SeccompProfilePath / runtime should ignore a seccomp profile that blocks setting hostname when privileged",
        "refused: process.capabilities.",
    ),
    // The host's network: no network namespace.
    (
        "Security Context / NamespaceOption / runtime should support HostNetwork is true",
        "refused: linux.namespaces: no network namespace",
    ),
    (
        "Streaming / runtime should support streaming interfaces / runtime should support portforward in host network",
        "refused: linux.namespaces: no network namespace",
    ),
    // The host's IPC namespace.
    (
        "Security Context / NamespaceOption / runtime should support HostIpc is true",
        "refused: linux.namespaces (ipc)",
    ),
    // A writable hostPath: a writable host bind mount.
    (
        "Container / runtime should support adding volume and device / runtime should support starting container with volume [Conformance]",
        "writable host bind mount of",
    ),
    (
        "Container / runtime should support adding volume and device / runtime should support starting container with volume when host path is a symlink [Conformance]",
        "writable host bind mount of",
    ),
    // Not the runtime's: an upstream digest cannot be rebuilt offline, and containerd 1.6.20
    // itself answers NotFound for an unknown pod or container id.
    (
        "Image Manager / public image with digest should be pulled and removed [Conformance]",
        "failed to pull image",
    ),
    (
        "Idempotence / StopPodSandbox / should not return an error if not found",
        "code = NotFound",
    ),
    (
        "Idempotence / StopContainer / should not return an error if not found",
        "code = NotFound",
    ),
];

/// The fewest specs that must pass: every one containerd 1.6 and this host let run (87 of
/// 113), but [`EXPECTED`] (17).
const MIN_PASSED: usize = 70;

/// The registry critest's images are served from, in the node's network namespace.
const REGISTRY: &str = "127.0.0.1:5000";

fn env_path(name: &str) -> PathBuf {
    std::env::var_os(name)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{name} is not set: this test is run by ci/critest.sh"))
}

/// One spec of ginkgo's JSON report: its name (the containers' texts and its own, `/`-joined),
/// its state and its failure message.
#[derive(Debug)]
struct Spec {
    name: String,
    state: String,
    message: String,
}

/// The `It` specs of ginkgo's JSON report.
fn specs(report: &serde_json::Value) -> Vec<Spec> {
    let mut out = Vec::new();
    for suite in report.as_array().into_iter().flatten() {
        for s in suite["SpecReports"].as_array().into_iter().flatten() {
            if s["LeafNodeType"] != "It" {
                continue;
            }
            let mut parts: Vec<String> = s["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str())
                .map(|t| t.trim_start_matches("[k8s.io] ").to_string())
                .collect();
            parts.push(s["LeafNodeText"].as_str().unwrap_or("").to_string());
            out.push(Spec {
                name: parts.join(" / "),
                state: s["State"].as_str().unwrap_or("").to_string(),
                message: s["Failure"]["Message"].as_str().unwrap_or("").to_string(),
            });
        }
    }
    out
}

/// docker-registry serving an empty store on [`REGISTRY`] in the node's network namespace.
fn registry(node: &CriContainerd) -> std::process::Child {
    let d = node.dir.path();
    let config = format!(
        "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {REGISTRY}\n",
        d.join("registry").display()
    );
    std::fs::write(d.join("registry.yml"), config).expect("registry.yml");
    let child = Command::new("nsenter")
        .arg(format!("--net=/proc/{}/ns/net", node.pid()))
        .args(["docker-registry", "serve"])
        .arg(d.join("registry.yml"))
        .stdin(Stdio::null())
        .stdout(common::append_log(&d.join("registry.log")))
        .stderr(common::append_log(&d.join("registry.log")))
        .spawn()
        .expect("starting docker-registry");
    node.wait_for(30, "the registry to answer", || {
        let url = format!("http://{REGISTRY}/v2/");
        node.in_node_net(&["curl", "-fsS", &url]).code == 0
    });
    child
}

#[test]
fn critest_passes_but_the_refusals_by_design() {
    cri_preflight!("critest_passes_but_the_refusals_by_design");
    let (critest, images, mkimages) = (
        env_path("VM_CRITEST"),
        env_path("VM_CRITEST_IMAGES"),
        env_path("VM_CRITEST_MKIMAGES"),
    );
    let node = CriContainerd::start_with(&Node {
        sandbox_image: Some("registry.k8s.io/pause:3.6".into()),
        mirror: Some((
            format!("http://{REGISTRY}"),
            vec!["registry.k8s.io".into(), "gcr.io".into()],
        )),
        port_map: true,
    });
    let mut registry = registry(&node);
    let url = format!("http://{REGISTRY}");
    let (images, mkimages) = (images.to_string_lossy(), mkimages.to_string_lossy());
    let pushed = node.in_node_net(&["python3", &mkimages, "push", &images, &url]);
    assert_eq!(pushed.code, 0, "mkimages.py push: {pushed:?}");

    let report = node.dir.path().join("critest.json");
    let endpoint = format!("unix://{}", node.socket().display());
    let started = std::time::Instant::now();
    let run = node.in_node_net(&[
        &critest.to_string_lossy(),
        "--runtime-endpoint",
        &endpoint,
        "--image-endpoint",
        &endpoint,
        "--runtime-handler",
        &harness::doc_runtime_handler(),
        &format!("--ginkgo.json-report={}", report.display()),
        "--ginkgo.no-color",
    ]);
    let secs = started.elapsed().as_secs();
    let _ = registry.kill();
    let _ = registry.wait();
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("no report ({e}); critest said: {run:?}"));
    let report: serde_json::Value = serde_json::from_str(&text).expect("ginkgo's JSON report");
    let specs = specs(&report);
    let count = |state: &str| specs.iter().filter(|s| s.state == state).count();
    let (passed, skipped) = (count("passed"), count("skipped"));
    let failed: Vec<&Spec> = specs
        .iter()
        .filter(|s| !["passed", "skipped", "pending"].contains(&s.state.as_str()))
        .collect();
    eprintln!(
        "critest: {passed} passed, {} failed, {skipped} skipped ({} specs, {secs} s)",
        failed.len(),
        specs.len()
    );
    let mut wrong = Vec::new();
    for s in &failed {
        match EXPECTED.iter().find(|(name, _)| *name == s.name) {
            Some((_, says)) if s.message.contains(says) => {
                eprintln!("  expected: {} ({says})", s.name);
            }
            Some((_, says)) => wrong.push(format!(
                "{}: failed without naming {says:?}: {}",
                s.name, s.message
            )),
            None => wrong.push(format!("{}: {}", s.name, s.message)),
        }
    }
    for (name, _) in EXPECTED {
        if !failed.iter().any(|s| s.name == *name) {
            let state = specs
                .iter()
                .find(|s| s.name == *name)
                .map(|s| s.state.as_str());
            wrong.push(format!("{name}: expected to fail, but {state:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "critest: {} unexpected:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        passed >= MIN_PASSED,
        "only {passed} passed (at least {MIN_PASSED})"
    );
}
