//! Trust levels, the ordered containment scale, and the admission gate.
//!
//! The gate decides, before anything runs, whether a tier is strong enough for the work's
//! trust level. It never downgrades: a tier below the requirement is refused with a
//! `Forbidden` error naming the gap, and the requirement is relaxed only by an explicit
//! [`Policy`] flag whose name the refusal prints.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// How far the code about to run is trusted; it sets the containment it requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    /// Code we ship and vet (the runtime's own tools).
    Trusted,
    /// Code authored during the run (a model-written script): not hostile by construction,
    /// not vetted either.
    Semi,
    /// Code from outside that nobody vouches for. The worst case is host compromise.
    Untrusted,
}

/// How strongly a tier isolates the work inside it. Higher contains strictly more, so the
/// derived `Ord` is the comparison the gate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Containment {
    /// A directory jail sharing the host kernel, network and syscalls.
    None,
    /// Kernel-enforced filesystem/syscall confinement (Landlock, seccomp); shared kernel.
    Kernel,
    /// Namespaces and cgroups; still a shared host kernel.
    Container,
    /// A kernel re-implemented off the host kernel (an emulated or user-space kernel).
    UserKernel,
    /// The work's own kernel on hardware virtualization.
    MicroVm,
    /// Off this host entirely.
    Remote,
}

/// The flag that lets untrusted work run on an emulated (user-kernel) tier, as printed in
/// refusals.
pub const ALLOW_EMULATION_FLAG: &str = "--allow-emulation (Policy::allow_emulation)";

/// The minimum containment a trust level may run under with the default (strict) policy:
/// untrusted needs a hardware boundary, semi-trusted needs kernel confinement, trusted
/// needs nothing.
pub fn required(trust: Trust) -> Containment {
    match trust {
        Trust::Trusted => Containment::None,
        Trust::Semi => Containment::Kernel,
        Trust::Untrusted => Containment::MicroVm,
    }
}

/// Explicit relaxations of [`required`]. The default relaxes nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Let untrusted work run on a user-kernel tier (an emulated guest such as QEMU TCG)
    /// when no hardware boundary is available. Off by default.
    #[serde(default)]
    pub allow_emulation: bool,
    /// Let untrusted work run when the driver cannot build its jail around the VM's host
    /// processes here (not root, no namespaces): the VM then runs with the caller's
    /// privileges. Off by default; `vm drivers` and `--dry-run` say what the host grants.
    #[serde(default)]
    pub allow_weaker_jail: bool,
}

impl Policy {
    /// The minimum containment this policy accepts for `trust`.
    pub fn required(&self, trust: Trust) -> Containment {
        match trust {
            Trust::Untrusted if self.allow_emulation => Containment::UserKernel,
            _ => required(trust),
        }
    }

    /// The flag that would make `provided` admissible for `trust`, when one exists and is
    /// not already set.
    pub fn relaxation_for(&self, trust: Trust, provided: Containment) -> Option<&'static str> {
        let relaxed = Policy {
            allow_emulation: true,
            ..*self
        };
        let helps = !self.allow_emulation
            && provided < self.required(trust)
            && provided >= relaxed.required(trust);
        helps.then_some(ALLOW_EMULATION_FLAG)
    }
}

/// Anything that reports how strongly it contains work: a sandbox tier or a driver.
pub trait Tier {
    /// A short name for errors and logs ("kvm", "tcg").
    fn name(&self) -> &str;
    /// The containment this tier provides.
    fn containment(&self) -> Containment;
}

impl<T: Tier + ?Sized> Tier for &T {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn containment(&self) -> Containment {
        (**self).containment()
    }
}

impl<T: Tier + ?Sized> Tier for Box<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn containment(&self) -> Containment {
        (**self).containment()
    }
}

