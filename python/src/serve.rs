//! [`Server`]: a long-lived guest process with published ports ([`vm_sandbox::Serving`]),
//! started once ready. The SDK publishes on loopback addresses only: a port written with any
//! other host address is refused before the server starts.

use std::time::Duration;

use pyo3::prelude::*;
use vm_sandbox::{PublishSpec, Readiness, ServeSpec, Serving};

use crate::failure::Failure;
use crate::vm::Held;
use crate::{blocking, runtime};

/// A serving guest process (see the module docs). Keeps its VM alive while it exists.
#[pyclass(module = "vm_sandbox._native", frozen)]
pub struct Server {
    serving: Serving,
    _vm: Held,
}

impl Server {
    pub fn start(
        vm: Held,
        argv: Vec<String>,
        ports: &[String],
        ready: Option<String>,
        timeout: Duration,
    ) -> Result<Server, Failure> {
        let publish = PublishSpec::parse_all(ports).map_err(|e| Failure::refused("ports", e))?;
        if let Some(p) = publish.iter().find(|p| !p.host_ip.is_loopback()) {
            return Err(Failure::refused(
                "ports",
                format!(
                    "{} is not a loopback address; the SDK publishes on loopback only",
                    p.host_ip
                ),
            ));
        }
        if let Some(path) = &ready {
            Readiness::check_path(path).map_err(|e| Failure::refused("ready", e))?;
        }
        let rt = runtime();
        let serving = rt.block_on(vm.guest().serve(ServeSpec { argv, publish }))?;
        let readiness = Readiness {
            http_path: ready,
            timeout,
        };
        if let Err(e) = rt.block_on(serving.wait_ready(&readiness)) {
            let _ = rt.block_on(serving.stop());
            return Err(e.into());
        }
        Ok(Server { serving, _vm: vm })
    }
}

#[pymethods]
impl Server {
    /// One URL per published port, in the order given (`http://127.0.0.1:PORT`).
    #[getter]
    fn urls(&self) -> Vec<String> {
        self.serving.published().iter().map(|p| p.url()).collect()
    }

    /// The host ports, in the order given.
    #[getter]
    fn host_ports(&self) -> Vec<u16> {
        self.serving
            .published()
            .iter()
            .map(|p| p.host.port())
            .collect()
    }

    /// True until the guest process exits or `stop` is called.
    #[getter]
    fn running(&self) -> bool {
        self.serving.running()
    }

    /// The retained tail of the process's combined output.
    fn output(&self) -> String {
        self.serving.output()
    }

    /// Ends the guest process and closes the host ports. Idempotent.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        blocking(py, || Ok(runtime().block_on(self.serving.stop())?))
    }
}
