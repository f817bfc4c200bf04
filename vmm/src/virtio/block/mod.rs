//! virtio-blk over a raw image file.
//!
//! A read-only disk is opened `O_RDONLY`, offers `VIRTIO_BLK_F_RO`, and refuses every write,
//! discard and write-zeroes request with `VIRTIO_BLK_S_IOERR` whatever the driver negotiated, so
//! the host file stays byte-identical. Reads go straight from the file into guest memory
//! (`read_volatile_from`), writes straight from guest memory to the file: no per-request buffer
//! sized by the guest. [`request`] holds the pure request parser.

pub mod persist;
pub mod request;

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::PathBuf;

use vm_memory::{Bytes, GuestAddress};

use super::persist::DeviceKind;
use super::queue::Buf;
use super::worker::{Ctx, Handler, MakeHandler};
use super::{GuestMemoryMmap, VirtioDevice, VirtioError, read_config_bytes};
use crate::metrics::DeviceMetrics;
use request::{DiskInfo, HEADER_SIZE, ID_BYTES, Op, Request, parse_request, status};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
};

const QUEUE_SIZE: u16 = 256;
pub(crate) const QUEUE_SIZES: &[u16] = &[QUEUE_SIZE];

/// Configuration of one disk.
#[derive(Debug, Clone)]
pub struct BlockConfig {
    /// Host path of the raw image.
    pub path: PathBuf,
    /// Read-only disk.
    pub read_only: bool,
    /// Serial answered to GET_ID (at most 20 bytes).
    pub id: String,
}

/// The features a disk offers (read-only: `VIRTIO_BLK_F_RO`, else `VIRTIO_BLK_F_FLUSH`).
pub(crate) fn offered_features(read_only: bool) -> u64 {
    let f = (1u64 << VIRTIO_BLK_F_SEG_MAX) | (1u64 << VIRTIO_BLK_F_BLK_SIZE);
    f | if read_only {
        1u64 << VIRTIO_BLK_F_RO
    } else {
        1u64 << VIRTIO_BLK_F_FLUSH
    }
}

/// The block device model.
pub struct Block {
    file: File,
    path: PathBuf,
    size: u64,
    disk: DiskInfo,
    id: [u8; ID_BYTES],
    config: [u8; 24],
}

impl Block {
    /// Open the image.
    pub fn new(cfg: &BlockConfig) -> Result<Self, VirtioError> {
        if cfg.id.len() > ID_BYTES {
            return Err(VirtioError::BlockIdTooLong(cfg.id.clone()));
        }
        let open_err = |source| VirtioError::DiskOpen {
            path: cfg.path.clone(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!cfg.read_only)
            .open(&cfg.path)
            .map_err(open_err)?;
        let size = file.metadata().map_err(open_err)?.len();
        let capacity_sectors = size / request::SECTOR_SIZE;
        let mut id = [0u8; ID_BYTES];
        id[..cfg.id.len()].copy_from_slice(cfg.id.as_bytes());
        let mut config = [0u8; 24];
        config[..8].copy_from_slice(&capacity_sectors.to_le_bytes());
        // size_max (8) unused; seg_max at 12; geometry at 16; blk_size at 20.
        config[12..16].copy_from_slice(&u32::from(QUEUE_SIZE - 2).to_le_bytes());
        config[20..24].copy_from_slice(&(request::SECTOR_SIZE as u32).to_le_bytes());
        Ok(Block {
            file,
            path: cfg.path.clone(),
            size,
            disk: DiskInfo {
                capacity_sectors,
                read_only: cfg.read_only,
            },
            id,
            config,
        })
    }
}

impl VirtioDevice for Block {
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Block(persist::BlockIdentity {
            path: self.path.clone(),
            size: self.size,
            read_only: self.disk.read_only,
        })
    }
    fn activate(&mut self, _acked: u64) -> Result<MakeHandler, VirtioError> {
        let file = self
            .file
            .try_clone()
            .map_err(VirtioError::os("disk file handle"))?;
        let (disk, id) = (self.disk, self.id);
        Ok(Box::new(move || Box::new(BlockHandler { file, disk, id })))
    }
}

