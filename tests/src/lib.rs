//! `vm-tests`: the end-to-end suite, written once against the driver-neutral API
//! ([`vm_sandbox::MicroVm`] over a [`vm_drivers::Machine`]) and run on every driver this host
//! can run.
//!
//! # Layout
//! - this crate (the harness): [`drivers_to_test`] lists every driver of
//!   [`vm_drivers::Registry::with_defaults`] with its `detect()` verdict; [`scenario`] runs a
//!   scenario once per available driver and prints `SKIP <scenario> [<driver>]: <detail>`
//!   for every other one (also appended to `$VM_TEST_SKIP_LOG`, the project's skip
//!   convention), so a missing KVM is visible and counted rather than silently absent. Each
//!   scenario x driver is one counted unit (`boot [tcg]` passed, `boot [kvm]` skipped), and a
//!   scenario that ran on no driver **fails** unless `VM_TEST_ALLOW_NO_DRIVER=1`
//!   ([`vm_test_support::DriverRuns`]);
//!   [`boot`] starts a [`MicroVm`] on one named driver from a [`GuestSpec`] and prints
//!   `boot+agent ready in X s [driver]`; [`Cases`] runs the named cases of a scenario against
//!   one guest, each under a timeout, and reports every failure (not only the first).
//! - `tests/*.rs`: one file per scenario (boot, exec, env, files, mounts, egress, memory,
//!   pids, cancel, wall, serve, refusal, stalled, vsock_host, ...). Each file is one test
//!   binary with one `#[test]` per scenario that boots one guest per driver and runs its cases in it, because nextest
//!   runs every test in its own process (a guest cannot be shared between tests there).
//!
//! # Running
//! `cargo nextest run -p vm-tests` (the repo's `.config/nextest.toml` puts these binaries in a
//! test group of two threads: each guest is a QEMU TCG process on this 2-core host). The
//! guest images must be built first (`images/build.sh`); without them every scenario that
//! boots prints a SKIP line naming the missing file, and fails because no driver ran.
//! `VM_E2E_BOOT_TIMEOUT` (seconds) overrides the agent wait; `RUST_LOG` enables the runtime's
//! logs.
//!
//! Everything that can fail returns `Result<_, String>` with the whole error chain
//! ([`Ctx::ctx`]), so a failure names the operation, the driver and the cause.

mod cases;
mod guest;
pub mod host;
pub mod interactive;
pub mod probe;
pub mod procs;
pub mod proof;
pub mod rootfs;

use std::future::Future;
use std::time::{Duration, Instant};

pub use cases::{Cases, Ctx, error_chain};
pub use guest::{
    DEFAULT_PATH, GuestSpec, boot, default_image, exec_as, exec_ok, image_dir, options_for, sh,
    spec_for, tail,
};
pub use vm_sandbox::MicroVm;

use vm_drivers::{Availability, Registry};
use vm_test_support::DriverRuns;

/// Upper bound on one scenario on one driver (boot included).
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(600);

/// One registered driver and what its detection said on this host.
#[derive(Debug, Clone)]
pub struct DriverUnderTest {
    pub name: &'static str,
    pub availability: Availability,
}

/// Every driver of the default registry, in preference order, with its `detect()` verdict;
/// only those named in `VM_TEST_DRIVERS` (comma-separated) when it is set, as the kvm proof
/// does to run the suite on kvm alone.
pub fn drivers_to_test() -> Vec<DriverUnderTest> {
    let only = std::env::var("VM_TEST_DRIVERS").ok();
    let registry = Registry::with_defaults();
    registry
        .drivers()
        .filter(|d| selected(only.as_deref(), d.name()))
        .map(|d| DriverUnderTest {
            name: d.name(),
            availability: d.detect(),
        })
        .collect()
}

/// Whether `driver` is in the comma-separated `only` list (every driver when there is none).
fn selected(only: Option<&str>, driver: &str) -> bool {
    only.is_none_or(|list| list.split(',').any(|n| n.trim() == driver))
}

/// Prints a whole-test `SKIP <test>: <reason>` line to stderr and appends it to
/// `$VM_TEST_SKIP_LOG` when set (the test counts as skipped, not passed). Only for a fact about
/// the host; a scenario's skipped drivers are recorded by [`scenario`] itself.
pub use vm_test_support::skip_line as skip;

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs `f(driver)` for every available driver on its own tokio runtime; skips (with a
/// SKIP line) every driver whose detection is not OK and, when the scenario boots guests,
/// every driver when the guest images are missing. Panics listing every failed driver, and
/// when no driver ran at all unless `VM_TEST_ALLOW_NO_DRIVER=1` (see [`vm_test_support`]):
/// a scenario that ran nowhere has not passed. Each driver is one counted unit.
pub fn scenario<F, Fut>(name: &str, f: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    run_scenario(name, true, f)
}

/// [`scenario`] for scenarios that never boot a guest (no image check).
pub fn scenario_without_images<F, Fut>(name: &str, f: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    run_scenario(name, false, f)
}

fn run_scenario<F, Fut>(name: &str, needs_images: bool, f: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    init_logs();
    let mut runs = DriverRuns::new(name);
    for d in drivers_to_test() {
        if !d.availability.ok {
            runs.skipped(d.name, &d.availability.detail);
            continue;
        }
        if needs_images && let Err(e) = default_image() {
            runs.skipped(d.name, &e);
            continue;
        }
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                runs.failed(d.name, &format!("cannot build a tokio runtime: {e}"));
                continue;
            }
        };
        let start = Instant::now();
        let outcome = rt.block_on(async {
            match tokio::time::timeout(SCENARIO_TIMEOUT, f(d.name)).await {
                Ok(r) => r,
                Err(_) => Err(format!("scenario timed out after {SCENARIO_TIMEOUT:?}")),
            }
        });
        rt.shutdown_timeout(Duration::from_secs(10));
        let took = start.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => {
                eprintln!("{name} [{}] took {took:.1} s", d.name);
                runs.passed(d.name);
            }
            Err(e) => runs.failed(d.name, &format!("after {took:.1} s: {e}")),
        }
    }
    if let Err(e) = runs.finish() {
        panic!("scenario {e}");
    }
}

/// Fails with `msg` unless `cond` holds: `ensure!(cond, "format", args..)` in a function
/// returning `Result<_, String>`.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::selected;

    #[test]
    fn driver_selection() {
        assert!(selected(None, "tcg"));
        assert!(selected(Some("kvm"), "kvm"));
        assert!(!selected(Some("kvm"), "tcg"));
        assert!(selected(Some("tcg, kvm"), "kvm"));
        assert!(!selected(Some(""), "kvm"));
    }

    /// `proof/all.rs` (the suite as one binary for the kvm proof pack) includes every
    /// scenario file, so the proof never silently runs less than `cargo nextest` does.
    #[test]
    fn the_proof_binary_includes_every_scenario() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let all = std::fs::read_to_string(root.join("proof/all.rs")).unwrap();
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(root.join("tests")).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name.ends_with(".rs") && !all.contains(&format!("#[path = \"../tests/{name}\"]")) {
                missing.push(name);
            }
        }
        assert!(missing.is_empty(), "tests/proof/all.rs lacks {missing:?}");
    }
}
