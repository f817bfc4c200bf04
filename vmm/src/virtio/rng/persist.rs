//! What a snapshot records of an rng device: that it is one (it has no state of its own).

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;

use crate::virtio::DeviceConfig;
use crate::virtio::persist::{DeviceKind, Difference, Identity, other_type};

/// An rng device's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngIdentity;

impl Identity for RngIdentity {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn name(&self) -> &'static str {
        "rng"
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        super::QUEUE_SIZES
    }

    fn of(kind: &DeviceKind) -> Option<&Self> {
        match kind {
            DeviceKind::Rng(r) => Some(r),
            _ => None,
        }
    }

    fn difference(&self, _now: &Self) -> Option<Difference> {
        None
    }

    fn config_difference(&self, cfg: &DeviceConfig) -> Option<Difference> {
        match cfg {
            DeviceConfig::Rng => None,
            _ => other_type(self, cfg),
        }
    }
}
