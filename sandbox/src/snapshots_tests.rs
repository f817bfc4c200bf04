//! The snapshot record, the disk identity check and the store, without a VM.

use super::*;

/// A spec with the file `weights.bin` shared at `/weights` and the directory `copied` copied
/// to erofs at `/copied` (disk 0).
fn spec_with_mount(dir: &Path) -> Spec {
    let host = dir.join("weights.bin");
    std::fs::write(&host, b"w").unwrap();
    std::fs::create_dir_all(dir.join("copied")).unwrap();
    let kernel = dir.join("vmlinux");
    let initrd = dir.join("initramfs.cpio");
    std::fs::write(&kernel, b"k").unwrap();
    std::fs::write(&initrd, b"i").unwrap();
    let limits = vm_spec::Limits {
        vcpus: 1,
        mem_mib: 128,
        pids: 64,
        wall: None,
    };
    let mounts = vec![
        vm_spec::Mount::read_only(&host, "/weights"),
        vm_spec::Mount::erofs_copy(dir.join("copied"), "/copied"),
    ];
    let g = vm_spec::Guarantees::untrusted(limits, mounts);
    let image = vm_spec::Image {
        kernel,
        bz_image: None,
        initrd: Some(initrd),
        rootfs: None,
        digests: Default::default(),
        config: Default::default(),
        source: None,
    };
    Spec::new(image, g)
}

fn record(spec: Spec, disks: Vec<DiskIdentity>) -> SnapshotRecord {
    SnapshotRecord {
        version: RECORD_VERSION,
        driver: "kvm".into(),
        created_unix_secs: 1,
        spec,
        disks,
        shares: Vec::new(),
        dax_window_mib: None,
        state_bytes: 10,
        memory_bytes: 20,
        memory_written: 5,
        took_us: 7,
        generation: 0,
        serving: None,
    }
}

fn device(path: &Path, serial: &str) -> BlockDevice {
    BlockDevice {
        host_path: path.to_path_buf(),
        serial: serial.into(),
    }
}

#[test]
fn a_record_round_trips_and_another_version_or_garbage_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let r = record(spec_with_mount(tmp.path()), Vec::new());
    let dir = tmp.path().join("snap");
    std::fs::create_dir(&dir).unwrap();
    write_private(&dir.join(RECORD_FILE), &serde_json::to_vec(&r).unwrap()).unwrap();
    assert_eq!(read_record(&dir).unwrap(), r);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join(RECORD_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        matches!(
            write_private(&dir.join(RECORD_FILE), b"{}"),
            Err(SnapshotError::Io { .. })
        ),
        "a record is never overwritten"
    );

    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let mut v = serde_json::to_value(&r).unwrap();
    v["version"] = 99.into();
    v["spec"] = "a future shape".into();
    std::fs::write(other.join(RECORD_FILE), v.to_string()).unwrap();
    let e = read_record(&other).unwrap_err();
    assert!(
        matches!(e, SnapshotError::Version { found: 99, .. }),
        "{e:?}"
    );
    assert!(
        e.to_string().contains(&format!(
            "version 99; this build reads version {RECORD_VERSION}"
        )),
        "{e}"
    );

    std::fs::write(other.join(RECORD_FILE), b"not json").unwrap();
    assert!(matches!(
        read_record(&other),
        Err(SnapshotError::Record { .. })
    ));
    let big = vec![b' '; MAX_RECORD_BYTES as usize + 1];
    std::fs::write(other.join(RECORD_FILE), big).unwrap();
    assert!(matches!(
        read_record(&other),
        Err(SnapshotError::RecordTooLarge(_))
    ));
}

/// A record with the server it was taken with round-trips; one written without the field
/// (every record before it) reads as serving nothing.
#[test]
fn the_served_process_is_recorded_and_optional() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = record(spec_with_mount(tmp.path()), Vec::new());
    let plain = serde_json::to_value(&r).unwrap();
    assert!(plain.get("serving").is_none(), "{plain}");
    r.serving = Some(crate::ServedProcess {
        id: 3,
        argv: vec!["httpd".into(), "-f".into()],
        guest_ports: vec![8000, 9000],
    });
    let dir = tmp.path().join("snap");
    std::fs::create_dir(&dir).unwrap();
    write_private(&dir.join(RECORD_FILE), &serde_json::to_vec(&r).unwrap()).unwrap();
    assert_eq!(read_record(&dir).unwrap(), r);
    let old = tmp.path().join("old");
    std::fs::create_dir(&old).unwrap();
    write_private(&old.join(RECORD_FILE), &serde_json::to_vec(&plain).unwrap()).unwrap();
    assert_eq!(read_record(&old).unwrap().serving, None);
}

