//! Resource caps and their normalization.
//!
//! The raw [`Limits`] mirror what a caller writes (signed, zero meaning "default"); the
//! normalized [`ValidLimits`] are what a driver receives. Normalization applies the safe
//! floors (one vCPU, a default pid cap rather than none) and refuses what cannot be made
//! safe (no memory cap) or is beyond what a sandbox on one host should get.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// Default process cap inside a guest when the caller leaves `pids` at or below zero.
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
    /// Virtual CPUs; `<= 0` means one.
    pub vcpus: i64,
    /// Guest RAM in MiB; must be positive (an uncapped guest is refused).
    pub mem_mib: i64,
    /// Process cap inside the guest; `<= 0` means [`DEFAULT_PIDS`], never unlimited.
    pub pids: i64,
    /// Hard lifetime of the guest; zero leaves it to the caller.
    #[serde(rename = "wall_ms", with = "millis")]
    pub wall: Duration,
}

impl Default for Limits {
    /// One vCPU, 256 MiB, the default pid cap, no wall lifetime.
    fn default() -> Self {
        Limits {
            vcpus: 1,
            mem_mib: 256,
            pids: 0,
            wall: Duration::ZERO,
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
    /// Apply floors and defaults, refuse what is out of bounds. Errors name the field
    /// (`guarantees.limits.<field>`) and the value.
    pub fn normalize(&self) -> Result<ValidLimits, SpecError> {
        let vcpus = if self.vcpus <= 0 { 1 } else { self.vcpus };
        let pids = if self.pids <= 0 {
            i64::from(DEFAULT_PIDS)
        } else {
            self.pids
        };
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
            wall: (!self.wall.is_zero()).then_some(self.wall),
        })
    }
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

mod opt_millis {
    use serde::Serializer;
    use std::time::Duration;

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

    fn lim(vcpus: i64, mem_mib: i64, pids: i64, wall_s: u64) -> Limits {
        Limits {
            vcpus,
            mem_mib,
            pids,
            wall: Duration::from_secs(wall_s),
        }
    }

    #[test]
    fn floors_and_defaults() {
        let v = lim(0, 128, 0, 0).normalize().unwrap();
        assert_eq!(
            (v.vcpus, v.mem_mib, v.pids, v.wall),
            (1, 128, DEFAULT_PIDS, None)
        );
        let v = lim(-3, 128, -1, 5).normalize().unwrap();
        assert_eq!(
            (v.vcpus, v.pids, v.wall),
            (1, DEFAULT_PIDS, Some(Duration::from_secs(5)))
        );
        let v = lim(4, 2048, 77, 0).normalize().unwrap();
        assert_eq!((v.vcpus, v.mem_mib, v.pids), (4, 2048, 77));
    }

    #[test]
    fn memory_must_be_capped() {
        for bad in [0, -1, MIN_MEM_MIB - 1] {
            let err = lim(1, bad, 0, 0).normalize().unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains("guarantees.limits.mem_mib") && msg.contains(&bad.to_string()));
        }
        // The floor is what a guest kernel plus agent boots in: 64 MiB passes, 63 does not.
        assert_eq!(MIN_MEM_MIB, 64);
        assert_eq!(lim(1, MIN_MEM_MIB, 0, 0).normalize().unwrap().mem_mib, 64);
    }

    #[test]
    fn upper_bounds_name_the_field() {
        let cases = [
            (lim(MAX_VCPUS + 1, 128, 0, 0), "vcpus"),
            (lim(1, MAX_MEM_MIB + 1, 0, 0), "mem_mib"),
            (lim(1, 128, MAX_PIDS + 1, 0), "pids"),
        ];
        for (l, field) in cases {
            let msg = l.normalize().unwrap_err().to_string();
            assert!(msg.contains(&format!("guarantees.limits.{field}")), "{msg}");
        }
        assert!(lim(MAX_VCPUS, MAX_MEM_MIB, MAX_PIDS, 0).normalize().is_ok());
    }

    #[test]
    fn wall_serializes_as_millis() {
        let json = serde_json::to_string(&lim(1, 64, 0, 2)).unwrap();
        assert!(json.contains("\"wall_ms\":2000"), "{json}");
        let back: Limits = serde_json::from_str(&json).unwrap();
        assert_eq!(back.wall, Duration::from_secs(2));
    }
}
