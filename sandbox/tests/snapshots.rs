//! Snapshot refusals through the MicroVm API, against a driver without snapshots (the
//! host-agent double; the kvm road's snapshots are the e2e `snapshot` scenario): a VM booted
//! without `Options::snapshots` refuses and runs on, a boot with it on such a driver is refused
//! before anything is made, and a restore of a snapshot recorded on that driver is refused
//! before anything starts.

mod common;

use common::hostagent::{HostAgentDriver, agent_bin};
use vm_drivers::Registry;
use vm_sandbox::snapshots::{RECORD_FILE, RECORD_VERSION, SnapshotRecord, TOKEN_FILE};
use vm_sandbox::{MicroVm, Options, SandboxError, SnapshotError};
use vm_spec::Containment;

fn registry(bin: std::path::PathBuf) -> Registry {
    Registry::new(vec![Box::new(HostAgentDriver {
        bin,
        machine_containment: Containment::MicroVm,
    })])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_refused_where_they_cannot_be_taken() {
    let Some(bin) = agent_bin() else {
        common::skip(
            "snapshots_are_refused_where_they_cannot_be_taken",
            "vm-agent not built",
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = common::spec_in(tmp.path());
    spec.guarantees.mounts.clear();
    spec.root = tmp.path().join("work").to_str().unwrap().to_string();
    let runs = tmp.path().join("runs");
    let store = tmp.path().join("snapshots");
    let mut options = Options {
        run_dir_parent: Some(runs.clone()),
        mount_cache: Some(tmp.path().join("cache")),
        ..Options::default()
    };
    let reg = registry(bin);

    let plain = MicroVm::create_with(&reg, &spec, &options).unwrap();
    let e = plain.snapshot(&store.join("a")).await.unwrap_err();
    assert!(
        matches!(e, SandboxError::Snapshot(SnapshotError::NotEnabled)),
        "{e:?}"
    );
    assert!(plain.exec("true").await.unwrap().status.success());
    plain.close().await;

    options.snapshots = Some(store.clone());
    let e = MicroVm::create_with(&reg, &spec, &options).unwrap_err();
    assert!(
        matches!(
            &e,
            SandboxError::Snapshot(SnapshotError::Unsupported {
                driver: "host-agent",
                ..
            })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("host-agent: no snapshots"), "{e}");
    assert!(!store.exists(), "a staging directory for a refused boot");
    assert_eq!(
        std::fs::read_dir(&runs).unwrap().count(),
        0,
        "a run dir was left"
    );

    // A record made by hand, naming this driver: refused by what the driver says.
    let dir = store.join("handmade");
    std::fs::create_dir_all(&dir).unwrap();
    let record = SnapshotRecord {
        version: RECORD_VERSION,
        driver: "host-agent".into(),
        created_unix_secs: 0,
        spec: spec.clone(),
        disks: Vec::new(),
        shares: Vec::new(),
        dax_window_mib: None,
        state_bytes: 0,
        memory_bytes: 0,
        memory_written: 0,
        took_us: 0,
        serving: None,
    };
    std::fs::write(dir.join(RECORD_FILE), serde_json::to_vec(&record).unwrap()).unwrap();
    guest_agent::AgentToken::generate()
        .unwrap()
        .write_file(&dir.join(TOKEN_FILE))
        .unwrap();
    options.snapshots = None;
    let e = MicroVm::restore_with(&reg, &dir, &options).unwrap_err();
    assert!(
        matches!(
            &e,
            SandboxError::Snapshot(SnapshotError::Unsupported {
                driver: "host-agent",
                ..
            })
        ),
        "{e:?}"
    );
    options.driver = Some("kvm".into());
    let e = MicroVm::restore_with(&reg, &dir, &options).unwrap_err();
    assert!(
        e.to_string()
            .contains("taken on host-agent; it cannot be restored on kvm"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_dir(&runs).unwrap().count(),
        0,
        "a run dir was left"
    );
}
