//! What a snapshot records of a virtio-fs device's identity, and what a restore must match:
//! its tag, its share and its DAX window's size. The FUSE session itself (the guest's node
//! ids, handles and mappings) is saved beside it (`DeviceState::fs`) and resolved again
//! against the host tree on restore.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::virtio::DeviceConfig;
use crate::virtio::persist::{DeviceKind, Difference, Identity, other_type};

/// A virtio-fs device's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsIdentity {
    /// The device's tag.
    pub tag: String,
    /// The mount's source on the host.
    pub share: PathBuf,
    /// The DAX window's size in bytes (0: none).
    pub dax_window: u64,
}

impl FsIdentity {
    fn first_difference(&self, tag: &String, share: &PathBuf, window: &u64) -> Option<Difference> {
        Difference::of("tag", &self.tag, tag, String::clone)
            .or_else(|| Difference::of("share", &self.share, share, |p| p.display().to_string()))
            .or_else(|| Difference::of("dax_window", &self.dax_window, window, u64::to_string))
    }
}

impl Identity for FsIdentity {
    fn device_type(&self) -> u32 {
        super::VIRTIO_ID_FS
    }

    fn name(&self) -> &'static str {
        "fs"
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        super::QUEUE_SIZES
    }

    fn of(kind: &DeviceKind) -> Option<&Self> {
        match kind {
            DeviceKind::Fs(f) => Some(f),
            _ => None,
        }
    }

    fn difference(&self, now: &Self) -> Option<Difference> {
        self.first_difference(&now.tag, &now.share, &now.dax_window)
    }

    fn config_difference(&self, cfg: &DeviceConfig) -> Option<Difference> {
        let DeviceConfig::Fs {
            tag,
            share,
            dax_window,
            ..
        } = cfg
        else {
            return other_type(self, cfg);
        };
        self.first_difference(tag, share, dax_window)
    }
}