struct BlockHandler {
    file: File,
    disk: DiskInfo,
    id: [u8; ID_BYTES],
}

impl BlockHandler {
    /// Run one chain; returns the number of bytes written into guest memory.
    /// A refused request or a failed operation counts as an error in `metrics`.
    fn process(&mut self, bufs: &[Buf], mem: &GuestMemoryMmap, metrics: &DeviceMetrics) -> u32 {
        let mut header = [0u8; HEADER_SIZE];
        if let Some(first) = bufs
            .first()
            .filter(|b| b.len as usize >= HEADER_SIZE && !b.write)
            && mem.read_slice(&mut header, first.addr).is_err()
        {
            return 0;
        }
        match parse_request(&header, bufs, self.disk) {
            Ok(req) => {
                let (st, written) = self.execute(&req, mem);
                if st != status::OK {
                    metrics.error();
                }
                write_status(mem, req.status, st);
                // Bytes written to the guest: data for reads/GET_ID, plus the status byte.
                u32::try_from(written).unwrap_or(u32::MAX).saturating_add(1)
            }
            Err(refused) => {
                metrics.error();
                match refused.status_buf {
                    Some(b) => {
                        write_status(mem, b, refused.status);
                        1
                    }
                    None => 0,
                }
            }
        }
    }

    fn execute(&mut self, req: &Request<'_>, mem: &GuestMemoryMmap) -> (u8, u64) {
        match req.op {
            Op::Read { offset } => match self.transfer(req.data, offset, mem, true) {
                Ok(()) => (status::OK, req.data_len),
                Err(e) => {
                    crate::warn_limited!(None, "virtio-blk: read failed: {e}");
                    (status::IOERR, 0)
                }
            },
            Op::Write { offset } => match self.transfer(req.data, offset, mem, false) {
                Ok(()) => (status::OK, 0),
                Err(e) => {
                    crate::warn_limited!(None, "virtio-blk: write failed: {e}");
                    (status::IOERR, 0)
                }
            },
            Op::Flush => {
                if self.disk.read_only {
                    return (status::OK, 0);
                }
                match self.file.sync_data() {
                    Ok(()) => (status::OK, 0),
                    Err(_) => (status::IOERR, 0),
                }
            }
            Op::GetId => {
                let mut written = 0u64;
                let mut id: &[u8] = &self.id;
                for b in req.data {
                    let n = (b.len as usize).min(id.len());
                    if n == 0 || mem.write_slice(&id[..n], b.addr).is_err() {
                        break;
                    }
                    id = &id[n..];
                    written += n as u64;
                }
                (status::OK, written)
            }
        }
    }

    /// Move `bufs` between guest memory and the file at `offset` (`to_guest` = read).
    fn transfer(
        &mut self,
        bufs: &[Buf],
        mut offset: u64,
        mem: &GuestMemoryMmap,
        to_guest: bool,
    ) -> Result<(), vm_memory::GuestMemoryError> {
        for b in bufs {
            if b.len == 0 {
                continue;
            }
            self.file
                .seek(SeekFrom::Start(offset))
                .map_err(vm_memory::GuestMemoryError::IOError)?;
            if to_guest {
                mem.read_exact_volatile_from(b.addr, &mut self.file, b.len as usize)?;
            } else {
                mem.write_all_volatile_to(b.addr, &mut self.file, b.len as usize)?;
            }
            offset += u64::from(b.len);
        }
        Ok(())
    }
}

fn write_status(mem: &GuestMemoryMmap, b: Buf, st: u8) {
    // The status byte is the last byte of the last buffer.
    let at = b.addr.0.checked_add(u64::from(b.len.saturating_sub(1)));
    if let Some(at) = at {
        let _ = mem.write_obj(st, GuestAddress(at));
    }
}

impl Handler for BlockHandler {
    fn queue_notify(&mut self, _index: usize, ctx: &mut Ctx<'_>) {
        ctx.serve_requests(0, "virtio-blk", |bufs, mem, m| self.process(bufs, mem, m));
    }
}