/// A policy refusal: the answer is a stronger tier (or an explicit flag), never a retry.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AdmitError {
    /// One tier is too weak for the work.
    #[error(
        "forbidden: {tier} provides {provided} containment but {trust} work requires {required}{}",
        hint(*.allowed_by)
    )]
    Forbidden {
        tier: String,
        trust: Trust,
        provided: Containment,
        required: Containment,
        /// The flag that would allow it, when one would.
        allowed_by: Option<&'static str>,
    },
    /// No candidate tier is strong enough.
    #[error(
        "forbidden: no tier can contain {trust} work (requires {required}; offered: {}){}",
        offered_list(.offered),
        hint(*.allowed_by)
    )]
    NoneAdmissible {
        trust: Trust,
        required: Containment,
        offered: Vec<(String, Containment)>,
        allowed_by: Option<&'static str>,
    },
}

fn hint(flag: Option<&'static str>) -> String {
    flag.map(|f| format!("; {f} allows it")).unwrap_or_default()
}

fn offered_list(offered: &[(String, Containment)]) -> String {
    if offered.is_empty() {
        return "none".to_string();
    }
    let parts: Vec<String> = offered.iter().map(|(n, c)| format!("{n}: {c}")).collect();
    parts.join(", ")
}

/// Decide whether a tier reporting `provided` may run `trust` work under `policy`.
pub fn admit_level(
    tier: &str,
    provided: Containment,
    trust: Trust,
    policy: &Policy,
) -> Result<(), AdmitError> {
    let required = policy.required(trust);
    if provided >= required {
        return Ok(());
    }
    Err(AdmitError::Forbidden {
        tier: tier.to_string(),
        trust,
        provided,
        required,
        allowed_by: policy.relaxation_for(trust, provided),
    })
}

/// Decide whether `tier` may run `trust` work under `policy`.
pub fn admit(tier: &dyn Tier, trust: Trust, policy: &Policy) -> Result<(), AdmitError> {
    admit_level(tier.name(), tier.containment(), trust, policy)
}

/// The strongest admissible candidate (the first one among equals), or `NoneAdmissible`
/// listing what was offered. Never picks a weaker tier than the policy requires.
pub fn select<T: Tier>(
    trust: Trust,
    candidates: impl IntoIterator<Item = T>,
    policy: &Policy,
) -> Result<T, AdmitError> {
    let mut best: Option<T> = None;
    let mut offered = Vec::new();
    for candidate in candidates {
        offered.push((candidate.name().to_string(), candidate.containment()));
        if admit(&candidate, trust, policy).is_err() {
            continue;
        }
        let stronger = match &best {
            Some(b) => candidate.containment() > b.containment(),
            None => true,
        };
        if stronger {
            best = Some(candidate);
        }
    }
    best.ok_or_else(|| {
        let allowed_by = offered
            .iter()
            .find_map(|(_, c)| policy.relaxation_for(trust, *c));
        AdmitError::NoneAdmissible {
            trust,
            required: policy.required(trust),
            offered,
            allowed_by,
        }
    })
}

impl fmt::Display for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Trust::Trusted => "trusted",
            Trust::Semi => "semi-trusted",
            Trust::Untrusted => "untrusted",
        })
    }
}

impl FromStr for Trust {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "trusted" => Ok(Trust::Trusted),
            "semi" | "semi-trusted" => Ok(Trust::Semi),
            "untrusted" => Ok(Trust::Untrusted),
            other => Err(format!(
                "unknown trust level {other:?} (trusted, semi, untrusted)"
            )),
        }
    }
}

