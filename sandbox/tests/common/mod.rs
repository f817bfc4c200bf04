//! Test doubles shared by the integration tests.
#![allow(dead_code)]

pub mod echo;
pub mod hostagent;
pub mod interactive;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vm_drivers::{Availability, BootPlan, Containment, Driver, DriverError, Machine, Registry};
use vm_spec::{Guarantees, Image, ImageDigests, Limits, Mount, Spec};
use vm_sync::Lock;

/// A driver with a fixed verdict that records the plans it is asked to boot and refuses them.
pub struct FakeDriver {
    pub name: &'static str,
    pub containment: Containment,
    pub ok: bool,
    pub plans: Arc<Mutex<Vec<BootPlan>>>,
}

impl FakeDriver {
    pub fn new(name: &'static str, containment: Containment, ok: bool) -> Self {
        FakeDriver {
            name,
            containment,
            ok,
            plans: Arc::default(),
        }
    }
}

impl Driver for FakeDriver {
    fn name(&self) -> &'static str {
        self.name
    }
    fn containment(&self) -> Containment {
        self.containment
    }
    fn detect(&self) -> Availability {
        let verdict = if self.ok { "ready" } else { "missing thing" };
        Availability {
            ok: self.ok,
            detail: format!("{} {verdict}", self.name),
        }
    }
    fn boot(&self, plan: BootPlan) -> Result<Machine, DriverError> {
        assert!(
            plan.run_dir.is_dir(),
            "run dir must exist when boot is called"
        );
        self.plans.locked().push(plan);
        Err(DriverError::Unsupported {
            driver: self.name,
            reason: "fake".into(),
        })
    }
}

pub fn registry(drivers: Vec<FakeDriver>) -> Registry {
    Registry::new(
        drivers
            .into_iter()
            .map(|d| Box::new(d) as Box<dyn Driver>)
            .collect(),
    )
}

/// A valid spec over fake image files in `dir`, mounting `dir/data` (created) at /data.
pub fn spec_in(dir: &Path) -> Spec {
    let kernel = dir.join("vmlinux");
    let initrd = dir.join("initramfs.cpio");
    std::fs::write(&kernel, b"k").unwrap();
    std::fs::write(&initrd, b"i").unwrap();
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("a.txt"), b"hello").unwrap();
    let image = Image {
        kernel,
        bz_image: None,
        initrd: Some(initrd),
        rootfs: None,
        digests: ImageDigests::default(),
        config: Default::default(),
        source: None,
    };
    let limits = Limits {
        vcpus: 2,
        mem_mib: 192,
        pids: i64::from(vm_spec::DEFAULT_PIDS),
        wall: Some(Duration::from_secs(30)),
    };
    Spec::new(
        image,
        Guarantees::untrusted(limits, vec![Mount::read_only(data, "/data")]),
    )
}

pub fn have_mkfs_erofs() -> bool {
    std::process::Command::new("mkfs.erofs")
        .arg("--help")
        .output()
        .is_ok()
}

/// Report a skipped test the way the project asks.
#[allow(unused_imports)] // not every test binary that includes this module skips
pub use vm_test_support::skip;
