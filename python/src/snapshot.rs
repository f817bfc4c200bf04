//! Snapshots from Python: [`restore`] (`Sandbox.restore(path)`) makes a new VM from a snapshot
//! directory that `Sandbox.snapshot(path)` (`Vm::snapshot`) or `vm snapshot create` wrote,
//! through [`vm_sandbox::MicroVm::restore`]: the recorded spec and driver, the disks checked
//! unchanged, a new run directory and agent token. Only the admission is the caller's.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use vm_sandbox::{MicroVm, Options, SnapshotRecord};
use vm_spec::Policy;

use crate::vm::{Held, Vm, secs, trust, vm_name};
use crate::{blocking, runtime};

/// What a snapshot wrote: `driver`, `memory_bytes`, `memory_written`, `state_bytes`,
/// `took_us`, `created_unix_secs`.
pub fn record_dict<'py>(py: Python<'py>, r: &SnapshotRecord) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("driver", r.driver.clone())?;
    d.set_item("memory_bytes", r.memory_bytes)?;
    d.set_item("memory_written", r.memory_written)?;
    d.set_item("state_bytes", r.state_bytes)?;
    d.set_item("took_us", r.took_us)?;
    d.set_item("created_unix_secs", r.created_unix_secs)?;
    Ok(d)
}

/// Restores the snapshot in the directory `path` as a new VM (see the module docs); the
/// admission arguments are `boot`'s.
#[pyfunction]
#[pyo3(signature = (path, *, trust="untrusted", allow_emulation=false, allow_weaker_jail=false,
    driver=None, name=None, run_dir=None, boot_timeout=300.0))]
#[allow(clippy::too_many_arguments)]
pub fn restore(
    py: Python<'_>,
    path: PathBuf,
    trust: &str,
    allow_emulation: bool,
    allow_weaker_jail: bool,
    driver: Option<String>,
    name: Option<String>,
    run_dir: Option<PathBuf>,
    boot_timeout: f64,
) -> PyResult<Vm> {
    let options = Options {
        trust: self::trust(trust)?,
        policy: Policy {
            allow_emulation,
            allow_weaker_jail,
        },
        driver,
        name: name.unwrap_or_else(vm_name),
        boot_timeout: secs("boot_timeout", Some(boot_timeout))?.unwrap_or_default(),
        run_dir_parent: run_dir,
        ..Options::default()
    };
    blocking(py, move || {
        let vm = runtime().block_on(MicroVm::restore(path, options))?;
        Ok(Vm::new(Held::Booted(Arc::new(vm))))
    })
}
