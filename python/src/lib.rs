//! `vm_sandbox._native`: the extension module under the Python package `vm_sandbox`.
//!
//! A thin layer over `vm-sandbox`: the spec is built by [`vm_sandbox::Request`] (the one flag →
//! spec path the CLI uses too) and validated, admitted and booted by [`vm_sandbox::MicroVm`];
//! every guest operation is a [`vm_sandbox::Guest`] call. Nothing here decides policy.
//!
//! - One Tokio runtime, owned by the module ([`runtime`]), runs every call.
//! - Every call that waits releases the GIL ([`blocking`]), so Python threads run meanwhile
//!   and `AsyncSandbox` (a thread bridge, pure Python) runs calls side by side.
//! - A call that streams (`Stream.next`) returns at least every `wait` seconds, so Python's
//!   own signal handling runs between calls: Ctrl-C raises `KeyboardInterrupt` in Python,
//!   whose handler cancels the guest command tree (`Stream.cancel`).
//! - Errors become `vm_sandbox._errors` classes ([`failure`]).
//! - Named VMs (`vm run -d`) are the CLI's records, read through `vm_sandbox::state`: `ps`
//!   lists them, `attach` reaches one (attached, never owned).
//!
//! The ergonomic layer (`Sandbox`, `ExecResult`, `files`, context managers, `AsyncSandbox`)
//! is the pure-Python package; this module is what it calls.

#![forbid(unsafe_code)]

mod failure;
mod images;
mod serve;
mod snapshot;
mod stream;
mod vm;

use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::runtime::Runtime;

use crate::failure::Failure;

/// The module's one Tokio runtime (two workers: guest I/O, not computation).
pub(crate) fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("vm-sandbox")
            .enable_all()
            .build()
            .expect("vm_sandbox: cannot start the Tokio runtime")
    })
}

/// Runs `f` with the GIL released; a [`Failure`] becomes its Python exception.
pub(crate) fn blocking<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> Result<T, Failure> + Send,
{
    py.detach(f).map_err(|e| e.to_pyerr(py))
}

/// The driver registry with each driver's verdict on this host, in preference order: dicts
/// with `name`, `available`, `containment`, `jail`, `reason` (what `vm drivers --json` prints).
#[pyfunction]
fn drivers(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let registry = vm_sandbox::drivers::Registry::with_defaults();
    let rows: Vec<_> = registry
        .drivers()
        .map(|d| {
            let jail = d
                .jail()
                .map(|j| match (j.granted, j.namespaces.is_empty()) {
                    (false, _) => "not granted".to_string(),
                    (true, true) => "seccomp only".to_string(),
                    (true, false) => format!("{}+seccomp", j.namespaces.join(",")),
                });
            let avail = d.detect();
            (
                d.name(),
                avail.ok,
                d.containment().to_string(),
                jail,
                avail.detail,
            )
        })
        .collect();
    rows.into_iter()
        .map(|(name, available, containment, jail, reason)| {
            let d = PyDict::new(py);
            d.set_item("name", name)?;
            d.set_item("available", available)?;
            d.set_item("containment", containment)?;
            d.set_item("jail", jail)?;
            d.set_item("reason", reason)?;
            Ok(d)
        })
        .collect()
}

/// The named VMs (`vm run -d --name NAME`) in the runtime state directory, sorted by name,
/// as `vm ps --json` lists them: dicts with `name`, `state`, `driver`, `containment`,
/// `uptime_s`, `mem_mib`, `vcpus`, `created_unix`, `exit_reason`, `supervisor_pid`,
/// `host_pids` (the live ones) and `labels`. A record whose holder is gone is shown `exited`
/// and cleaned, as `vm ps` does.
#[pyfunction]
fn ps(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let records = blocking(py, || {
        let dir = vm_sandbox::state::Runtime::from_env()?;
        Ok(dir.ps()?)
    })?;
    records
        .into_iter()
        .map(|r| {
            let state = r.effective_state();
            let d = PyDict::new(py);
            d.set_item("name", &r.name)?;
            d.set_item("state", state.as_str())?;
            d.set_item("driver", &r.driver)?;
            d.set_item("containment", &r.containment)?;
            d.set_item("uptime_s", r.uptime(state).map(|u| u.as_secs()))?;
            d.set_item("mem_mib", r.mem_mib)?;
            d.set_item("vcpus", r.vcpus)?;
            d.set_item("created_unix", r.created_unix)?;
            d.set_item("exit_reason", &r.exit_reason)?;
            d.set_item("supervisor_pid", r.supervisor.map(|p| p.pid))?;
            d.set_item("host_pids", r.live_pids())?;
            d.set_item("labels", &r.labels)?;
            Ok(d)
        })
        .collect()
}

/// A memory size in MiB, written as the CLI's `--memory` takes it (`512M`, `1G`, MiB when
/// bare). Raises `SpecRefused` naming `field`.
#[pyfunction]
fn parse_mem_mib(field: &str, value: &str) -> PyResult<i64> {
    vm_spec::units::mem_mib(value).map_err(|e| Failure::refused(field, e).into())
}

/// A duration in seconds, written as the CLI's `--timeout` takes it (`90s`, `10m`, `1h30m`,
/// seconds when bare). Raises `SpecRefused` naming `field`.
#[pyfunction]
fn parse_duration(field: &str, value: &str) -> PyResult<f64> {
    vm_spec::units::duration(value)
        .map(|d| d.as_secs_f64())
        .map_err(|e| Failure::refused(field, e).into())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<vm::Vm>()?;
    m.add_class::<stream::Stream>()?;
    m.add_class::<serve::Server>()?;
    m.add_function(wrap_pyfunction!(vm::boot, m)?)?;
    m.add_function(wrap_pyfunction!(vm::attach, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot::restore, m)?)?;
    m.add_function(wrap_pyfunction!(ps, m)?)?;
    m.add_function(wrap_pyfunction!(drivers, m)?)?;
    m.add_function(wrap_pyfunction!(parse_mem_mib, m)?)?;
    m.add_function(wrap_pyfunction!(parse_duration, m)?)?;
    images::register(m)?;
    m.add("DEFAULT_MEM_MIB", vm_sandbox::DEFAULT_MEM_MIB)?;
    m.add("DEFAULT_PIDS", vm_sandbox::DEFAULT_PIDS)?;
    m.add("DEFAULT_ROOT", vm_spec::DEFAULT_ROOT)?;
    Ok(())
}
