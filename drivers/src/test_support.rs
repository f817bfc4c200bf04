//! Helpers shared by unit tests.

use std::time::Duration;

use crate::{BootPlan, ImagePaths};

/// Prints a `SKIP <test>: <reason>` line and appends it to `$VM_TEST_SKIP_LOG` when set.
pub(crate) use vm_test_support::skip_line as skip;

/// A plan whose files do not exist (for drivers that must refuse before touching them).
pub(crate) fn dummy_plan() -> BootPlan {
    BootPlan {
        name: "test".into(),
        images: ImagePaths::in_dir(std::path::Path::new("/nonexistent/images")),
        vcpus: 1,
        mem_mib: 128,
        pids_max: 0,
        disks: Vec::new(),
        shares: Vec::new(),
        dax_window_mib: None,
        rootfs: None,
        run_dir: "/nonexistent/run".into(),
        wall: None,
        boot_timeout: Duration::from_secs(1),
        allow_weaker_jail: false,
        snapshot_dir: None,
    }
}
