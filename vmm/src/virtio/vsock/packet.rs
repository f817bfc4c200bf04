//! The virtio-vsock packet header (virtio 1.2 §5.10.6) and its validation: pure functions,
//! fuzzed by `fuzz/fuzz_targets/vsock_header.rs`.

/// Size of `struct virtio_vsock_hdr`.
pub const HDR_SIZE: usize = 44;
/// The host's CID.
pub const HOST_CID: u64 = 2;
/// Largest payload accepted in one packet from the guest (Linux sends at most 64 KiB).
pub const MAX_PAYLOAD: u32 = 64 * 1024;
/// `VIRTIO_VSOCK_TYPE_STREAM`.
pub const TYPE_STREAM: u16 = 1;

/// Operations (`VIRTIO_VSOCK_OP_*`).
pub mod op {
    /// Connect request.
    pub const REQUEST: u16 = 1;
    /// Connect accepted.
    pub const RESPONSE: u16 = 2;
    /// Reset / refuse.
    pub const RST: u16 = 3;
    /// Shutdown (flags say which direction).
    pub const SHUTDOWN: u16 = 4;
    /// Data.
    pub const RW: u16 = 5;
    /// Credit update.
    pub const CREDIT_UPDATE: u16 = 6;
    /// Credit request.
    pub const CREDIT_REQUEST: u16 = 7;
}

/// `VIRTIO_VSOCK_SHUTDOWN_RCV`: the sender will receive no more data.
pub const SHUTDOWN_RCV: u32 = 1;
/// `VIRTIO_VSOCK_SHUTDOWN_SEND`: the sender will send no more data.
pub const SHUTDOWN_SEND: u32 = 2;

/// A packet header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    /// Source CID.
    pub src_cid: u64,
    /// Destination CID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload length.
    pub len: u32,
    /// Socket type.
    pub kind: u16,
    /// Operation.
    pub op: u16,
    /// Op-specific flags.
    pub flags: u32,
    /// Sender's receive buffer size.
    pub buf_alloc: u32,
    /// Bytes the sender has consumed from its receive buffer.
    pub fwd_cnt: u32,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | (u64::from(le32(b, at + 4)) << 32)
}

impl Header {
    /// Parse a header; `None` if fewer than [`HDR_SIZE`] bytes.
    pub fn parse(bytes: &[u8]) -> Option<Header> {
        let b = bytes.get(..HDR_SIZE)?;
        Some(Header {
            src_cid: le64(b, 0),
            dst_cid: le64(b, 8),
            src_port: le32(b, 16),
            dst_port: le32(b, 20),
            len: le32(b, 24),
            kind: u16::from_le_bytes([b[28], b[29]]),
            op: u16::from_le_bytes([b[30], b[31]]),
            flags: le32(b, 32),
            buf_alloc: le32(b, 36),
            fwd_cnt: le32(b, 40),
        })
    }

    /// Serialize.
    pub fn to_bytes(&self) -> [u8; HDR_SIZE] {
        let mut b = [0u8; HDR_SIZE];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.kind.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

/// Why a packet from the guest is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Fewer than 44 header bytes in the chain.
    #[error("short vsock header")]
    Short,
    /// Source CID is not the guest's, or destination is not the host.
    #[error("bad vsock address")]
    Address,
    /// Not a stream packet.
    #[error("unsupported vsock socket type")]
    Type,
    /// Unknown operation.
    #[error("unknown vsock op")]
    Op,
    /// Payload over [`MAX_PAYLOAD`], on a non-RW packet, or longer than the chain.
    #[error("bad vsock payload length")]
    Length,
}

/// Validate a header the guest sent in a TX chain carrying `chain_payload` bytes after it.
/// On `Err(Type | Op | Length)` the caller answers RST; on `Short`/`Address` it drops the packet.
pub fn validate_tx(hdr: &Header, guest_cid: u64, chain_payload: u64) -> Result<(), PacketError> {
    if hdr.src_cid != guest_cid || hdr.dst_cid != HOST_CID {
        return Err(PacketError::Address);
    }
    if hdr.kind != TYPE_STREAM {
        return Err(PacketError::Type);
    }
    if !(op::REQUEST..=op::CREDIT_REQUEST).contains(&hdr.op) {
        return Err(PacketError::Op);
    }
    let len_ok = if hdr.op == op::RW {
        hdr.len <= MAX_PAYLOAD && u64::from(hdr.len) <= chain_payload
    } else {
        hdr.len == 0
    };
    if !len_ok {
        return Err(PacketError::Length);
    }
    Ok(())
}

/// Parse and validate the header bytes of a TX chain (for the fuzzer and the device).
pub fn parse_tx(bytes: &[u8], guest_cid: u64, chain_payload: u64) -> Result<Header, PacketError> {
    let hdr = Header::parse(bytes).ok_or(PacketError::Short)?;
    validate_tx(&hdr, guest_cid, chain_payload)?;
    Ok(hdr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(len: u32) -> Header {
        Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port: 5,
            dst_port: 6,
            len,
            kind: TYPE_STREAM,
            op: op::RW,
            ..Default::default()
        }
    }

    #[test]
    fn round_trip() {
        let h = Header {
            flags: 3,
            buf_alloc: 9,
            fwd_cnt: 10,
            ..rw(7)
        };
        assert_eq!(Header::parse(&h.to_bytes()), Some(h));
        assert_eq!(Header::parse(&h.to_bytes()[..43]), None);
    }

    #[test]
    fn validation() {
        assert_eq!(validate_tx(&rw(10), 3, 10), Ok(()));
        assert_eq!(validate_tx(&rw(11), 3, 10), Err(PacketError::Length));
        assert_eq!(
            validate_tx(&rw(MAX_PAYLOAD + 1), 3, u64::MAX),
            Err(PacketError::Length)
        );
        assert_eq!(validate_tx(&rw(1), 4, 10), Err(PacketError::Address));
        assert_eq!(
            validate_tx(&Header { kind: 2, ..rw(0) }, 3, 0),
            Err(PacketError::Type)
        );
        assert_eq!(
            validate_tx(&Header { op: 9, ..rw(0) }, 3, 0),
            Err(PacketError::Op)
        );
        assert_eq!(
            validate_tx(
                &Header {
                    op: op::REQUEST,
                    ..rw(4)
                },
                3,
                4
            ),
            Err(PacketError::Length)
        );
    }
}
