//! Resource caps and their normalization.
//!
//! The raw [`Limits`] mirror what a caller writes (signed, so a negative value is refused by
//! name rather than wrapped); the normalized [`ValidLimits`] are what a driver receives.
//! Normalization refuses, naming the field, what cannot be meant: no vCPU, no process, a
//! zero lifetime (`--timeout 0` would otherwise boot a VM only to kill it, while a dry run
//! read it as "no limit"), no memory cap, or more than a sandbox on one host should get.
//! Nothing is silently raised to a floor.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// The process cap of [`Limits::default`].
pub const DEFAULT_PIDS: u32 = 1024;
/// Upper bound on vCPUs.
pub const MAX_VCPUS: i64 = 16;
/// Smallest guest memory a kernel plus agent can run in, in MiB: the one floor. Every driver's
/// boot check uses it (`vm_drivers` refuses a plan below it), so a spec that validates here —
/// what `--dry-run` answers — never fails at boot for its memory.
pub const MIN_MEM_MIB: i64 = 64;
/// Upper bound on guest memory, in MiB (64 GiB).
pub const MAX_MEM_MIB: i64 = 64 * 1024;
/// Upper bound on the guest process cap.
pub const MAX_PIDS: i64 = 65_536;

/// Caps a guest's resource use, as the caller writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Virtual CPUs, `1..=`[`MAX_VCPUS`].
    pub vcpus: i64,
    /// Guest RAM in MiB; must be positive (an uncapped guest is refused).
    pub mem_mib: i64,
    /// Process cap inside the guest, `1..=`[`MAX_PIDS`]; never unlimited.
    pub pids: i64,
    /// Hard lifetime of the guest; `None` leaves it to the caller. A zero lifetime is
    /// refused. On the wire `wall_ms`: a number of milliseconds, or null/absent for none.
    #[serde(rename = "wall_ms", default, with = "opt_millis")]
    pub wall: Option<Duration>,
}

impl Default for Limits {
    /// One vCPU, 256 MiB, [`DEFAULT_PIDS`], no wall lifetime.
    fn default() -> Self {
        Limits {
            vcpus: 1,
            mem_mib: 256,
            pids: DEFAULT_PIDS as i64,
            wall: None,
        }
    }
}

/// Normalized limits: every field concrete and within bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ValidLimits {
    pub vcpus: u32,
    pub mem_mib: u32,
    pub pids: u32,
    /// `None`: the guest lives as long as its owner keeps it.
    #[serde(rename = "wall_ms", with = "opt_millis")]
    pub wall: Option<Duration>,
}

impl Limits {
    /// Refuse what is out of bounds. Errors name the field (`guarantees.limits.<field>`)
    /// and the value.
    pub fn normalize(&self) -> Result<ValidLimits, SpecError> {
        let (vcpus, pids) = (self.vcpus, self.pids);
        for (field, value) in [("vcpus", vcpus), ("pids", pids)] {
            if value < 1 {
                return Err(SpecError::LimitTooLow {
                    field,
                    value,
                    min: 1,
                });
            }
        }
        if let Some(wall) = self.wall
            && wall.as_millis() == 0
        {
            return Err(SpecError::ZeroWall);
        }
        if self.mem_mib < MIN_MEM_MIB {
            return Err(SpecError::MemoryUncapped {
                value: self.mem_mib,
                min: MIN_MEM_MIB,
            });
        }
        for (field, value, max) in [
            ("vcpus", vcpus, MAX_VCPUS),
            ("mem_mib", self.mem_mib, MAX_MEM_MIB),
            ("pids", pids, MAX_PIDS),
        ] {
            if value > max {
                return Err(SpecError::LimitTooHigh { field, value, max });
            }
        }
        // All three are now in 1..=max, and every max fits in u32.
        let to_u32 = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(ValidLimits {
            vcpus: to_u32(vcpus),
            mem_mib: to_u32(self.mem_mib),
            pids: to_u32(pids),
            wall: self.wall,
        })
    }
}

