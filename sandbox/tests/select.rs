//! Driver selection and the create pipeline over fake drivers.

mod common;

use common::{FakeDriver, registry, spec_in};
use vm_drivers::{Containment, ShareKind};
use vm_sandbox::{MicroVm, Options, SandboxError, SelectError, select_driver, select_named};
use vm_spec::{Policy, Trust};
use vm_sync::Lock;

const STRICT: Policy = Policy {
    allow_emulation: false,
    allow_weaker_jail: false,
};
const LAX: Policy = Policy {
    allow_emulation: true,
    allow_weaker_jail: false,
};

#[test]
fn first_available_admissible_driver_wins() {
    let r = registry(vec![
        FakeDriver::new("kvm", Containment::MicroVm, false),
        FakeDriver::new("a", Containment::MicroVm, true),
        FakeDriver::new("b", Containment::MicroVm, true),
    ]);
    assert_eq!(
        select_driver(&r, Trust::Untrusted, &STRICT).unwrap().name(),
        "a"
    );
}

#[test]
fn none_available_lists_every_diagnosis() {
    let r = registry(vec![
        FakeDriver::new("kvm", Containment::MicroVm, false),
        FakeDriver::new("hvf", Containment::MicroVm, false),
    ]);
    let err = select_driver(&r, Trust::Untrusted, &STRICT).unwrap_err();
    let SelectError::NoDriver {
        diagnoses,
        allowed_by,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(diagnoses.len(), 2);
    assert_eq!(*allowed_by, None);
    let msg = err.to_string();
    assert!(
        msg.contains("kvm: kvm missing thing") && msg.contains("hvf: hvf missing thing"),
        "{msg}"
    );
    assert!(!msg.contains("allow-emulation"), "{msg}");
    let empty = registry(vec![]);
    assert!(
        select_driver(&empty, Trust::Trusted, &STRICT)
            .unwrap_err()
            .to_string()
            .contains("no drivers")
    );
}

#[test]
fn emulation_is_refused_for_untrusted_unless_allowed() {
    let r = registry(vec![
        FakeDriver::new("kvm", Containment::MicroVm, false),
        FakeDriver::new("tcg", Containment::UserKernel, true),
    ]);
    let err = select_driver(&r, Trust::Untrusted, &STRICT).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("tcg: available but refused (user-kernel containment, microvm required)"),
        "{msg}"
    );
    assert!(msg.contains("--allow-emulation"), "{msg}");
    assert!(msg.contains("kvm: kvm missing thing"), "{msg}");
    assert_eq!(
        select_driver(&r, Trust::Untrusted, &LAX).unwrap().name(),
        "tcg"
    );
    // Semi-trusted work needs only kernel confinement: tcg qualifies without the flag.
    assert_eq!(
        select_driver(&r, Trust::Semi, &STRICT).unwrap().name(),
        "tcg"
    );
}

#[test]
fn a_weak_driver_is_never_a_fallback_for_an_available_strong_one() {
    let r = registry(vec![
        FakeDriver::new("tcg", Containment::UserKernel, true),
        FakeDriver::new("kvm", Containment::MicroVm, true),
    ]);
    assert_eq!(
        select_driver(&r, Trust::Untrusted, &STRICT).unwrap().name(),
        "kvm"
    );
}

#[test]
fn named_driver_is_still_admitted_and_detected() {
    let r = registry(vec![
        FakeDriver::new("kvm", Containment::MicroVm, false),
        FakeDriver::new("tcg", Containment::UserKernel, true),
    ]);
    let msg = select_named(&r, "tcg", Trust::Untrusted, &STRICT)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("tcg") && msg.contains("--allow-emulation"),
        "{msg}"
    );
    assert_eq!(
        select_named(&r, "tcg", Trust::Untrusted, &LAX)
            .unwrap()
            .name(),
        "tcg"
    );
    let msg = select_named(&r, "kvm", Trust::Untrusted, &STRICT)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("kvm missing thing"), "{msg}");
    let msg = select_named(&r, "xen", Trust::Untrusted, &STRICT)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("\"xen\"") && msg.contains("kvm, tcg"), "{msg}");
}

