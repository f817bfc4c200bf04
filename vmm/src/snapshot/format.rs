//! The state file's format: a 20-byte header, the postcard payload, a SHA-256 digest.
//!
//! ```text
//! offset  size  field
//! 0       8     magic  b"VMSNAPST"
//! 8       4     format version, u32 little endian (FORMAT_VERSION)
//! 12      8     payload length, u64 little endian
//! 20      n     payload: the postcard encoding of `VmState`
//! 20+n    32    SHA-256 of bytes 0..20+n
//! ```
//!
//! [`decode`] treats the bytes as hostile. It checks, in this order, each failure its own
//! [`StateError`] variant: the whole file's size against [`MAX_STATE_BYTES`] (before
//! reading it, in [`read_state_file`]), a header at all, the magic, the version (a
//! different version may frame or checksum differently, so it is refused before
//! anything else is read), the payload length against the bytes present (shorter:
//! truncated; longer: trailing bytes), the digest, the payload's own decoding (with no
//! bytes left over) and finally [`VmState::validate`]. So a byte flipped in the header
//! is refused by the header check it breaks, and one flipped anywhere after it by the
//! digest. No length read from the file sizes an allocation: the payload length is
//! compared with the bytes already read, and postcard's sequences are bounded by the
//! (at most [`MAX_STATE_BYTES`]) input.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::state::{InvalidState, VmState};

/// The first eight bytes of every state file.
pub const MAGIC: [u8; 8] = *b"VMSNAPST";
/// The format version this VMM writes and reads.
/// 2: the virtio devices' state (`VmState::devices`); 3: a virtio-fs device's FUSE session
/// (`DeviceState::fs`).
pub const FORMAT_VERSION: u32 = 3;
/// Magic, version and payload length.
pub const HEADER_BYTES: usize = 20;
/// The SHA-256 digest closing the file.
pub const DIGEST_BYTES: usize = 32;
/// The largest state file accepted (a 32-vCPU state is about 200 KiB).
pub const MAX_STATE_BYTES: u64 = 16 << 20;