#[test]
fn a_changed_disk_invalidates_the_snapshot_naming_its_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec_with_mount(tmp.path());
    let valid = spec.validate().unwrap();
    let host = tmp.path().join("weights.bin");
    let root = tmp.path().join("root.erofs");
    std::fs::write(&root, b"root").unwrap();
    let now = vec![device(&host, "disk0"), device(&root, "root")];
    let then: Vec<DiskIdentity> = now.iter().map(|d| DiskIdentity::of(d).unwrap()).collect();
    check_disks(&valid, &then, &now).unwrap();

    // Same size, new mtime: a rewritten weight file.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&host)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let e = check_disks(&valid, &then, &now).unwrap_err();
    assert!(e.to_string().contains("the mount /copied changed"), "{e}");

    let then: Vec<DiskIdentity> = now.iter().map(|d| DiskIdentity::of(d).unwrap()).collect();
    std::fs::write(&root, b"root, grown").unwrap();
    let e = check_disks(&valid, &then, &now).unwrap_err();
    assert!(e.to_string().contains("the image root changed"), "{e}");

    let then: Vec<DiskIdentity> = now.iter().map(|d| DiskIdentity::of(d).unwrap()).collect();
    let moved = vec![device(&root, "disk0"), device(&root, "root")];
    let e = check_disks(&valid, &then, &moved).unwrap_err();
    assert!(e.to_string().contains("the mount /copied changed"), "{e}");
    let e = check_disks(&valid, &then, &now[..1]).unwrap_err();
    assert!(e.to_string().contains("2 disks then, 1 now"), "{e}");
    std::fs::remove_file(&root).unwrap();
    assert!(check_disks(&valid, &then, &now).is_err());
}

#[test]
fn a_changed_share_invalidates_the_snapshot_naming_its_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let valid = spec_with_mount(tmp.path()).validate().unwrap();
    let host = tmp.path().join("weights.bin");
    let share = |path: &Path, kind| SharePlan {
        host_path: path.to_path_buf(),
        guest_path: "/weights".into(),
        kind,
    };
    let now = vec![share(&host, ShareKind::File)];
    let then: Vec<ShareIdentity> = now
        .iter()
        .enumerate()
        .map(|(i, s)| ShareIdentity::of(i, s).unwrap())
        .collect();
    check_shares(&valid, &then, &now).unwrap();
    // The same path, another file (replaced, as a download tool does).
    std::fs::remove_file(&host).unwrap();
    std::fs::write(&host, b"w").unwrap();
    let e = check_shares(&valid, &then, &now).unwrap_err();
    assert!(e.to_string().contains("the mount /weights changed"), "{e}");
    let e = check_shares(&valid, &then, &[]).unwrap_err();
    assert!(e.to_string().contains("1 shares then, 0 now"), "{e}");
    // A directory share records its directory, not its files' times.
    let dir = tmp.path().join("copied");
    let now = vec![share(&dir, ShareKind::Dir)];
    let then = vec![ShareIdentity::of(0, &now[0]).unwrap()];
    std::fs::write(dir.join("new"), b"x").unwrap();
    check_shares(&valid, &then, &now).unwrap();
}

#[test]
fn the_store_lists_names_checks_them_and_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let store = SnapshotStore::new(tmp.path().join("snapshots"));
    assert!(store.list().unwrap().is_empty(), "a missing store is empty");
    for bad in ["", "../x", "a/b", ".staging-x", "-x", &"a".repeat(64)] {
        assert!(
            matches!(store.path(bad), Err(SnapshotError::Name(_))),
            "{bad:?}"
        );
    }
    let spec = spec_with_mount(tmp.path());
    let good = store.path("warm").unwrap();
    private_dir(&good).unwrap();
    write_private(
        &good.join(RECORD_FILE),
        &serde_json::to_vec(&record(spec, Vec::new())).unwrap(),
    )
    .unwrap();
    let broken = store.path("broken").unwrap();
    private_dir(&broken).unwrap();
    std::fs::write(broken.join(RECORD_FILE), b"{").unwrap();
    let staging = staging_dir(store.dir()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(staging.path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the VMM takes no other mode");
    let listed = store.list().unwrap();
    let names: Vec<&str> = listed.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        ["broken", "warm"],
        "staging {:?} is not listed",
        staging.path()
    );
    assert!(listed[0].record.is_err() && listed[1].record.is_ok());
    assert!(listed[1].disk_bytes > 0);
    store.remove("warm").unwrap();
    assert!(!good.exists());
    assert!(matches!(
        store.remove("warm"),
        Err(SnapshotError::NoSuchName(_))
    ));
    assert!(matches!(
        store.existing("absent"),
        Err(SnapshotError::NoSuchName(_))
    ));
}
