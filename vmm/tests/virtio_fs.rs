//! virtio-fs in `vm-vmm`: the harness (`fs_guest`) plays the guest's FUSE driver on real guest
//! memory against a real host tree, the worker under its production seccomp filter
//! (`ThreadKind::FsDevice`). The device config space names the tag; a file reads back
//! through the request queue; the DAX window (a shared-memory region of the transport) shows
//! the file's pages after `SETUPMAPPING` and zero pages after `REMOVEMAPPING`; a range
//! outside the window, a writable mapping and a mapping past the file's end are refused or
//! bounded; every write-like opcode is `EROFS`; the host file is unchanged. A sparse 8 GiB
//! file on tmpfs read whole through the window reads true and allocates none of its holes.

mod fs_guest;

use fs_guest::{Guest, NO_FH, WINDOW, file_bytes, tree};
use vm_virtiofs::abi::opcode;
use vmm::virtio::DeviceConfig;
use vmm::virtio::test_utils::Driver;

const SHM_SEL: u32 = 0xac;
const SHM_LEN_LOW: u32 = 0xb0;
const SHM_LEN_HIGH: u32 = 0xb4;
const SHM_BASE_LOW: u32 = 0xb8;
const SHM_BASE_HIGH: u32 = 0xbc;

#[test]
fn the_tag_and_the_window_are_in_the_transport() {
    let mut g = Guest::new(WINDOW);
    let cfg = g.d.read_config(0, 44);
    assert_eq!(&cfg[..3], b"fs0");
    assert!(cfg[3..36].iter().all(|&b| b == 0));
    assert_eq!(u32::from_le_bytes(cfg[36..40].try_into().unwrap()), 1);
    g.d.write_reg(SHM_SEL, 0);
    let len = u64::from(g.d.read_reg(SHM_LEN_LOW)) | u64::from(g.d.read_reg(SHM_LEN_HIGH)) << 32;
    let base = u64::from(g.d.read_reg(SHM_BASE_LOW)) | u64::from(g.d.read_reg(SHM_BASE_HIGH)) << 32;
    assert_eq!(len, WINDOW);
    assert_eq!(base, vmm::layout::dax_window_base(0));
    // No other region; and none at all without a window.
    g.d.write_reg(SHM_SEL, 1);
    assert_eq!(g.d.read_reg(SHM_LEN_LOW), u32::MAX);
    let mut plain = Guest::new(0);
    plain.d.write_reg(SHM_SEL, 0);
    assert_eq!(plain.d.read_reg(SHM_LEN_HIGH), u32::MAX);
    assert!(plain.d.dev.window().is_none());
}

#[test]
fn a_file_reads_through_the_request_queue_and_writes_are_erofs() {
    let mut g = Guest::new(0);
    let (node, fh) = g.lookup_open("weights.bin");
    let mut read = Vec::new();
    for v in [fh, 4096 * 3] {
        read.extend_from_slice(&v.to_le_bytes());
    }
    read.extend_from_slice(&(256u32 << 10).to_le_bytes());
    read.resize(40, 0);
    let (e, data) = g.call(opcode::READ, node, &read);
    assert_eq!(e, 0);
    assert_eq!(data, file_bytes(4096 * 3, 256 << 10));
    for o in opcode::WRITE_LIKE {
        assert_eq!(g.call(o, node, &[0u8; 64]).0, libc::EROFS, "opcode {o}");
    }
    // Without a window, DAX is not offered.
    assert_eq!(g.setup(node, NO_FH, 0, 2 << 20, 0, 0), libc::ENOSYS);
    assert_eq!(g.d.metrics().errors, 0);
}