#[test]
fn create_refuses_a_bad_spec_before_booting() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = spec_in(tmp.path());
    spec.guarantees.egress_denied = false;
    let kvm = FakeDriver::new("kvm", Containment::MicroVm, true);
    let plans = kvm.plans.clone();
    let r = registry(vec![kvm]);
    let err = MicroVm::create_with(&r, &spec, &Options::default()).unwrap_err();
    assert!(matches!(err, SandboxError::Spec(_)), "{err}");
    assert!(
        plans.locked().is_empty(),
        "nothing may be booted for a refused spec"
    );
}

#[test]
fn create_refuses_without_downgrade() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec_in(tmp.path());
    let tcg = FakeDriver::new("tcg", Containment::UserKernel, true);
    let plans = tcg.plans.clone();
    let r = registry(vec![tcg]);
    let err = MicroVm::create_with(&r, &spec, &Options::default()).unwrap_err();
    assert!(matches!(err, SandboxError::Select(_)), "{err}");
    // The selection error is the cause in the chain (not hidden behind a transparent
    // variant), so callers that walk the chain find it and its hint.
    let cause = std::error::Error::source(&err).expect("select error has a cause");
    let select = cause
        .downcast_ref::<SelectError>()
        .expect("the cause is the SelectError");
    assert!(matches!(select, SelectError::NoDriver { .. }), "{select:?}");
    assert!(cause.to_string().contains("--allow-emulation"), "{cause}");
    assert!(plans.locked().is_empty());
    // With the explicit policy the emulated driver is used (the fake then refuses to boot).
    let lax = Options {
        policy: LAX,
        mount_cache: Some(tmp.path().join("c")),
        ..Options::default()
    };
    let err = MicroVm::create_with(&r, &spec, &lax).unwrap_err();
    assert!(
        matches!(err, SandboxError::Boot { driver: "tcg", .. }),
        "{err}"
    );
    assert_eq!(plans.locked().len(), 1);
}

#[test]
fn create_builds_the_boot_plan_and_cleans_up_on_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = spec_in(tmp.path());
    let file = tmp.path().join("weights.bin");
    std::fs::write(&file, vec![7u8; 4096]).unwrap();
    spec.guarantees
        .mounts
        .push(vm_spec::Mount::read_only(&file, "/weights.bin"));
    let kvm = FakeDriver::new("kvm", Containment::MicroVm, true);
    let plans = kvm.plans.clone();
    let r = registry(vec![kvm]);
    let runs = tmp.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    let options = Options {
        run_dir_parent: Some(runs.clone()),
        name: "t1".into(),
        ..Options::default()
    };
    let err = MicroVm::create_with(&r, &spec, &options).unwrap_err();
    assert!(
        matches!(err, SandboxError::Boot { driver: "kvm", .. }),
        "{err}"
    );

    let plans = plans.locked();
    let plan = &plans[0];
    assert_eq!(
        (plan.vcpus, plan.mem_mib, plan.pids_max),
        (2, 192, vm_spec::DEFAULT_PIDS)
    );
    assert_eq!(plan.wall, Some(std::time::Duration::from_secs(30)));
    assert_eq!(plan.name, "t1");
    assert_eq!(plan.images.vmlinux, tmp.path().join("vmlinux"));
    assert_eq!(
        plan.images.bz_image,
        tmp.path().join("vmlinux"),
        "falls back to the ELF kernel"
    );
    // Host mounts are virtio-fs shares held by descriptor (no disk, no copy in the cache).
    assert!(plan.disks.is_empty(), "{:?}", plan.disks);
    let shares: Vec<_> = plan
        .shares
        .iter()
        .map(|s| (s.guest_path.as_str(), s.kind, s.host_path.clone()))
        .collect();
    assert_eq!(
        shares,
        [
            (
                "/data",
                ShareKind::Dir,
                tmp.path().join("data").canonicalize().unwrap()
            ),
            (
                "/weights.bin",
                ShareKind::File,
                file.canonicalize().unwrap()
            ),
        ]
    );
    assert!(plan.run_dir.starts_with(&runs));
    assert!(
        !plan.run_dir.exists(),
        "the run dir of a failed boot is removed"
    );
    assert_eq!(std::fs::read_dir(&runs).unwrap().count(), 0);
}