mod opt_millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(vcpus: i64, mem_mib: i64, pids: i64, wall_s: Option<u64>) -> Limits {
        Limits {
            vcpus,
            mem_mib,
            pids,
            wall: wall_s.map(Duration::from_secs),
        }
    }

    #[test]
    fn values_pass_through_and_defaults_are_concrete() {
        let v = Limits::default().normalize().unwrap();
        assert_eq!(
            (v.vcpus, v.mem_mib, v.pids, v.wall),
            (1, 256, DEFAULT_PIDS, None)
        );
        let v = lim(4, 2048, 77, Some(5)).normalize().unwrap();
        assert_eq!(
            (v.vcpus, v.mem_mib, v.pids, v.wall),
            (4, 2048, 77, Some(Duration::from_secs(5)))
        );
    }

    /// `--cpus 0` once became one vCPU and `--pids 0` the default cap, silently.
    #[test]
    fn zero_or_negative_vcpus_and_pids_are_refused_by_name() {
        for bad in [0, -1, i64::MIN] {
            let msg = lim(bad, 128, 64, None).normalize().unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("guarantees.limits.vcpus: {bad} refused")),
                "{msg}"
            );
            let msg = lim(1, 128, bad, None).normalize().unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("guarantees.limits.pids: {bad} refused")),
                "{msg}"
            );
        }
    }

    /// `--timeout 0` once booted a VM and killed it at once while a dry run said "no limit".
    #[test]
    fn a_zero_wall_is_refused_by_name() {
        for zero in [Duration::ZERO, Duration::from_micros(999)] {
            let l = Limits {
                wall: Some(zero),
                ..Limits::default()
            };
            let msg = l.normalize().unwrap_err().to_string();
            assert!(
                msg.starts_with("guarantees.limits.wall_ms: 0 refused"),
                "{msg}"
            );
        }
        let l = Limits {
            wall: Some(Duration::from_millis(1)),
            ..Limits::default()
        };
        assert_eq!(l.normalize().unwrap().wall, Some(Duration::from_millis(1)));
    }

    #[test]
    fn memory_must_be_capped() {
        for bad in [0, -1, MIN_MEM_MIB - 1] {
            let err = lim(1, bad, 1, None).normalize().unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("guarantees.limits.mem_mib") && msg.contains(&bad.to_string()));
        }
        // The floor is what a guest kernel plus agent boots in: 64 MiB passes, 63 does not.
        assert_eq!(MIN_MEM_MIB, 64);
        assert_eq!(
            lim(1, MIN_MEM_MIB, 1, None).normalize().unwrap().mem_mib,
            64
        );
    }

    #[test]
    fn upper_bounds_name_the_field() {
        let cases = [
            (lim(MAX_VCPUS + 1, 128, 1, None), "vcpus"),
            (lim(1, MAX_MEM_MIB + 1, 1, None), "mem_mib"),
            (lim(1, 128, MAX_PIDS + 1, None), "pids"),
        ];
        for (l, field) in cases {
            let msg = l.normalize().unwrap_err().to_string();
            assert!(msg.contains(&format!("guarantees.limits.{field}")), "{msg}");
        }
        assert!(
            lim(MAX_VCPUS, MAX_MEM_MIB, MAX_PIDS, None)
                .normalize()
                .is_ok()
        );
    }

    #[test]
    fn wall_serializes_as_millis_or_null() {
        let json = serde_json::to_string(&lim(1, 64, 1, Some(2))).unwrap();
        assert!(json.contains("\"wall_ms\":2000"), "{json}");
        let back: Limits = serde_json::from_str(&json).unwrap();
        assert_eq!(back.wall, Some(Duration::from_secs(2)));
        let json = serde_json::to_string(&lim(1, 64, 1, None)).unwrap();
        assert!(json.contains("\"wall_ms\":null"), "{json}");
        let back: Limits = serde_json::from_str(&json).unwrap();
        assert_eq!(back.wall, None);
        // Absent is none too; an explicit 0 is kept, so validation can refuse it.
        let back: Limits = serde_json::from_str(r#"{"vcpus":1,"mem_mib":64,"pids":1}"#).unwrap();
        assert_eq!(back.wall, None);
        let back: Limits =
            serde_json::from_str(r#"{"vcpus":1,"mem_mib":64,"pids":1,"wall_ms":0}"#).unwrap();
        assert!(back.normalize().is_err());
    }
}
