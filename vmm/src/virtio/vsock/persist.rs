//! What a snapshot records of a vsock device, and what a restore must match: the guest's
//! CID. Its connections are not saved: they cannot outlive their host sockets (a restored
//! device starts with none and tells the guest with a transport reset).

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_VSOCK;

use crate::virtio::DeviceConfig;
use crate::virtio::persist::{DeviceKind, Difference, Identity, other_type};

/// A vsock device's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VsockIdentity {
    /// The guest's CID.
    pub guest_cid: u64,
}

impl Identity for VsockIdentity {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_VSOCK
    }

    fn name(&self) -> &'static str {
        "vsock"
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        super::QUEUE_SIZES
    }

    fn of(kind: &DeviceKind) -> Option<&Self> {
        match kind {
            DeviceKind::Vsock(v) => Some(v),
            _ => None,
        }
    }

    fn difference(&self, now: &Self) -> Option<Difference> {
        Difference::of("guest_cid", &self.guest_cid, &now.guest_cid, u64::to_string)
    }

    fn config_difference(&self, cfg: &DeviceConfig) -> Option<Difference> {
        let DeviceConfig::Vsock { guest_cid, .. } = cfg else {
            return other_type(self, cfg);
        };
        Difference::of("guest_cid", &self.guest_cid, guest_cid, u64::to_string)
    }
}