/// Why a state file is refused.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file could not be read.
    #[error("cannot read state file {path}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Larger than [`MAX_STATE_BYTES`].
    #[error("state file of {0} bytes is over the {MAX_STATE_BYTES}-byte limit")]
    TooLarge(u64),
    /// Fewer bytes than the header (and digest), or than the header's payload length says.
    #[error("state file truncated: {len} bytes, {needed} needed")]
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes the header (or the minimum frame) needs.
        needed: u64,
    },
    /// Not a state file.
    #[error("not a state file: magic {0:02x?}")]
    BadMagic([u8; 8]),
    /// Written by another format version.
    #[error("state format version {found}, this VMM reads {FORMAT_VERSION}")]
    Version {
        /// The file's version.
        found: u32,
    },
    /// More bytes than the header's payload length and the digest account for.
    #[error("{0} trailing bytes after the state")]
    TrailingBytes(u64),
    /// The digest does not match the bytes before it.
    #[error("state file checksum mismatch")]
    Checksum,
    /// The payload does not decode.
    #[error("state payload does not decode")]
    Payload(#[source] postcard::Error),
    /// The payload decodes with bytes left inside it.
    #[error("{0} bytes left over inside the state payload")]
    TrailingPayload(usize),
    /// The payload could not be encoded.
    #[error("cannot encode the state")]
    Encode(#[source] postcard::Error),
    /// A decoded state this VMM cannot restore.
    #[error("invalid state")]
    Invalid(#[source] InvalidState),
}

/// The state file's bytes for `state`.
pub fn encode(state: &VmState) -> Result<Vec<u8>, StateError> {
    encode_with_version(state, FORMAT_VERSION)
}

/// [`encode`] with another version in the header (tests of the version check).
pub fn encode_with_version(state: &VmState, version: u32) -> Result<Vec<u8>, StateError> {
    let payload = postcard::to_stdvec(state).map_err(StateError::Encode)?;
    Ok(frame(&payload, version))
}

/// A state file around any `payload`: header, payload, digest (also how the fuzz target
/// reaches the payload decoder behind the checksum).
pub fn frame(payload: &[u8], version: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len() + DIGEST_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

fn array<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = bytes.get(at..at + N) {
        a.copy_from_slice(s);
    }
    a
}

/// Decode and validate a state file's bytes (see the module docs for the order of checks).
pub fn decode(bytes: &[u8]) -> Result<VmState, StateError> {
    let len = bytes.len();
    if len as u64 > MAX_STATE_BYTES {
        return Err(StateError::TooLarge(len as u64));
    }
    if len < HEADER_BYTES {
        return Err(StateError::Truncated {
            len,
            needed: (HEADER_BYTES + DIGEST_BYTES) as u64,
        });
    }
    let magic: [u8; 8] = array(bytes, 0);
    if magic != MAGIC {
        return Err(StateError::BadMagic(magic));
    }
    let version = u32::from_le_bytes(array(bytes, 8));
    if version != FORMAT_VERSION {
        return Err(StateError::Version { found: version });
    }
    let payload_len = u64::from_le_bytes(array(bytes, 12));
    // Saturating: the field is hostile and may be near u64::MAX.
    let needed = payload_len.saturating_add((HEADER_BYTES + DIGEST_BYTES) as u64);
    if (len as u64) < needed {
        return Err(StateError::Truncated { len, needed });
    }
    if (len as u64) > needed {
        return Err(StateError::TrailingBytes(len as u64 - needed));
    }
    // `needed == len` here, so these offsets are in bounds.
    let body_end = len - DIGEST_BYTES;
    let (body, digest) = bytes.split_at(body_end);
    if Sha256::digest(body).as_slice() != digest {
        return Err(StateError::Checksum);
    }
    let payload = &body[HEADER_BYTES..];
    let (state, rest): (VmState, &[u8]) =
        postcard::take_from_bytes(payload).map_err(StateError::Payload)?;
    if !rest.is_empty() {
        return Err(StateError::TrailingPayload(rest.len()));
    }
    state.validate().map_err(StateError::Invalid)?;
    Ok(state)
}

/// Read the state file at `path` ([`read_bounded`]), then [`decode`] it.
pub fn read_state_file(path: &Path) -> Result<VmState, StateError> {
    let file = std::fs::File::open(path).map_err(|source| StateError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    decode(&read_bounded(file, path)?)
}

/// The bytes of the state file `file` (at `path`, for messages), refused over
/// [`MAX_STATE_BYTES`] before reading (and read to at most one byte more, should it grow
/// meanwhile).
pub fn read_bounded(file: std::fs::File, path: &Path) -> Result<Vec<u8>, StateError> {
    let read_err = |source| StateError::Read {
        path: path.to_path_buf(),
        source,
    };
    let size = file.metadata().map_err(read_err)?.len();
    if size > MAX_STATE_BYTES {
        return Err(StateError::TooLarge(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(MAX_STATE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_STATE_BYTES {
        return Err(StateError::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::super::state::tests::sample;
    use super::*;

    fn file() -> Vec<u8> {
        encode(&sample(2, 16)).unwrap()
    }

    #[test]
    fn round_trip_keeps_every_byte() {
        let bytes = file();
        assert_eq!(&bytes[..8], b"VMSNAPST");
        let back = decode(&bytes).unwrap();
        assert_eq!(back.config, sample(2, 16).config);
        assert_eq!(back.vcpus[1].regs.rip, 0x10_0001);
        assert_eq!(back.vcpus[0].xsave.as_ref().unwrap().region[0], 0x37f);
        assert_eq!(back.vcpus[1].lapic.regs[0x20], 1);
        assert_eq!(back.vm.ioapic.chip_id, 2);
        assert_eq!(back.vm.clock.clock, 123_456_789);
        // Every field survives: encoding the decoded state gives the same bytes.
        assert_eq!(encode(&back).unwrap(), bytes);
    }

    #[test]
    fn every_flipped_byte_is_refused_by_the_check_it_breaks() {
        let bytes = file();
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x01;
            let err = decode(&b).expect_err("a flipped byte must be refused");
            let ok = match at {
                0..8 => matches!(err, StateError::BadMagic(_)),
                8..12 => matches!(err, StateError::Version { .. }),
                // The payload length: the file now looks truncated or too long.
                12..20 => matches!(
                    err,
                    StateError::Truncated { .. } | StateError::TrailingBytes(_)
                ),
                _ => matches!(err, StateError::Checksum),
            };
            assert!(ok, "byte {at} flipped: {err:?}");
        }
    }

    #[test]
    fn another_version_is_refused() {
        let b = encode_with_version(&sample(1, 16), 1).unwrap();
        assert!(matches!(decode(&b), Err(StateError::Version { found: 1 })));
    }

    #[test]
    fn every_truncation_is_refused_as_truncated() {
        let bytes = file();
        for len in 0..bytes.len() {
            let err = decode(&bytes[..len]).expect_err("truncated");
            assert!(
                matches!(err, StateError::Truncated { len: l, .. } if l == len),
                "truncated to {len}: {err:?}"
            );
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut b = file();
        b.extend_from_slice(&[0, 0, 0]);
        assert!(matches!(decode(&b), Err(StateError::TrailingBytes(3))));
    }

    #[test]
    fn huge_length_field_is_truncated_not_allocated() {
        let mut b = file();
        b[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode(&b),
            Err(StateError::Truncated {
                needed: u64::MAX,
                ..
            })
        ));
        b[12..20].copy_from_slice(&(u64::MAX - 40).to_le_bytes());
        assert!(matches!(decode(&b), Err(StateError::Truncated { .. })));
    }

    /// A crafted, well-checksummed file around `payload`.
    fn framed(payload: &[u8]) -> Vec<u8> {
        frame(payload, FORMAT_VERSION)
    }

    #[test]
    fn well_checksummed_but_bad_payloads_are_refused() {
        let payload = postcard::to_stdvec(&sample(1, 16)).unwrap();
        // Cut short inside the payload.
        let short = framed(&payload[..payload.len() / 2]);
        assert!(matches!(decode(&short), Err(StateError::Payload(_))));
        // Extra bytes inside the payload.
        let mut long = payload.clone();
        long.push(0);
        assert!(matches!(
            decode(&framed(&long)),
            Err(StateError::TrailingPayload(1))
        ));
        // A sequence length far larger than the input: an error, no huge allocation.
        let huge = framed(&[0x01, 0x10, 0x00, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(decode(&huge), Err(StateError::Payload(_))));
        // Valid encoding, invalid state: each semantic check has its own variant.
        let mut s = sample(1, 16);
        s.config.vcpus = 0;
        let b = framed(&postcard::to_stdvec(&s).unwrap());
        assert!(matches!(
            decode(&b),
            Err(StateError::Invalid(InvalidState::VcpuCount(0)))
        ));
        let mut s = sample(1, 16);
        s.regions[0].size *= 2;
        let b = framed(&postcard::to_stdvec(&s).unwrap());
        assert!(matches!(
            decode(&b),
            Err(StateError::Invalid(
                InvalidState::RegionsOutsideLayout { .. }
            ))
        ));
    }

    /// The fuzz target's seeds (fuzz/seeds/make-seeds.py writes them by hand from the
    /// format's description; `payload-*` are bare payloads the target frames): each is
    /// decoded as its name says, so a format change that would leave the fuzzer starting
    /// from stale shapes fails here.
    #[test]
    fn committed_fuzz_seeds_decode_as_named() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/snapshot_state");
        let seed = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let one = decode(&seed("valid-1vcpu")).unwrap();
        assert_eq!(one.vcpus[0].regs.rip, 0x10_0000);
        assert_eq!(one.vcpus[0].msrs.len(), 3);
        assert_eq!(one.vm.pic_slave.chip_id, 1);
        let two = decode(&seed("valid-2vcpus-no-xsave")).unwrap();
        assert!(two.vcpus[1].xsave.is_none() && two.vcpus[1].regs.rip == 0x10_0001);
        let payload = decode(&frame(&seed("payload-valid-2vcpus"), FORMAT_VERSION)).unwrap();
        assert_eq!(payload.vcpus.len(), 2);
        let devices = decode(&seed("valid-devices")).unwrap().devices;
        assert_eq!(devices.len(), 3);
        assert_eq!(devices[0].queues[0].next_used, 7);
        assert!(matches!(
            &devices[1].kind,
            crate::virtio::persist::DeviceKind::Block(b) if b.size == 1048576 && b.read_only
        ));
        assert_eq!(devices[2].queues.len(), 3);
        let err = |name: &str| decode(&seed(name)).unwrap_err();
        assert!(matches!(err("bad-magic"), StateError::BadMagic(_)));
        assert!(matches!(err("version-1"), StateError::Version { found: 1 }));
        assert!(matches!(err("huge-length"), StateError::Truncated { .. }));
        assert!(matches!(err("truncated"), StateError::Truncated { .. }));
        assert!(matches!(
            err("short-header"),
            StateError::Truncated { len: 19, .. }
        ));
        assert!(matches!(
            err("trailing-bytes"),
            StateError::TrailingBytes(3)
        ));
        assert!(matches!(err("checksum-flipped"), StateError::Checksum));
        assert!(matches!(err("huge-sequence"), StateError::Payload(_)));
        let invalid = |name: &str| match err(name) {
            StateError::Invalid(e) => e,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(invalid("zero-vcpus"), InvalidState::VcpuCount(0));
        assert!(matches!(
            invalid("vcpu-count-mismatch"),
            InvalidState::VcpuStates { .. }
        ));
        assert!(matches!(
            invalid("regions-overlap"),
            InvalidState::RegionOverlap { index: 1, .. }
        ));
        assert!(matches!(
            invalid("region-outside-layout"),
            InvalidState::RegionsOutsideLayout { mem_mib: 16 }
        ));
        use crate::virtio::persist::InvalidDevice as D;
        let device = |name: &str| match invalid(name) {
            InvalidState::Device(d) => d,
            other => panic!("{name}: {other:?}"),
        };
        assert!(matches!(
            device("device-queue-size"),
            D::QueueSize { size: 512, .. }
        ));
        assert!(matches!(
            device("device-queue-address"),
            D::QueueAddress { ring: "used", .. }
        ));
        assert!(matches!(device("device-features"), D::Features { .. }));
        assert!(matches!(
            device("device-queue-count"),
            D::QueueCount { found: 2, .. }
        ));
        assert!(matches!(device("too-many-devices"), D::TooMany(20)));
        assert!(matches!(device("fs-without-session"), D::Session(0)));
        assert!(matches!(device("session-on-rng"), D::Session(0)));
        assert!(matches!(err("version-2"), StateError::Version { found: 2 }));
        let fs = decode(&seed("valid-fs-session")).unwrap().devices;
        let session = fs[0].fs.as_ref().expect("a session");
        assert!(session.open);
        assert_eq!(session.fs.inodes.len(), 2);
        assert_eq!(session.fs.inodes[1].name, b"model.gguf");
        assert_eq!(session.fs.handles[0].nodeid, 3);
        assert_eq!(session.mappings[0].file_len, 2 << 20);
    }

    #[test]
    fn oversized_files_are_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmstate");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_STATE_BYTES + 1).unwrap();
        assert!(matches!(
            read_state_file(&path),
            Err(StateError::TooLarge(n)) if n == MAX_STATE_BYTES + 1
        ));
        std::fs::write(&path, file()).unwrap();
        assert_eq!(read_state_file(&path).unwrap().config.vcpus, 2);
        assert!(matches!(
            read_state_file(&dir.path().join("missing")),
            Err(StateError::Read { .. })
        ));
    }
}
