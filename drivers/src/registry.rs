//! The driver registry: an ordered list of backends and the first-available selection.
//!
//! The registry only *reports*. It never decides whether an available driver is strong enough
//! for some work (that is the admission gate in `vm-sandbox`), and it never substitutes a
//! different driver for an unavailable one behind the caller's back.

use std::fmt;

use thiserror::Error;

use crate::{Availability, Driver};

/// The backends, in preference order.
pub struct Registry {
    drivers: Vec<Box<dyn Driver>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.drivers.iter().map(|d| d.name()))
            .finish()
    }
}

/// No driver in the registry is available; carries every driver's own diagnosis, in order.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("no driver is available on this host: {}", render(.diagnoses))]
pub struct NoDriverError {
    /// `(driver name, its availability)` for each registered driver, in preference order.
    pub diagnoses: Vec<(String, Availability)>,
}

fn render(diagnoses: &[(String, Availability)]) -> String {
    if diagnoses.is_empty() {
        return "no drivers are registered".into();
    }
    diagnoses
        .iter()
        .map(|(name, a)| format!("{name}: {}", a.detail))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Registry {
    /// A registry over `drivers`, in the given preference order (tests pass fakes here).
    pub fn new(drivers: Vec<Box<dyn Driver>>) -> Registry {
        Registry { drivers }
    }

    /// The built-in backends in preference order: kvm, tcg, hvf, hyperv.
    pub fn with_defaults() -> Registry {
        Registry::new(vec![
            Box::new(crate::kvm::KvmDriver::new()),
            Box::new(crate::tcg::TcgDriver::new()),
            Box::new(crate::hvf::HvfDriver::new()),
            Box::new(crate::hyperv::HypervDriver::new()),
        ])
    }

    /// All drivers, in preference order.
    pub fn drivers(&self) -> impl Iterator<Item = &dyn Driver> {
        self.drivers.iter().map(|d| d.as_ref())
    }

    /// The driver called `name`, if registered.
    pub fn get(&self, name: &str) -> Option<&dyn Driver> {
        self.drivers().find(|d| d.name() == name)
    }

    /// Runs every driver's detection, in order.
    pub fn detect_all(&self) -> Vec<(String, Availability)> {
        self.drivers()
            .map(|d| (d.name().to_string(), d.detect()))
            .collect()
    }

    /// The first driver (in preference order) that reports itself available, with its
    /// availability; or every driver's diagnosis when none is. Drivers after the first
    /// available one are not probed.
    pub fn select_first_available(&self) -> Result<(&dyn Driver, Availability), NoDriverError> {
        let mut diagnoses = Vec::new();
        for d in self.drivers() {
            let a = d.detect();
            if a.ok {
                return Ok((d, a));
            }
            diagnoses.push((d.name().to_string(), a));
        }
        Err(NoDriverError { diagnoses })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::{BootPlan, DriverError, Machine};
    use vm_spec::Containment;

    struct Fake {
        name: &'static str,
        ok: bool,
        probes: Arc<AtomicUsize>,
    }

    impl Driver for Fake {
        fn name(&self) -> &'static str {
            self.name
        }
        fn containment(&self) -> Containment {
            Containment::MicroVm
        }
        fn detect(&self) -> Availability {
            self.probes.fetch_add(1, Ordering::SeqCst);
            Availability {
                ok: self.ok,
                detail: format!("{} says {}", self.name, self.ok),
            }
        }
        fn boot(&self, _plan: BootPlan) -> Result<Machine, DriverError> {
            Err(DriverError::Unsupported {
                driver: self.name,
                reason: "fake".into(),
            })
        }
    }

    fn fakes(spec: &[(&'static str, bool)]) -> (Registry, Arc<AtomicUsize>) {
        let probes = Arc::new(AtomicUsize::new(0));
        let drivers = spec
            .iter()
            .map(|&(name, ok)| {
                Box::new(Fake {
                    name,
                    ok,
                    probes: probes.clone(),
                }) as Box<dyn Driver>
            })
            .collect();
        (Registry::new(drivers), probes)
    }

    #[test]
    fn picks_the_first_available_in_order() {
        let (r, probes) = fakes(&[("a", false), ("b", true), ("c", true)]);
        let (d, a) = r.select_first_available().unwrap();
        assert_eq!(d.name(), "b");
        assert_eq!(a.detail, "b says true");
        assert_eq!(
            probes.load(Ordering::SeqCst),
            2,
            "drivers after the chosen one were probed"
        );
    }

    #[test]
    fn combines_every_diagnosis_when_none_is_available() {
        let (r, _) = fakes(&[("a", false), ("b", false)]);
        let err = r.select_first_available().unwrap_err();
        assert_eq!(err.diagnoses.len(), 2);
        assert_eq!(err.diagnoses[0].0, "a");
        assert_eq!(err.diagnoses[1].0, "b");
        let msg = err.to_string();
        assert!(
            msg.contains("a: a says false") && msg.contains("b: b says false"),
            "{msg}"
        );
    }

    #[test]
    fn empty_registry_says_so() {
        let err = Registry::new(Vec::new())
            .select_first_available()
            .unwrap_err();
        assert!(err.to_string().contains("no drivers are registered"));
    }

    #[test]
    fn defaults_are_in_preference_order() {
        let r = Registry::with_defaults();
        let names: Vec<_> = r.drivers().map(|d| d.name()).collect();
        assert_eq!(names, ["kvm", "tcg", "hvf", "hyperv"]);
        assert_eq!(
            r.get("tcg").map(|d| d.containment()),
            Some(Containment::UserKernel)
        );
        assert_eq!(
            r.get("kvm").map(|d| d.containment()),
            Some(Containment::MicroVm)
        );
        assert!(r.get("xen").is_none());
    }

    /// On this host kvm is PVM-native (not OK) and tcg is installed, so selection reports tcg;
    /// the caller (the admission gate) then decides whether emulation is acceptable.
    #[test]
    fn this_host_selects_tcg_without_hiding_kvm() {
        let r = Registry::with_defaults();
        let kvm = r.get("kvm").unwrap().detect();
        let tcg = r.get("tcg").unwrap().detect();
        if kvm.ok || !tcg.ok {
            crate::test_support::skip(&format!(
                "SKIP this_host_selects_tcg_without_hiding_kvm: kvm ok={} tcg ok={}",
                kvm.ok, tcg.ok
            ));
            return;
        }
        let (d, _) = r.select_first_available().unwrap();
        assert_eq!(d.name(), "tcg");
        assert_eq!(d.containment(), Containment::UserKernel);
    }
}