impl fmt::Display for Containment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Containment::None => "none",
            Containment::Kernel => "kernel",
            Containment::Container => "container",
            Containment::UserKernel => "user-kernel",
            Containment::MicroVm => "microvm",
            Containment::Remote => "remote",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fake(&'static str, Containment);
    impl Tier for Fake {
        fn name(&self) -> &str {
            self.0
        }
        fn containment(&self) -> Containment {
            self.1
        }
    }

    #[test]
    fn containment_is_ordered() {
        use Containment::*;
        let order = [None, Kernel, Container, UserKernel, MicroVm, Remote];
        assert!(order.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn requirements_follow_the_seed() {
        assert_eq!(required(Trust::Untrusted), Containment::MicroVm);
        assert_eq!(required(Trust::Semi), Containment::Kernel);
        assert_eq!(required(Trust::Trusted), Containment::None);
        let lax = Policy {
            allow_emulation: true,
            allow_weaker_jail: false,
        };
        assert_eq!(lax.required(Trust::Untrusted), Containment::UserKernel);
        assert_eq!(lax.required(Trust::Semi), Containment::Kernel);
    }

    #[test]
    fn admit_refuses_weak_tier_and_names_gap() {
        let err = admit(
            &Fake("jail", Containment::Container),
            Trust::Untrusted,
            &Policy::default(),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("jail") && msg.contains("container") && msg.contains("microvm"));
        assert!(!msg.contains("allow-emulation"), "{msg}");
        assert!(
            admit(
                &Fake("kvm", Containment::MicroVm),
                Trust::Untrusted,
                &Policy::default()
            )
            .is_ok()
        );
        assert!(
            admit(
                &Fake("cloud", Containment::Remote),
                Trust::Untrusted,
                &Policy::default()
            )
            .is_ok()
        );
        assert!(
            admit(
                &Fake("jail", Containment::None),
                Trust::Trusted,
                &Policy::default()
            )
            .is_ok()
        );
        assert!(
            admit(
                &Fake("jail", Containment::None),
                Trust::Semi,
                &Policy::default()
            )
            .is_err()
        );
    }

    #[test]
    fn emulation_needs_the_explicit_flag() {
        let tcg = Fake("tcg", Containment::UserKernel);
        let err = admit(&tcg, Trust::Untrusted, &Policy::default()).unwrap_err();
        assert!(err.to_string().contains("--allow-emulation"), "{err}");
        assert!(
            admit(
                &tcg,
                Trust::Untrusted,
                &Policy {
                    allow_emulation: true,
                    allow_weaker_jail: false,
                }
            )
            .is_ok()
        );
        // The flag never lets a shared-kernel tier through.
        let err = admit(
            &Fake("c", Containment::Container),
            Trust::Untrusted,
            &Policy {
                allow_emulation: true,
                allow_weaker_jail: false,
            },
        )
        .unwrap_err();
        assert!(!err.to_string().contains("--allow-emulation"), "{err}");
    }

    #[test]
    fn select_picks_strongest_admissible() {
        let tiers = [
            Fake("jail", Containment::None),
            Fake("kvm", Containment::MicroVm),
            Fake("tcg", Containment::UserKernel),
            Fake("kvm2", Containment::MicroVm),
        ];
        let got = select(Trust::Untrusted, &tiers, &Policy::default()).unwrap();
        assert_eq!(got.name(), "kvm");
        let got = select(Trust::Trusted, &tiers, &Policy::default()).unwrap();
        assert_eq!(
            got.name(),
            "kvm",
            "strongest, not merely the first admissible"
        );
    }

    #[test]
    fn select_refuses_without_downgrade() {
        let tiers = [
            Fake("jail", Containment::None),
            Fake("tcg", Containment::UserKernel),
        ];
        let err = select(Trust::Untrusted, &tiers, &Policy::default()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("jail: none") && msg.contains("tcg: user-kernel"),
            "{msg}"
        );
        assert!(msg.contains("--allow-emulation"), "{msg}");
        let got = select(
            Trust::Untrusted,
            &tiers,
            &Policy {
                allow_emulation: true,
                allow_weaker_jail: false,
            },
        )
        .unwrap();
        assert_eq!(got.name(), "tcg");
        let none: [Fake; 0] = [];
        assert!(select(Trust::Trusted, &none, &Policy::default()).is_err());
    }

    #[test]
    fn trust_parses() {
        assert_eq!("semi".parse::<Trust>().unwrap(), Trust::Semi);
        assert!("maybe".parse::<Trust>().is_err());
    }
}
