//! Refusal: a spec with egress allowed, or with a writable mount, is refused before any
//! driver boots: no QEMU process, no run directory, and the error names the field.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use vm_drivers::{Availability, BootPlan, Containment, Driver, DriverError, Machine, Registry};
use vm_sandbox::{MicroVm, Options, SandboxError};
use vm_spec::{Guarantees, Image, Limits, Mount, Policy, Spec};
use vm_tests::host::children_named;
use vm_tests::{Ctx, GuestSpec, ensure, error_chain, options_for};

/// The two refused specs and the field each refusal must name.
fn refused_specs(image: &Image, host_dir: &Path) -> Vec<(&'static str, Spec, &'static str)> {
    let limits = Limits {
        mem_mib: 256,
        ..Limits::default()
    };
    let mut egress = Guarantees::untrusted(limits, Vec::new());
    egress.egress_denied = false;
    let mut writable = Guarantees::untrusted(limits, Vec::new());
    writable.mounts = vec![Mount {
        host_path: host_dir.to_path_buf(),
        guest_path: "/data".into(),
        read_only: false,
        via: vm_spec::MountVia::Share,
    }];
    vec![
        (
            "egress allowed",
            Spec::new(image.clone(), egress),
            "guarantees.egress_denied",
        ),
        (
            "writable mount",
            Spec::new(image.clone(), writable),
            "guarantees.mounts[0].read_only",
        ),
    ]
}

/// Image files that exist (so no refusal can come from a missing image instead).
fn fake_image(dir: &Path) -> std::io::Result<Image> {
    for f in ["vmlinux", "bzImage", "initramfs.cpio"] {
        std::fs::write(dir.join(f), b"not really a kernel")?;
    }
    Ok(Image {
        kernel: dir.join("vmlinux"),
        bz_image: Some(dir.join("bzImage")),
        initrd: Some(dir.join("initramfs.cpio")),
        rootfs: None,
        digests: Default::default(),
        config: Default::default(),
        source: None,
    })
}

fn check_refusal(what: &str, r: Result<MicroVm, SandboxError>, field: &str) -> Result<(), String> {
    let err = match r {
        Ok(vm) => return Err(format!("{what}: a guest was created on {}", vm.driver())),
        Err(e) => e,
    };
    let chain = error_chain(&err);
    ensure!(
        matches!(err, SandboxError::Spec(_)),
        "{what}: refused, but not by the spec: {chain}"
    );
    ensure!(
        chain.contains(field),
        "{what}: the refusal does not name {field}: {chain}"
    );
    eprintln!("    {what}: {chain}");
    Ok(())
}

/// A driver that is always available and counts every boot attempt.
struct Recorder {
    boots: Arc<AtomicUsize>,
}

impl Driver for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn containment(&self) -> Containment {
        Containment::MicroVm
    }
    fn detect(&self) -> Availability {
        Availability::yes("always")
    }
    fn boot(&self, _plan: BootPlan) -> Result<Machine, DriverError> {
        self.boots.fetch_add(1, Ordering::SeqCst);
        Err(DriverError::Unsupported {
            driver: "recorder",
            reason: "records only".into(),
        })
    }
}

/// Through a registry whose only driver records boots: the refusal happens before boot.
#[test]
fn refused_before_any_driver_boot() {
    let tmp = tempfile::tempdir().unwrap();
    let image = fake_image(tmp.path()).unwrap();
    let boots = Arc::new(AtomicUsize::new(0));
    let registry = Registry::new(vec![Box::new(Recorder {
        boots: boots.clone(),
    })]);
    let runs = tmp.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    let options = Options {
        run_dir_parent: Some(runs.clone()),
        policy: Policy::default(),
        ..Options::default()
    };
    for (what, spec, field) in refused_specs(&image, tmp.path()) {
        let r = MicroVm::create_with(&registry, &spec, &options);
        check_refusal(what, r, field).unwrap();
        assert_eq!(
            boots.load(Ordering::SeqCst),
            0,
            "{what}: the driver was asked to boot"
        );
        assert_eq!(
            std::fs::read_dir(&runs).unwrap().count(),
            0,
            "{what}: a run dir was created"
        );
    }
}

/// On every real driver this host can run: no QEMU/vhost child appears, no run dir is made.
#[test]
fn refused_on_every_driver() {
    vm_tests::scenario_without_images("refusal", |driver| async move {
        let tmp = tempfile::tempdir().ctx("temp dir")?;
        let image = fake_image(tmp.path()).ctx("fake image")?;
        let runs = tmp.path().join("runs");
        std::fs::create_dir(&runs).ctx("runs dir")?;
        let mut g = GuestSpec::new("refusal");
        g.run_dir_parent = Some(runs.clone());
        let options = options_for(driver, &g);
        for (what, spec, field) in refused_specs(&image, tmp.path()) {
            check_refusal(what, MicroVm::boot(spec, options.clone()).await, field)?;
            for name in ["qemu-system", "vm-vsock"] {
                let kids = children_named(name);
                ensure!(
                    kids.is_empty(),
                    "{what}: {name} processes were started: {kids:?}"
                );
            }
            let made = std::fs::read_dir(&runs).ctx("reading runs")?.count();
            ensure!(made == 0, "{what}: {made} run dirs were created");
        }
        Ok(())
    });
}
