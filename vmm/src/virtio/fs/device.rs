//! The virtio-fs device of `vm-vmm` (the kvm road): the read-only file server of one host
//! mount behind virtio-mmio, with a DAX window when configured.
//!
//! The share is opened by [`FsDevice::open_host_files`], once the VM process is jailed (its
//! source then is a read-only bind in the jail's root, at its own path) and before any vCPU
//! runs. The server lives as long as the device, across resets (a guest's `INIT` starts a
//! new session); each activation's worker (filter `ThreadKind::FsDevice`) borrows it.
//!
//! The DAX window ([`Window`]) is a virtio-mmio shared-memory region (id 0, the cache): a
//! range of guest physical addresses above RAM backed by a [`DaxMapping`] that KVM maps
//! read-only. `SETUPMAPPING` maps file pages into it (`PROT_READ`, `MAP_SHARED`: the host's
//! page cache, one copy for every VM reading the file; a tmpfs chunk with holes is copied
//! instead, see `vm_virtiofs::dax`), `REMOVEMAPPING` puts zero pages back; a guest store into
//! it exits to the VMM and changes nothing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use vm_jail::seccomp::ThreadKind;
use vm_sync::Lock;
use vm_virtiofs::dax::Extent;
use vm_virtiofs::fs::MIN_INODES;
use vm_virtiofs::{DaxWindow, Fs, Limits, Server};

use super::{NUM_QUEUES, Scratch, serve_chain};
use crate::sys::window::DaxMapping;
use crate::virtio::persist::DeviceKind;
use crate::virtio::worker::{Ctx, Handler, MakeHandler};
use crate::virtio::{VirtioDevice, VirtioError, read_config_bytes};

/// Each queue's largest size (the high-priority queue, the request queue).
pub(crate) const QUEUE_SIZES: &[u16] = &[256, 256];
/// Descriptors a share's server keeps beyond its inodes' (the share's root, a spare).
const OWN_FDS: u64 = 16;
/// `VIRTIO_FS_SHMCAP_ID_CACHE`: the DAX window's shared-memory region id.
pub const SHM_CACHE: u32 = 0;
/// The longest tag (`struct virtio_fs_config`).
pub const MAX_TAG: usize = 36;

/// A DAX window: where the guest sees it, and its host mapping.
#[derive(Debug, Clone)]
pub struct Window {
    /// Guest physical base.
    pub guest_base: u64,
    /// The host mapping KVM maps read-only there.
    pub mapping: Arc<DaxMapping>,
}

/// The server's view of a window.
struct WindowHandle(Arc<DaxMapping>);

impl DaxWindow for WindowHandle {
    fn size(&self) -> u64 {
        self.0.len()
    }

    fn map(
        &mut self,
        moffset: u64,
        len: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        foffset: u64,
    ) -> Result<(), Errno> {
        self.0.map_file(moffset, len, fd, foffset)
    }

    fn unmap(&mut self, moffset: u64, len: u64) -> Result<(), Errno> {
        self.0.zero(moffset, len)
    }

    fn copy(
        &mut self,
        moffset: u64,
        len: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        foffset: u64,
        extents: &[Extent],
    ) -> Result<(), Errno> {
        self.0.copy_file(moffset, len, fd, foffset, extents)
    }
}

/// A shared server (the device keeps it across activations; the worker borrows it).
type SharedServer = Arc<Mutex<Option<Server>>>;

/// The virtio-fs device model.
pub struct FsDevice {
    tag: String,
    share: PathBuf,
    limits: Limits,
    window: Option<Window>,
    config: [u8; MAX_TAG + 8],
    server: SharedServer,
    /// A snapshot's session, rebuilt when the share is opened.
    pending: Option<vm_virtiofs::SessionState>,
}

impl FsDevice {
    /// A device serving `share` under `tag`, with `window` as its DAX window.
    pub fn new(
        tag: &str,
        share: PathBuf,
        limits: Limits,
        window: Option<Window>,
    ) -> Result<FsDevice, VirtioError> {
        if tag.is_empty() || tag.len() > MAX_TAG {
            return Err(VirtioError::InvalidTag(tag.into()));
        }
        let mut config = [0u8; MAX_TAG + 8];
        config[..tag.len()].copy_from_slice(tag.as_bytes());
        // num_request_queues: one; notify_buf_size: no notification queue.
        config[MAX_TAG..MAX_TAG + 4].copy_from_slice(&1u32.to_le_bytes());
        Ok(FsDevice {
            tag: tag.into(),
            share,
            limits,
            window,
            config,
            server: SharedServer::default(),
            pending: None,
        })
    }
}

impl VirtioDevice for FsDevice {
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Fs(super::persist::FsIdentity {
            tag: self.tag.clone(),
            share: self.share.clone(),
            dax_window: self.window.as_ref().map_or(0, |w| w.mapping.len()),
        })
    }

    fn worker_kind(&self) -> ThreadKind {
        ThreadKind::FsDevice
    }

    fn window(&self) -> Option<&Window> {
        self.window.as_ref()
    }

    fn shm_region(&self, id: u32) -> Option<(u64, u64)> {
        let w = self.window.as_ref().filter(|_| id == SHM_CACHE)?;
        Some((w.guest_base, w.mapping.len()))
    }

    fn serves_host_files(&self) -> bool {
        true
    }

    fn open_host_files(&mut self, descriptors: u64) -> Result<(), VirtioError> {
        let mut server = self.server.locked();
        if server.is_none() {
            let limits = self
                .limits
                .fit(descriptors, OWN_FDS)
                .ok_or(VirtioError::Descriptors {
                    have: descriptors,
                    need: OWN_FDS + MIN_INODES,
                })?;
            let fs = Fs::open(&self.share, limits).map_err(VirtioError::Share)?;
            let dax = self
                .window
                .as_ref()
                .map(|w| Box::new(WindowHandle(w.mapping.clone())) as Box<dyn DaxWindow>);
            let mut s = Server::new(fs, dax);
            if let Some(session) = self.pending.take() {
                s.restore(&session).map_err(VirtioError::Session)?;
            }
            *server = Some(s);
        }
        Ok(())
    }

    fn save_session(&self) -> Option<vm_virtiofs::SessionState> {
        self.server.locked().as_ref().map(Server::save)
    }

    fn restore_session(&mut self, session: &vm_virtiofs::SessionState) {
        self.pending = Some(session.clone());
    }

    /// The worker borrows the server; until the share is opened (before any vCPU runs: a
    /// restored device asks for its worker first) it answers nothing.
    fn activate(&mut self, _acked: u64) -> Result<MakeHandler, VirtioError> {
        let server = self.server.clone();
        Ok(Box::new(move || {
            Box::new(FsHandler {
                server,
                scratch: Scratch::default(),
            })
        }))
    }
}

/// The worker's side: every request of a notified queue through the server.
struct FsHandler {
    server: SharedServer,
    scratch: Scratch,
}

impl Handler for FsHandler {
    fn queue_notify(&mut self, index: usize, ctx: &mut Ctx<'_>) {
        if index >= NUM_QUEUES {
            return;
        }
        let (server, scratch) = (&self.server, &mut self.scratch);
        ctx.serve_requests(index, "virtio-fs", |bufs, mem, _| {
            match server.locked().as_mut() {
                Some(s) => serve_chain(s, mem, bufs, scratch).0,
                None => 0,
            }
        });
    }
}
