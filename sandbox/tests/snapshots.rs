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

/// A snapshot directory made by hand at `dir`: a record naming the host-agent driver (which has
/// no snapshots) and a token.
fn handmade_snapshot(dir: &std::path::Path, spec: vm_spec::Spec) {
    std::fs::create_dir_all(dir).unwrap();
    let record = SnapshotRecord {
        version: RECORD_VERSION,
        driver: "host-agent".into(),
        created_unix_secs: 0,
        spec,
        disks: Vec::new(),
        shares: Vec::new(),
        dax_window_mib: None,
        state_bytes: 0,
        memory_bytes: 0,
        memory_written: 0,
        took_us: 0,
        generation: 0,
        serving: None,
    };
    std::fs::write(dir.join(RECORD_FILE), serde_json::to_vec(&record).unwrap()).unwrap();
    vm_agent_protocol::AgentToken::generate()
        .unwrap()
        .write_file(&dir.join(TOKEN_FILE))
        .unwrap();
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
    handmade_snapshot(&dir, spec.clone());
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

/// A snapshot directory someone else could write, each way the issue found one restored: the
/// directory open to others, `snapshot.json` a symbolic link, the memory file writable by
/// others, the directory and its files given to another uid, and a FIFO where a file must be.
/// Each is refused naming the file, before a driver is asked anything (the record names a
/// driver without snapshots, whose refusal would come next) and with no run directory made.
#[test]
fn a_snapshot_someone_else_could_write_is_refused_by_name() {
    use std::os::unix::fs::{PermissionsExt, chown, symlink};
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = common::spec_in(tmp.path());
    spec.guarantees.mounts.clear();
    let runs = tmp.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    let options = Options {
        run_dir_parent: Some(runs.clone()),
        mount_cache: Some(tmp.path().join("cache")),
        ..Options::default()
    };
    let reg = registry(std::path::PathBuf::from("/nonexistent/vm-agent"));
    let dir = tmp.path().join("snapshots/base");
    handmade_snapshot(&dir, spec);
    let record_path = dir.join(RECORD_FILE);
    let memory = dir.join("memory");
    std::fs::write(&memory, b"guest RAM").unwrap();
    let chmod = |p: &std::path::Path, m| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    chmod(&dir, 0o700);
    chmod(&memory, 0o600);
    // Untouched, the check passes and the driver's own refusal comes next.
    let e = MicroVm::restore_with(&reg, &dir, &options).unwrap_err();
    assert!(
        matches!(e, SandboxError::Snapshot(SnapshotError::Unsupported { .. })),
        "{e:?}"
    );

    let refused_naming = |what: &std::path::Path, why: &str| {
        let e = MicroVm::restore_with(&reg, &dir, &options).unwrap_err();
        let chain = vm_error_chain::error_chain(&e);
        assert!(
            matches!(&e, SandboxError::Snapshot(SnapshotError::NotPrivate { path, .. }) if path == what),
            "{chain}"
        );
        assert!(chain.contains(why), "{chain}");
        assert_eq!(std::fs::read_dir(&runs).unwrap().count(), 0, "a run dir");
    };
    chmod(&dir, 0o777);
    refused_naming(&dir, "writable by group or others (mode 0777)");
    chmod(&dir, 0o700);

    chmod(&memory, 0o666);
    refused_naming(&memory, "writable by group or others (mode 0666)");
    chmod(&memory, 0o600);

    let real = dir.join("real.json");
    std::fs::rename(&record_path, &real).unwrap();
    symlink("real.json", &record_path).unwrap();
    refused_naming(&record_path, "is a symbolic link");
    std::fs::remove_file(&record_path).unwrap();
    std::fs::rename(&real, &record_path).unwrap();

    std::fs::remove_file(&memory).unwrap();
    nix::unistd::mkfifo(&memory, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    refused_naming(&memory, "is not a regular file");
    std::fs::remove_file(&memory).unwrap();
    std::fs::write(&memory, b"guest RAM").unwrap();
    chmod(&memory, 0o600);

    if nix::unistd::geteuid().is_root() {
        for p in [&dir, &record_path, &dir.join(TOKEN_FILE), &memory] {
            chown(p, Some(1234), Some(1234)).unwrap();
        }
        refused_naming(&dir, "belongs to uid 1234");
    } else {
        common::skip(
            "a_snapshot_someone_else_could_write_is_refused_by_name (another owner)",
            "not root: cannot give files to another uid",
        );
    }
}
