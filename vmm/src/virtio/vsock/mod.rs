//! virtio-vsock with a "hybrid" host side, as Firecracker does it: one Unix socket per VM.
//!
//! - Host -> guest: a host client connects to `uds_path`, writes `CONNECT <port>\n` (at most
//!   32 bytes, within 2 s, or it is dropped), gets `OK <hostport>\n` once the guest's listener on
//!   `port` accepted (within 3 s, or the client is closed), and is then spliced to that guest
//!   connection.
//! - Guest -> host: never. Every guest `REQUEST` gets `RST` and is counted
//!   ([`muxer::guest_connects_refused`]); unlike other hybrid-vsock VMMs nothing is connected
//!   to `<uds_path>_P`, so no host listener can become a guest egress channel.
//!
//! [`packet`] parses and validates headers (pure), [`connection`] keeps the per-connection
//! credit accounting, [`muxer`] is the event handler, [`unix`] the host-socket side.
//! Two transports drive the same muxer through [`transport::VsockQueues`]: this device behind
//! virtio-mmio in `vm-vmm`, and [`vhost_user`], the vhost-user backend `vm-vsock` runs for the
//! tcg driver's QEMU.
//! The listening socket file is removed when the device is dropped.

pub mod connection;
pub mod muxer;
pub mod packet;
pub mod persist;
pub mod timers;
pub mod transport;
pub mod unix;
pub mod vhost_user;

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use super::persist::DeviceKind;
use super::worker::MakeHandler;
use super::{VirtioDevice, VirtioError, read_config_bytes};

pub(crate) const QUEUE_SIZES: &[u16] = &[256, 256, 256];

/// The vsock device model.
pub struct Vsock {
    guest_cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    config: [u8; 8],
}

impl Vsock {
    /// Bind `uds_path` for guest `guest_cid` (3 and up).
    pub fn new(guest_cid: u64, uds_path: &Path) -> Result<Self, VirtioError> {
        if guest_cid < 3 || guest_cid > u64::from(u32::MAX) {
            return Err(VirtioError::InvalidCid(guest_cid));
        }
        let listener = unix::bind(uds_path)?;
        Ok(Vsock {
            guest_cid,
            uds_path: uds_path.to_path_buf(),
            listener,
            config: guest_cid.to_le_bytes(),
        })
    }
}

impl VirtioDevice for Vsock {
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Vsock(persist::VsockIdentity {
            guest_cid: self.guest_cid,
        })
    }
    fn resets_on_restart(&self) -> bool {
        true
    }
    fn activate(&mut self, _acked: u64) -> Result<MakeHandler, VirtioError> {
        let listener = self
            .listener
            .try_clone()
            .map_err(VirtioError::os("vsock listener handle"))?;
        let cid = self.guest_cid;
        Ok(Box::new(move || Box::new(muxer::Muxer::new(cid, listener))))
    }
}

impl Drop for Vsock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.uds_path);
    }
}