#[test]
fn the_dax_window_maps_file_pages_read_only_and_bounded() {
    let mut g = Guest::new(WINDOW);
    let (node, _fh) = g.lookup_open("weights.bin");
    let mib2 = 2u64 << 20;
    // File range [2 MiB, 4 MiB) at window offset 6 MiB.
    assert_eq!(g.setup(node, NO_FH, mib2, mib2, 0, 3 * mib2), 0);
    assert_eq!(g.window(3 * mib2, 4096), file_bytes(mib2, 4096));
    assert_eq!(
        g.window(3 * mib2 + mib2 - 4096, 4096),
        file_bytes(2 * mib2 - 4096, 4096)
    );
    // The last, partial chunk: file pages up to the end of file, zero pages after.
    assert_eq!(g.setup(node, NO_FH, 2 * mib2, mib2, 0, 0), 0);
    let tail = (5u64 << 20) + 123 - 2 * mib2;
    assert_eq!(
        g.window(0, tail as usize),
        file_bytes(2 * mib2, tail as usize)
    );
    assert!(
        g.window(tail.next_multiple_of(4096), 4096)
            .iter()
            .all(|&b| b == 0)
    );
    // Entirely past the end of file: zero pages.
    assert_eq!(g.setup(node, NO_FH, 1 << 30, mib2, 0, 5 * mib2), 0);
    assert!(g.window(5 * mib2, 4096).iter().all(|&b| b == 0));
    // Refused: writable, outside the window, misaligned, an unknown node.
    assert_eq!(g.setup(node, NO_FH, 0, mib2, 1, 0), libc::EROFS);
    assert_eq!(g.setup(node, NO_FH, 0, mib2, 0, WINDOW), libc::EINVAL);
    assert_eq!(g.setup(node, NO_FH, 0, 2 * WINDOW, 0, 0), libc::EINVAL);
    assert_eq!(g.setup(node, NO_FH, 0, mib2, 0, 4096), libc::EINVAL);
    assert_eq!(g.setup(node, NO_FH, 100, mib2, 0, 0), libc::EINVAL);
    assert_eq!(g.setup(999, NO_FH, 0, mib2, 0, 0), libc::EBADF);
    // REMOVEMAPPING puts zero pages back; a bad entry is refused.
    let mut rm = Vec::new();
    rm.extend_from_slice(&1u32.to_le_bytes());
    for v in [3 * mib2, mib2] {
        rm.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(g.call(opcode::REMOVEMAPPING, node, &rm).0, 0);
    assert!(g.window(3 * mib2, 4096).iter().all(|&b| b == 0));
    rm[4..12].copy_from_slice(&WINDOW.to_le_bytes());
    assert_eq!(g.call(opcode::REMOVEMAPPING, node, &rm).0, libc::EINVAL);
    // A full window: every chunk mapped, then each again with other file ranges.
    for round in 0..2u64 {
        for chunk in 0..WINDOW / mib2 {
            let foffset = ((chunk + round) % 3) * mib2;
            assert_eq!(g.setup(node, NO_FH, foffset, mib2, 0, chunk * mib2), 0);
        }
        let last = WINDOW / mib2 - 1;
        let foffset = ((last + round) % 3) * mib2;
        assert_eq!(g.window(last * mib2, 64), file_bytes(foffset, 64));
    }
    // A new session (INIT) empties the window.
    let mut init = Vec::new();
    for v in [7u32, 41, 0, 0] {
        init.extend_from_slice(&v.to_le_bytes());
    }
    init.resize(64, 0);
    assert_eq!(g.call(opcode::INIT, 0, &init).0, 0);
    assert!(g.window(0, 4096).iter().all(|&b| b == 0));
}

#[test]
fn a_window_must_be_whole_chunks_within_the_stride() {
    let t = tree();
    for size in [
        4096,
        (2 << 20) + 4096,
        vmm::layout::DAX_WINDOW_STRIDE + (2 << 20),
    ] {
        let cfg = DeviceConfig::Fs {
            tag: "fs0".into(),
            share: t.path().to_path_buf(),
            max_inodes: 64,
            dax_window: size,
        };
        assert!(Driver::new(&cfg).is_err(), "{size}");
    }
    let long = DeviceConfig::Fs {
        tag: "x".repeat(37),
        share: t.path().to_path_buf(),
        max_inodes: 64,
        dax_window: 0,
    };
    assert!(Driver::new(&long).is_err());
}

/// A guest reads a sparse 8 GiB file on the host's tmpfs whole through the DAX window, each
/// 2 MiB chunk as Linux maps it. Mapping a tmpfs hole shared and reading it allocates the page
/// for the host's file (8 GiB of host memory, not reclaimable without swap); the file's
/// allocation must stay as it was, and every byte the guest sees must be the file's.
#[test]
fn a_sparse_tmpfs_file_read_whole_through_dax_allocates_none_of_its_holes() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    const SIZE: u64 = 8 << 30;
    let mib2 = 2u64 << 20;
    let t = tempfile::tempdir_in("/dev/shm").expect("a directory on /dev/shm (tmpfs)");
    let p = t.path().join("sparse");
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    f.set_len(SIZE).unwrap();
    for (at, len) in [
        (0, 1 << 20),
        ((4 << 30) + 4096, 64 << 10),
        (SIZE - (1 << 20), 1 << 20),
    ] {
        f.write_all_at(&file_bytes(at, len as usize), at).unwrap();
    }
    let blocks = f.metadata().unwrap().blocks();
    let mut g = Guest::on(t, WINDOW);
    let (node, _) = g.lookup_open("sparse");
    let mut want = vec![0u8; mib2 as usize];
    for chunk in 0..SIZE / mib2 {
        let at = chunk % (WINDOW / mib2) * mib2;
        assert_eq!(g.setup(node, NO_FH, chunk * mib2, mib2, 0, at), 0);
        f.read_exact_at(&mut want, chunk * mib2).unwrap();
        assert!(g.window(at, mib2 as usize) == want, "chunk {chunk}");
    }
    assert_eq!(
        f.metadata().unwrap().blocks(),
        blocks,
        "the guest's reads allocated the file's holes"
    );
    assert_eq!(g.d.metrics().errors, 0);
}
