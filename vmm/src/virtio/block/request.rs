//! Pure parsing and validation of virtio-blk requests (no I/O): a request's header bytes plus
//! the shape of its descriptor chain become a [`Request`] the device can execute, or the status
//! to answer with. Fuzzed by `fuzz/fuzz_targets/block_request.rs`.

use crate::virtio::queue::Buf;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID,
    VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};

/// Sector size in bytes.
pub const SECTOR_SIZE: u64 = 512;
/// Size of the request header (`type`, `reserved`, `sector`).
pub const HEADER_SIZE: usize = 16;
/// Length of the device id answered to GET_ID (`VIRTIO_BLK_ID_BYTES`).
pub const ID_BYTES: usize = VIRTIO_BLK_ID_BYTES as usize;

/// Status bytes: the `VIRTIO_BLK_S_*` values as the one byte the device writes.
pub mod status {
    use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP};
    /// Success.
    pub const OK: u8 = VIRTIO_BLK_S_OK as u8;
    /// I/O error (also every refused request).
    pub const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
    /// Unsupported request.
    pub const UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;
}

/// A parsed request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// `VIRTIO_BLK_T_*`.
    pub kind: u32,
    /// Starting sector.
    pub sector: u64,
}

/// Parse a request header; `None` if fewer than [`HEADER_SIZE`] bytes.
pub fn parse_header(bytes: &[u8]) -> Option<Header> {
    let b: &[u8; HEADER_SIZE] = bytes.get(..HEADER_SIZE)?.try_into().ok()?;
    let kind = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let sector = u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
    Some(Header { kind, sector })
}

/// What the device must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read `len` bytes at byte `offset` into the data buffers.
    Read {
        /// Byte offset in the image.
        offset: u64,
    },
    /// Write the data buffers at byte `offset`.
    Write {
        /// Byte offset in the image.
        offset: u64,
    },
    /// Flush the image.
    Flush,
    /// Answer the device id.
    GetId,
}

/// A validated request: what to do, its data buffers and where the status byte goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The operation.
    pub op: Op,
    /// Data buffers (all device-writable for reads and GET_ID, all readable for writes).
    pub data: &'a [Buf],
    /// Total data length.
    pub data_len: u64,
    /// The status buffer.
    pub status: Buf,
}

/// A request that cannot run: answer `status` in `status_buf` (if the chain has one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The status to write.
    pub status: u8,
    /// The buffer to write it into, when the chain ends in a writable one.
    pub status_buf: Option<Buf>,
}

/// Everything that decides a request besides the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskInfo {
    /// Disk size in sectors.
    pub capacity_sectors: u64,
    /// Read-only disk.
    pub read_only: bool,
}

/// Validate a request given its header bytes (read from `bufs[0]`) and its chain.
pub fn parse_request<'a>(
    header: &[u8],
    bufs: &'a [Buf],
    disk: DiskInfo,
) -> Result<Request<'a>, Refused> {
    let status_buf = bufs
        .last()
        .filter(|b| b.write && b.len >= 1 && bufs.len() >= 2)
        .copied();
    let refuse = |status| Refused { status, status_buf };
    let Some(status) = status_buf else {
        return Err(refuse(status::IOERR));
    };
    let first = bufs[0];
    if first.write || (first.len as usize) < HEADER_SIZE {
        return Err(refuse(status::IOERR));
    }
    let hdr = parse_header(header).ok_or(refuse(status::IOERR))?;
    let data = &bufs[1..bufs.len() - 1];
    let data_len: u64 = data.iter().map(|b| u64::from(b.len)).sum();
    let all_write = data.iter().all(|b| b.write);
    let all_read = data.iter().all(|b| !b.write);
    let in_range = |offset: u64| {
        offset
            .checked_add(data_len)
            .is_some_and(|end| end <= disk.capacity_sectors.saturating_mul(SECTOR_SIZE))
    };
    let offset = hdr.sector.checked_mul(SECTOR_SIZE);
    let op = match hdr.kind {
        VIRTIO_BLK_T_IN => {
            let offset = offset
                .filter(|&o| in_range(o))
                .ok_or(refuse(status::IOERR))?;
            if !all_write || !data_len.is_multiple_of(SECTOR_SIZE) {
                return Err(refuse(status::IOERR));
            }
            Op::Read { offset }
        }
        VIRTIO_BLK_T_OUT => {
            if disk.read_only {
                return Err(refuse(status::IOERR));
            }
            let offset = offset
                .filter(|&o| in_range(o))
                .ok_or(refuse(status::IOERR))?;
            if !all_read || !data_len.is_multiple_of(SECTOR_SIZE) {
                return Err(refuse(status::IOERR));
            }
            Op::Write { offset }
        }
        VIRTIO_BLK_T_FLUSH => {
            // A flush carries no data; one that does is refused (never treated as a write).
            if !data.is_empty() {
                return Err(refuse(status::IOERR));
            }
            Op::Flush
        }
        VIRTIO_BLK_T_GET_ID => {
            if data.is_empty() || !all_write {
                return Err(refuse(status::IOERR));
            }
            Op::GetId
        }
        VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES if disk.read_only => {
            return Err(refuse(status::IOERR));
        }
        _ => return Err(refuse(status::UNSUPP)),
    };
    Ok(Request {
        op,
        data,
        data_len,
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    fn buf(len: u32, write: bool) -> Buf {
        Buf {
            addr: GuestAddress(0x1000),
            len,
            write,
        }
    }
    fn hdr(kind: u32, sector: u64) -> [u8; 16] {
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&kind.to_le_bytes());
        h[8..].copy_from_slice(&sector.to_le_bytes());
        h
    }
    const DISK: DiskInfo = DiskInfo {
        capacity_sectors: 8,
        read_only: true,
    };

    #[test]
    fn read_inside_disk_is_accepted() {
        let bufs = [buf(16, false), buf(1024, true), buf(1, true)];
        let r = parse_request(&hdr(VIRTIO_BLK_T_IN, 6), &bufs, DISK).unwrap();
        assert_eq!(r.op, Op::Read { offset: 3072 });
        assert_eq!(r.data_len, 1024);
    }

    #[test]
    fn read_past_end_and_overflowing_sector_are_ioerr() {
        let bufs = [buf(16, false), buf(1024, true), buf(1, true)];
        assert_eq!(
            parse_request(&hdr(VIRTIO_BLK_T_IN, 7), &bufs, DISK)
                .unwrap_err()
                .status,
            status::IOERR
        );
        assert_eq!(
            parse_request(&hdr(VIRTIO_BLK_T_IN, u64::MAX / 256), &bufs, DISK)
                .unwrap_err()
                .status,
            status::IOERR
        );
    }

    #[test]
    fn writes_on_read_only_disk_are_ioerr() {
        let bufs = [buf(16, false), buf(512, false), buf(1, true)];
        for kind in [
            VIRTIO_BLK_T_OUT,
            VIRTIO_BLK_T_DISCARD,
            VIRTIO_BLK_T_WRITE_ZEROES,
            VIRTIO_BLK_T_FLUSH,
        ] {
            let e = parse_request(&hdr(kind, 0), &bufs, DISK).unwrap_err();
            assert_eq!(e.status, status::IOERR, "kind {kind}");
        }
    }

    #[test]
    fn chain_without_status_buffer_is_refused_without_target() {
        let bufs = [buf(16, false)];
        assert_eq!(
            parse_request(&hdr(VIRTIO_BLK_T_IN, 0), &bufs, DISK)
                .unwrap_err()
                .status_buf,
            None
        );
    }
}
