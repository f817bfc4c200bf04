//! Helpers shared by unit tests.

use std::io::Write;
use std::time::Duration;

use crate::{BootPlan, ImagePaths};

/// Prints a `SKIP <test>: <reason>` line and appends it to `$VM_TEST_SKIP_LOG` when set.
pub(crate) fn skip(line: &str) {
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("VM_TEST_SKIP_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// A plan whose files do not exist (for drivers that must refuse before touching them).
pub(crate) fn dummy_plan() -> BootPlan {
    BootPlan {
        name: "test".into(),
        images: ImagePaths::in_dir(std::path::Path::new("/nonexistent/images")),
        vcpus: 1,
        mem_mib: 128,
        pids_max: 0,
        disks: Vec::new(),
        run_dir: "/nonexistent/run".into(),
        wall: None,
        boot_timeout: Duration::from_secs(1),
    }
}
