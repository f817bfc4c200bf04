//! The request decoder: one FUSE request's bytes (as the guest put them in the readable
//! descriptors, already copied out and bounded by the transport) into an [`Op`].
//!
//! Hostile input is the normal case here. Every field is read through [`Reader`], so a short
//! request is [`DecodeError::Truncated`], never a panic; names must be 1..=255 bytes, NUL
//! terminated, without `/` and not `.` or `..`; counted arrays (`BATCH_FORGET`,
//! `REMOVEMAPPING`) are borrowed slices checked against the bytes actually present, so a count
//! of 2^32 allocates nothing. Sizes the guest asks for (`READ`, `READDIR`, xattr buffers) are
//! returned as sent: the server clamps them to its limits and to the room the guest gave for
//! the reply. Decoding is pure (no system call, no allocation) and fuzzed (`fuzz/`).

use crate::abi::{self, InHeader, NAME_MAX, PAIR_LEN, Reader, opcode};

/// A decoded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The header.
    pub header: InHeader,
    /// The operation and its arguments.
    pub op: Op<'a>,
}

/// Pairs of `u64`s borrowed from the request (`fuse_forget_one`, `fuse_removemapping_one`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pairs<'a>(&'a [u8]);

impl<'a> Pairs<'a> {
    /// How many pairs.
    pub fn len(&self) -> usize {
        self.0.len() / PAIR_LEN
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        self.0.chunks_exact(PAIR_LEN).map(|c| {
            let mut r = Reader::new(c);
            (r.u64().unwrap_or(0), r.u64().unwrap_or(0))
        })
    }
}

/// What the guest asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Op<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
    },
    Destroy,
    Lookup {
        name: &'a [u8],
    },
    Forget {
        nlookup: u64,
    },
    BatchForget {
        items: Pairs<'a>,
    },
    Getattr {
        fh: Option<u64>,
    },
    Readlink,
    Open {
        flags: u32,
    },
    Opendir {
        flags: u32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
        plus: bool,
    },
    Release {
        fh: u64,
    },
    Releasedir {
        fh: u64,
    },
    Flush {
        fh: u64,
    },
    Statfs,
    Getxattr {
        size: u32,
        name: &'a [u8],
    },
    Listxattr {
        size: u32,
    },
    Access {
        mask: u32,
    },
    Lseek {
        fh: u64,
        offset: u64,
        whence: u32,
    },
    SetupMapping {
        /// Linux always sends -1: the file is the header's node id.
        fh: u64,
        foffset: u64,
        len: u64,
        flags: u64,
        moffset: u64,
    },
    RemoveMapping {
        items: Pairs<'a>,
    },
    /// An opcode that would change something: `EROFS`.
    WriteLike(u32),
    /// An opcode not served (`FSYNC`, locks, `IOCTL`, unknown ones): `ENOSYS`.
    Unsupported(u32),
}

/// Why a request could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than a `fuse_in_header`: there is no request id to answer.
    #[error("request shorter than its header ({0} bytes)")]
    NoHeader(usize),
    /// The header's length is not the request's, or its arguments are cut short.
    #[error("opcode {}: truncated or mis-sized request", .0.opcode)]
    Truncated(InHeader),
    /// A name that is empty, too long, not NUL-terminated, `.`/`..` or holds a `/`.
    #[error("opcode {}: invalid name", .0.opcode)]
    BadName(InHeader),
}

impl DecodeError {
    /// The header to answer, when there is one.
    pub fn header(&self) -> Option<&InHeader> {
        match self {
            DecodeError::NoHeader(_) => None,
            DecodeError::Truncated(h) | DecodeError::BadName(h) => Some(h),
        }
    }
}

/// A NUL-terminated path component: 1..=255 bytes before the first NUL, no `/`, not `.`/`..`.
fn name(h: InHeader, bytes: &[u8], allow_slash: bool) -> Result<&[u8], DecodeError> {
    let end = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or(DecodeError::BadName(h))?;
    let n = &bytes[..end];
    let ok = !n.is_empty()
        && n.len() <= NAME_MAX
        && (allow_slash || !n.contains(&b'/'))
        && n != b"."
        && n != b"..";
    if ok {
        Ok(n)
    } else {
        Err(DecodeError::BadName(h))
    }
}

