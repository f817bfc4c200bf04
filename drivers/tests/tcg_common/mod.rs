//! What the tcg boot tests share: the driver and images (or the no-driver rule), a boot that
//! fails the test with its reason, the plan, and the check that nothing is left behind.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vm_drivers::{BootPlan, Driver, DriverError, ImagePaths, TcgDriver, default_images_dir};
use vm_test_support::no_guest_driver;

/// Pids of processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline"))
            && String::from_utf8_lossy(&cmd).contains(needle)
        {
            found.push(pid);
        }
    }
    found
}

pub fn assert_nothing_left(run_dir: &Path) {
    let needle = run_dir.to_string_lossy().into_owned();
    // Reaping is synchronous in close/kill, but give the kernel a moment to drop /proc entries.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !processes_mentioning(&needle).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        processes_mentioning(&needle),
        Vec::<u32>::new(),
        "processes left for {needle}"
    );
    for f in ["vhu.sock", "vsock.sock"] {
        assert!(
            !run_dir.join(f).exists(),
            "{f} left in {}",
            run_dir.display()
        );
    }
}

/// The tcg driver, or `None` after [`no_guest_driver`] (a failure unless
/// `VM_TEST_ALLOW_NO_DRIVER=1`) when it cannot run here.
pub fn tcg_or_no_driver(test: &str) -> Option<TcgDriver> {
    let d = TcgDriver::new();
    let a = d.detect();
    if !a.ok {
        no_guest_driver(test, &a.detail);
        return None;
    }
    Some(d)
}

/// The tcg driver and the built guest images, or `None` after [`no_guest_driver`] when either
/// is missing.
pub fn tcg_and_images(test: &str) -> Option<(TcgDriver, ImagePaths)> {
    let driver = tcg_or_no_driver(test)?;
    Some((driver, images_or_no_driver(test)?))
}

/// The built guest images, or `None` after [`no_guest_driver`] when they are missing.
pub fn images_or_no_driver(test: &str) -> Option<ImagePaths> {
    let Some(dir) = default_images_dir() else {
        no_guest_driver(test, "no images dir (HOME unset)");
        return None;
    };
    let images = ImagePaths::in_dir(&dir.join("current"));
    if !images.bz_image.is_file() || !images.initramfs.is_file() {
        no_guest_driver(
            test,
            &format!(
                "no guest images at {} (images/build.sh)",
                dir.join("current").display()
            ),
        );
        return None;
    }
    Some(images)
}

/// Boots `plan`; a boot whose agent never answered fails the test with its reason and the
/// console's last line, after checking that it left nothing behind.
pub fn boot_or_fail(driver: &TcgDriver, plan: BootPlan) -> vm_drivers::Machine {
    let run_dir = plan.run_dir.clone();
    match driver.boot(plan) {
        Ok(m) => m,
        Err(DriverError::AgentNotReady {
            reason,
            console_tail,
            ..
        }) => {
            let last = console_tail
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_string();
            assert_nothing_left(&run_dir);
            panic!("guest agent did not answer ({reason}); last console line: {last}");
        }
        Err(e) => panic!("boot failed: {e} ({e:?})"),
    }
}

pub fn plan(name: &str, images: ImagePaths, run_dir: PathBuf) -> BootPlan {
    BootPlan {
        name: name.into(),
        images,
        vcpus: 1,
        mem_mib: 256,
        pids_max: 0,
        disks: Vec::new(),
        shares: Vec::new(),
        dax_window_mib: None,
        rootfs: None,
        run_dir,
        wall: None,
        boot_timeout: Duration::from_secs(60),
        allow_weaker_jail: false,
        snapshot_dir: None,
    }
}
