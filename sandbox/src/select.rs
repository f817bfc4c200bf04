//! Choosing a driver: the first available one whose containment the admission gate accepts
//! for the work's trust under the policy. An available driver that is too weak is never
//! used as a fallback; the refusal says which flag would allow it.

use std::fmt;

use thiserror::Error;
use vm_drivers::{Driver, Registry};
use vm_spec::{AdmitError, Containment, Policy, Trust, admit_level};

/// What one driver said during selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub driver: String,
    pub containment: Containment,
    /// Detection verdict.
    pub available: bool,
    /// Detection detail.
    pub detail: String,
    /// The gate's refusal, when the driver is too weak for the work.
    pub refused: Option<AdmitError>,
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.refused, self.available) {
            (
                Some(AdmitError::Forbidden {
                    provided, required, ..
                }),
                true,
            ) => write!(
                f,
                "{}: available but refused ({provided} containment, {required} required)",
                self.driver
            ),
            (
                Some(AdmitError::Forbidden {
                    provided, required, ..
                }),
                false,
            ) => write!(
                f,
                "{}: {} (also too weak: {provided}, {required} required)",
                self.driver, self.detail
            ),
            _ => write!(f, "{}: {}", self.driver, self.detail),
        }
    }
}

/// Why no driver was selected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SelectError {
    /// No registered driver is both available and strong enough.
    #[error(
        "forbidden: no driver can run {trust} work (requires {required} containment): {}{}",
        join(.diagnoses),
        hint(*.allowed_by)
    )]
    NoDriver {
        trust: Trust,
        required: Containment,
        diagnoses: Vec<Diagnosis>,
        /// The flag that would admit an available driver, when one would.
        allowed_by: Option<&'static str>,
    },
    /// A driver was asked for by name and is not registered.
    #[error("driver {name:?} is not registered (known: {known})")]
    Unknown { name: String, known: String },
    /// A driver was asked for by name and cannot be used.
    #[error("driver {} is not usable: {}{}", .0.driver, .0, hint(refusal_flag(.0)))]
    Unusable(Box<Diagnosis>),
}

fn join(d: &[Diagnosis]) -> String {
    if d.is_empty() {
        return "no drivers are registered".into();
    }
    d.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn hint(flag: Option<&'static str>) -> String {
    flag.map(|f| format!("; {f} would allow it"))
        .unwrap_or_default()
}

fn refusal_flag(d: &Diagnosis) -> Option<&'static str> {
    match &d.refused {
        Some(AdmitError::Forbidden { allowed_by, .. }) => *allowed_by,
        _ => None,
    }
}

fn diagnose(d: &dyn Driver, trust: Trust, policy: &Policy) -> Diagnosis {
    let a = d.detect();
    Diagnosis {
        driver: d.name().to_string(),
        containment: d.containment(),
        available: a.ok,
        detail: a.detail,
        refused: admit_level(d.name(), d.containment(), trust, policy).err(),
    }
}

/// The first driver (in registry order) that is available and admissible for `trust`
/// under `policy`, or every driver's diagnosis.
pub fn select_driver<'r>(
    registry: &'r Registry,
    trust: Trust,
    policy: &Policy,
) -> Result<&'r dyn Driver, SelectError> {
    let mut diagnoses = Vec::new();
    for d in registry.drivers() {
        let diag = diagnose(d, trust, policy);
        if diag.available && diag.refused.is_none() {
            tracing::info!(driver = d.name(), detail = %diag.detail, "selected driver");
            return Ok(d);
        }
        diagnoses.push(diag);
    }
    let allowed_by = diagnoses
        .iter()
        .filter(|d| d.available)
        .find_map(refusal_flag);
    Err(SelectError::NoDriver {
        trust,
        required: policy.required(trust),
        diagnoses,
        allowed_by,
    })
}

/// The driver called `name`, when it is available and admissible.
pub fn select_named<'r>(
    registry: &'r Registry,
    name: &str,
    trust: Trust,
    policy: &Policy,
) -> Result<&'r dyn Driver, SelectError> {
    let Some(d) = registry.get(name) else {
        let known: Vec<&str> = registry.drivers().map(|d| d.name()).collect();
        return Err(SelectError::Unknown {
            name: name.into(),
            known: known.join(", "),
        });
    };
    let diag = diagnose(d, trust, policy);
    if !diag.available || diag.refused.is_some() {
        return Err(SelectError::Unusable(Box::new(diag)));
    }
    Ok(d)
}

/// [`select_named`] when a driver is asked for by name, else [`select_driver`].
pub fn select<'r>(
    registry: &'r Registry,
    name: Option<&str>,
    trust: Trust,
    policy: &Policy,
) -> Result<&'r dyn Driver, SelectError> {
    match name {
        Some(name) => select_named(registry, name, trust, policy),
        None => select_driver(registry, trust, policy),
    }
}
