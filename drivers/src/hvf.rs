//! `hvf`: Apple Hypervisor.framework. Detection is real on macOS (`kern.hv_support`); booting is
//! not implemented by this build and returns [`DriverError::Unsupported`].

use vm_spec::Containment;

use crate::{Availability, BootPlan, Driver, DriverError, Machine};

/// Why hvf cannot run on a non-macOS host.
pub const NOT_MACOS: &str =
    "Hypervisor.framework requires macOS on Apple silicon or Intel with VT-x";

/// The Hypervisor.framework driver.
#[derive(Debug, Default, Clone, Copy)]
pub struct HvfDriver;

impl HvfDriver {
    /// The driver (stateless).
    pub fn new() -> HvfDriver {
        HvfDriver
    }
}

impl Driver for HvfDriver {
    fn name(&self) -> &'static str {
        "hvf"
    }

    fn containment(&self) -> Containment {
        Containment::MicroVm
    }

    fn detect(&self) -> Availability {
        detect_platform()
    }

    fn boot(&self, _plan: BootPlan) -> Result<Machine, DriverError> {
        let reason = if cfg!(target_os = "macos") {
            "booting on Hypervisor.framework is not implemented by this build".to_string()
        } else {
            NOT_MACOS.to_string()
        };
        Err(DriverError::Unsupported {
            driver: "hvf",
            reason,
        })
    }
}

#[cfg(not(target_os = "macos"))]
fn detect_platform() -> Availability {
    Availability::no(NOT_MACOS)
}

#[cfg(target_os = "macos")]
fn detect_platform() -> Availability {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>();
    // SAFETY: the name is a NUL-terminated literal; `value`/`len` describe a valid c_int buffer;
    // no new value is written (null, 0).
    let rc = unsafe {
        libc::sysctlbyname(
            c"kern.hv_support".as_ptr(),
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        return Availability::no(format!(
            "sysctl kern.hv_support failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    if value != 1 {
        return Availability::no(
            "kern.hv_support is 0: this Mac has no Hypervisor.framework support",
        );
    }
    Availability::no(
        "Hypervisor.framework is supported (kern.hv_support=1) but this build has no hvf VMM",
    )
}

#[cfg(all(test, not(target_os = "macos")))]
mod tests {
    use super::*;

    #[test]
    fn reports_not_ok_with_the_reason_and_boot_is_unsupported() {
        let d = HvfDriver::new();
        let a = d.detect();
        assert!(!a.ok);
        assert_eq!(a.detail, NOT_MACOS);
        let plan = crate::test_support::dummy_plan();
        match d.boot(plan) {
            Err(DriverError::Unsupported { driver, reason }) => {
                assert_eq!(driver, "hvf");
                assert_eq!(reason, NOT_MACOS);
            }
            other => panic!(
                "expected Unsupported, got {:?}",
                other.map(|m| m.name().to_string())
            ),
        }
    }
}
