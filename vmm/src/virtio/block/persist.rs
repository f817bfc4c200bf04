//! What a snapshot records of a block device, and what a restore must match: its image's
//! path, its size and whether it is read-only (a snapshot carries only read-only disks).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;

use crate::virtio::DeviceConfig;
use crate::virtio::persist::{DeviceKind, Difference, Identity, other_type};

/// A block device's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockIdentity {
    /// The image's host path.
    pub path: PathBuf,
    /// Its size in bytes when the snapshot was taken.
    pub size: u64,
    /// Opened read-only.
    pub read_only: bool,
}

impl Identity for BlockIdentity {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn name(&self) -> &'static str {
        "block"
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        super::QUEUE_SIZES
    }

    fn device_features(&self) -> u64 {
        super::offered_features(self.read_only)
    }

    fn of(kind: &DeviceKind) -> Option<&Self> {
        match kind {
            DeviceKind::Block(b) => Some(b),
            _ => None,
        }
    }

    fn difference(&self, now: &Self) -> Option<Difference> {
        Difference::of("path", &self.path, &now.path, |p| p.display().to_string())
            .or_else(|| {
                Difference::of(
                    "read_only",
                    &self.read_only,
                    &now.read_only,
                    bool::to_string,
                )
            })
            .or_else(|| Difference::of("size", &self.size, &now.size, u64::to_string))
    }

    fn config_difference(&self, cfg: &DeviceConfig) -> Option<Difference> {
        let DeviceConfig::Block {
            path, read_only, ..
        } = cfg
        else {
            return other_type(self, cfg);
        };
        Difference::of("path", &self.path, path, |p| p.display().to_string())
            .or_else(|| Difference::of("read_only", &self.read_only, read_only, bool::to_string))
    }
}
