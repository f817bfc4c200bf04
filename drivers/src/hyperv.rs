//! `hyperv`: Windows Hypervisor Platform. Not probed by this build: on Windows it reports that
//! WHP capability detection is not implemented; elsewhere it explains that Windows is required.
//! Booting returns [`DriverError::Unsupported`].

use vm_spec::Containment;

use crate::{Availability, BootPlan, Driver, DriverError, Machine};

/// Why hyperv cannot run on a non-Windows host.
pub const NOT_WINDOWS: &str =
    "Windows Hypervisor Platform requires Windows with the feature enabled";

/// What the Windows build reports: the capability is not probed.
pub const NOT_PROBED: &str =
    "Windows Hypervisor Platform capability is not probed by this build (no WHP VMM)";

/// The Windows Hypervisor Platform driver.
#[derive(Debug, Default, Clone, Copy)]
pub struct HypervDriver;

impl HypervDriver {
    /// The driver (stateless).
    pub fn new() -> HypervDriver {
        HypervDriver
    }
}

fn reason() -> &'static str {
    if cfg!(windows) {
        NOT_PROBED
    } else {
        NOT_WINDOWS
    }
}

impl Driver for HypervDriver {
    fn name(&self) -> &'static str {
        "hyperv"
    }

    fn containment(&self) -> Containment {
        Containment::MicroVm
    }

    fn detect(&self) -> Availability {
        Availability::no(reason())
    }

    fn boot(&self, _plan: BootPlan) -> Result<Machine, DriverError> {
        Err(DriverError::Unsupported {
            driver: "hyperv",
            reason: reason().to_string(),
        })
    }
}

#[cfg(all(test, not(windows)))]
mod tests {
    use super::*;

    #[test]
    fn reports_not_ok_with_the_reason_and_boot_is_unsupported() {
        let d = HypervDriver::new();
        let a = d.detect();
        assert!(!a.ok);
        assert_eq!(a.detail, NOT_WINDOWS);
        match d.boot(crate::test_support::dummy_plan()) {
            Err(DriverError::Unsupported { driver, reason }) => {
                assert_eq!(driver, "hyperv");
                assert_eq!(reason, NOT_WINDOWS);
            }
            other => panic!(
                "expected Unsupported, got {:?}",
                other.map(|m| m.name().to_string())
            ),
        }
    }
}