/// `count` pairs from what follows, which must hold at least that many.
fn pairs<'a>(h: InHeader, r: &mut Reader<'a>, count: u32) -> Result<Pairs<'a>, DecodeError> {
    let t = DecodeError::Truncated(h);
    let n = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(PAIR_LEN))
        .ok_or(t)?;
    r.bytes(n).map(Pairs).ok_or(t)
}

/// Decodes one request. `total` is how many readable bytes the guest gave (the transport may
/// have copied fewer into `buf`, at most its bound): the header's `len` must equal it.
pub fn decode(buf: &[u8], total: usize) -> Result<Request<'_>, DecodeError> {
    let mut r = Reader::new(buf);
    let header = InHeader::read(&mut r).ok_or(DecodeError::NoHeader(buf.len()))?;
    let t = DecodeError::Truncated(header);
    if usize::try_from(header.len).ok() != Some(total) {
        return Err(t);
    }
    let op = decode_op(header, &mut r).ok_or(t)??;
    Ok(Request { header, op })
}

/// The operation; `None` when an argument is cut short.
fn decode_op<'a>(h: InHeader, r: &mut Reader<'a>) -> Option<Result<Op<'a>, DecodeError>> {
    use opcode::*;
    let op = match h.opcode {
        INIT => {
            let (major, minor, max_readahead, flags) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
            let mut flags = u64::from(flags);
            // flags2 follows from minor 36 on, when the guest says so.
            if flags & abi::init::INIT_EXT != 0
                && let Some(f2) = r.u32()
            {
                flags |= u64::from(f2) << 32;
            }
            Op::Init {
                major,
                minor,
                max_readahead,
                flags,
            }
        }
        DESTROY => Op::Destroy,
        LOOKUP => match name(h, r.rest(), false) {
            Ok(name) => Op::Lookup { name },
            Err(e) => return Some(Err(e)),
        },
        FORGET => Op::Forget { nlookup: r.u64()? },
        BATCH_FORGET => {
            let count = r.u32()?;
            r.u32()?;
            match pairs(h, r, count) {
                Ok(items) => Op::BatchForget { items },
                Err(e) => return Some(Err(e)),
            }
        }
        GETATTR => {
            let (flags, _, fh) = (r.u32()?, r.u32()?, r.u64()?);
            // FUSE_GETATTR_FH
            Op::Getattr {
                fh: (flags & 1 != 0).then_some(fh),
            }
        }
        READLINK => Op::Readlink,
        OPEN | OPENDIR => {
            let (flags, _) = (r.u32()?, r.u32()?);
            if h.opcode == OPEN {
                Op::Open { flags }
            } else {
                Op::Opendir { flags }
            }
        }
        READ | READDIR | READDIRPLUS => {
            let (fh, offset, size) = (r.u64()?, r.u64()?, r.u32()?);
            // read_flags, lock_owner, flags, padding: not used.
            r.bytes(20)?;
            if h.opcode == READ {
                Op::Read { fh, offset, size }
            } else {
                Op::Readdir {
                    fh,
                    offset,
                    size,
                    plus: h.opcode == READDIRPLUS,
                }
            }
        }
        RELEASE | RELEASEDIR => {
            let fh = r.u64()?;
            r.bytes(16)?;
            if h.opcode == RELEASE {
                Op::Release { fh }
            } else {
                Op::Releasedir { fh }
            }
        }
        FLUSH => {
            let fh = r.u64()?;
            r.bytes(16)?;
            Op::Flush { fh }
        }
        STATFS => Op::Statfs,
        GETXATTR => {
            let (size, _) = (r.u32()?, r.u32()?);
            match name(h, r.rest(), true) {
                Ok(name) => Op::Getxattr { size, name },
                Err(e) => return Some(Err(e)),
            }
        }
        LISTXATTR => {
            let (size, _) = (r.u32()?, r.u32()?);
            Op::Listxattr { size }
        }
        ACCESS => {
            let (mask, _) = (r.u32()?, r.u32()?);
            Op::Access { mask }
        }
        LSEEK => {
            let (fh, offset, whence, _) = (r.u64()?, r.u64()?, r.u32()?, r.u32()?);
            Op::Lseek { fh, offset, whence }
        }
        SETUPMAPPING => Op::SetupMapping {
            fh: r.u64()?,
            foffset: r.u64()?,
            len: r.u64()?,
            flags: r.u64()?,
            moffset: r.u64()?,
        },
        REMOVEMAPPING => {
            let count = r.u32()?;
            match pairs(h, r, count) {
                Ok(items) => Op::RemoveMapping { items },
                Err(e) => return Some(Err(e)),
            }
        }
        o if WRITE_LIKE.contains(&o) => Op::WriteLike(o),
        o => Op::Unsupported(o),
    };
    Some(Ok(op))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{put_u32, put_u64};

    /// A request: header (with the right length) + body.
    fn req(opcode: u32, nodeid: u64, body: &[u8]) -> Vec<u8> {
        InHeader {
            opcode,
            unique: 7,
            nodeid,
            ..InHeader::default()
        }
        .request(body)
    }

    fn dec(v: &[u8]) -> Result<Request<'_>, DecodeError> {
        decode(v, v.len())
    }

    #[test]
    fn lookup_names_are_checked() {
        let ok = req(opcode::LOOKUP, 1, b"model.gguf\0");
        assert_eq!(
            dec(&ok).unwrap().op,
            Op::Lookup {
                name: b"model.gguf"
            }
        );
        for bad in [
            &b"\0"[..],
            b"..\0",
            b".\0",
            b"a/b\0",
            b"no-nul",
            &[b'x'; 256][..],
        ] {
            let mut body = bad.to_vec();
            if bad.len() == 256 {
                body.push(0);
            }
            let v = req(opcode::LOOKUP, 1, &body);
            assert!(matches!(dec(&v), Err(DecodeError::BadName(_))), "{bad:?}");
        }
        // 255 bytes is the most a name may have.
        let mut body = vec![b'x'; 255];
        body.push(0);
        assert!(dec(&req(opcode::LOOKUP, 1, &body)).is_ok());
    }

    #[test]
    fn the_header_length_must_be_what_the_guest_gave() {
        let v = req(opcode::STATFS, 1, &[]);
        assert!(matches!(
            decode(&v, v.len() + 1),
            Err(DecodeError::Truncated(_))
        ));
        assert_eq!(decode(&v[..10], 10), Err(DecodeError::NoHeader(10)));
    }

    #[test]
    fn counted_arrays_never_outgrow_the_request() {
        let mut body = Vec::new();
        put_u32(&mut body, u32::MAX);
        put_u32(&mut body, 0);
        put_u64(&mut body, 5);
        put_u64(&mut body, 1);
        let v = req(opcode::BATCH_FORGET, 0, &body);
        assert!(matches!(dec(&v), Err(DecodeError::Truncated(_))));
        body[..4].copy_from_slice(&1u32.to_le_bytes());
        let v = req(opcode::BATCH_FORGET, 0, &body);
        match dec(&v).unwrap().op {
            Op::BatchForget { items } => {
                assert_eq!(items.iter().collect::<Vec<_>>(), vec![(5, 1)]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn write_like_and_unknown_opcodes_are_classified() {
        for o in opcode::WRITE_LIKE {
            let v = req(o, 1, &[0u8; 64]);
            assert_eq!(dec(&v).unwrap().op, Op::WriteLike(o));
        }
        for o in [opcode::FSYNC, opcode::INTERRUPT, 4095, u32::MAX] {
            let v = req(o, 1, &[]);
            assert_eq!(dec(&v).unwrap().op, Op::Unsupported(o));
        }
    }

    #[test]
    fn short_arguments_are_truncated_never_a_panic() {
        for o in [
            opcode::INIT,
            opcode::READ,
            opcode::READDIRPLUS,
            opcode::GETATTR,
            opcode::SETUPMAPPING,
            opcode::RELEASE,
            opcode::FORGET,
            opcode::LSEEK,
        ] {
            let v = req(o, 1, &[0u8; 3]);
            assert!(matches!(dec(&v), Err(DecodeError::Truncated(_))), "{o}");
        }
    }
}
