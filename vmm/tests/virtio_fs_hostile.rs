//! Issue 40, the hostile guest: a guest speaking raw FUSE on the virtio-fs device rather than
//! through its kernel's driver. The harness (`fs_guest`) plays that guest on real guest memory
//! against a real host tree, the worker under its production seccomp filter. It sends an
//! oversized `READ`, bogus node ids and handles, a `FORGET` storm on the high-priority queue
//! (and a `BATCH_FORGET` whose count lies), 100,000 `LOOKUP`s, `SETUPMAPPING`s outside the
//! window (refused) and past the file's end (zero pages), unknown opcodes, headers whose length lies and requests
//! larger than the device copies, while symlinks in the tree point at a file outside it.
//!
//! After all of it: every request had its answer (an errno where it was wrong), no panic, the
//! process's resident memory grew by at most 8 MiB, the descriptors the device holds stay
//! within its inode cap, none of them is a host file outside the tree, and a true `READ`
//! still returns the file's bytes.

mod fs_guest;

use std::path::{Path, PathBuf};

use fs_guest::{Guest, HIPRIO, NO_FH, REQUESTS, T, WINDOW, file_bytes, tree};
use vm_virtiofs::abi::{InHeader, opcode};
use vmm::virtio::test_utils::Seg;

/// The device's inode cap in the harness (`fs_guest`: `max_inodes: 64`).
const MAX_INODES: usize = 64;

/// VmRSS of this process in KiB.
fn rss_kib() -> u64 {
    vm_test_support::procfs::rss_kib(std::path::Path::new("/proc/self/status"))
}

/// What this process's descriptors point at (`/proc/self/fd`).
fn fd_targets() -> Vec<PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect()
}

fn name(n: &str) -> Vec<u8> {
    let mut v = n.as_bytes().to_vec();
    v.push(0);
    v
}

fn read_in(fh: u64, offset: u64, size: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&fh.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b.resize(40, 0);
    b
}

impl Guest {
    /// Sends `bytes` as one request with `room` writable bytes for the reply; its used length
    /// (0: no reply) and errno (when a header came back).
    fn raw(&mut self, bytes: &[u8], room: u32) -> (u32, Option<i32>) {
        let (a, r) = self.bufs;
        self.d.write_mem(a, bytes);
        self.d.add_chain(
            REQUESTS,
            &[Seg::readable(a, bytes.len() as u32), Seg::writable(r, room)],
        );
        self.d.notify(REQUESTS as u32);
        let (_, len) = self.d.wait_used(REQUESTS, T).expect("an answer");
        let out = self.d.read_mem(r, len as usize);
        let errno = (out.len() >= 16).then(|| -i32::from_le_bytes(out[4..8].try_into().unwrap()));
        (len, errno)
    }

    /// A `FORGET`-like request on the high-priority queue; it must be consumed with no reply.
    fn hiprio(&mut self, op: u32, nodeid: u64, body: &[u8]) {
        let req = self.request(op, nodeid, body);
        let (a, _) = self.bufs;
        self.d.write_mem(a, &req);
        self.d
            .add_chain(HIPRIO, &[Seg::readable(a, req.len() as u32)]);
        self.d.notify(HIPRIO as u32);
        let (_, len) = self.d.wait_used(HIPRIO, T).expect("a FORGET consumed");
        assert_eq!(len, 0, "a FORGET has no reply");
    }
}

/// The tree's `weights.bin`, a symlink to a file outside the tree (absolute and relative),
/// and a symlink to the directory holding it.
fn hostile_tree() -> (tempfile::TempDir, tempfile::TempDir) {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"SECRET").unwrap();
    let t = tree();
    let secret = outside.path().join("secret");
    std::os::unix::fs::symlink(&secret, t.path().join("abs_out")).unwrap();
    let rel = Path::new("..")
        .join(outside.path().file_name().unwrap())
        .join("secret");
    std::os::unix::fs::symlink(rel, t.path().join("rel_out")).unwrap();
    std::os::unix::fs::symlink(outside.path(), t.path().join("dir_out")).unwrap();
    (t, outside)
}

#[test]
fn a_guest_speaking_raw_fuse_gets_errors_and_no_way_out() {
    let (t, outside) = hostile_tree();
    let mut g = Guest::on(t, WINDOW);
    let (node, fh) = g.lookup_open("weights.bin");
    let fds_before = fd_targets().len();
    // Warm-up of each kind below, so the allocator's steady state is not counted.
    g.call(opcode::READ, node, &read_in(fh, 0, u32::MAX));
    g.call(opcode::LOOKUP, 1, &name("weights.bin"));
    let rss_before = rss_kib();

    // An oversized READ: the reply is bounded by the chain's room, never the request's size.
    let (len, errno) = g.raw(
        &InHeader {
            opcode: opcode::READ,
            unique: 1,
            nodeid: node,
            ..InHeader::default()
        }
        .request(&read_in(fh, 0, u32::MAX)),
        4096,
    );
    assert!(
        len <= 4096,
        "a READ of u32::MAX bytes wrote {len} into 4096"
    );
    assert_eq!(errno, Some(0));
    let (e, data) = g.call(opcode::READ, node, &read_in(fh, 0, u32::MAX));
    assert_eq!(e, 0);
    assert!(data.len() <= 1 << 20, "{} bytes", data.len());

    // Bogus node ids and handles, on every opcode that takes them.
    for bogus in [0, 77, u64::MAX, 1 << 40, 1 << 63] {
        for op in [
            opcode::GETATTR,
            opcode::OPEN,
            opcode::OPENDIR,
            opcode::READLINK,
        ] {
            let e = g.call(op, bogus, &[0u8; 16]).0;
            assert_ne!(e, 0, "opcode {op} on node {bogus} answered 0");
        }
        assert_ne!(g.call(opcode::READ, node, &read_in(bogus, 0, 4096)).0, 0);
        assert_ne!(g.call(opcode::READDIR, 1, &read_in(bogus, 0, 4096)).0, 0);
        assert_ne!(g.call(opcode::LOOKUP, bogus, &name("weights.bin")).0, 0);
        assert_ne!(g.setup(bogus, NO_FH, 0, 2 << 20, 0, 0), 0);
    }

    // A FORGET storm on the high-priority queue, bogus ids and the real one (over-forgotten),
    // and a BATCH_FORGET whose count promises more entries than it carries.
    for i in 0..100_000u64 {
        let id = if i % 10 == 0 {
            node
        } else {
            i.wrapping_mul(0x9e37_79b9)
        };
        g.hiprio(opcode::FORGET, id, &u64::MAX.to_le_bytes());
    }
    let mut batch = Vec::new();
    batch.extend_from_slice(&u32::MAX.to_le_bytes());
    batch.extend_from_slice(&0u32.to_le_bytes());
    for id in [node, 1, 99] {
        batch.extend_from_slice(&id.to_le_bytes());
        batch.extend_from_slice(&u64::MAX.to_le_bytes());
    }
    g.hiprio(opcode::BATCH_FORGET, 0, &batch);

    // 100,000 LOOKUPs: of one name (one inode held), and of names that lead out of the tree.
    for _ in 0..100_000 {
        assert_eq!(g.call(opcode::LOOKUP, 1, &name("weights.bin")).0, 0);
    }
    for n in [
        "..",
        "../..",
        "dir_out/secret",
        "/etc/passwd",
        "a/../..",
        "",
    ] {
        assert_ne!(g.call(opcode::LOOKUP, 1, &name(n)).0, 0, "LOOKUP {n:?}");
    }
    // The links themselves are entries (their text is readable); what they point at is never
    // opened: not as a file, not as a directory to look into.
    for n in ["abs_out", "rel_out", "dir_out"] {
        let (e, entry) = g.call(opcode::LOOKUP, 1, &name(n));
        assert_eq!(e, 0, "LOOKUP {n}");
        let link = u64::from_le_bytes(entry[..8].try_into().unwrap());
        assert_ne!(g.call(opcode::OPEN, link, &[0u8; 8]).0, 0, "OPEN {n}");
        assert_ne!(g.call(opcode::OPENDIR, link, &[0u8; 8]).0, 0, "OPENDIR {n}");
        assert_ne!(
            g.call(opcode::LOOKUP, link, &name("secret")).0,
            0,
            "{n}/secret"
        );
    }

    // SETUPMAPPING outside the window, overflowing it, past the file's end, writable.
    let (node, fh) = g.lookup_open("weights.bin");
    for (foffset, len, flags, at) in [
        (0, 2 << 20, 0, WINDOW),
        (0, 2 << 20, 0, u64::MAX - (1 << 20)),
        (0, u64::MAX, 0, 0),
        (0, 2 << 20, 1, 0),
        (0, 2 << 20, u64::MAX, 0),
    ] {
        let e = g.setup(node, NO_FH, foffset, len, flags, at);
        assert_ne!(e, 0, "SETUPMAPPING {foffset}+{len} at {at} flags {flags}");
    }
    // Past the file's end, the range is mapped as zero pages: nothing of the host's.
    assert_eq!(g.setup(node, NO_FH, 1 << 40, 2 << 20, 0, 4 << 20), 0);
    assert!(g.window(4 << 20, 2 << 20).iter().all(|&b| b == 0));

    // Unknown opcodes, headers whose length lies, and a request larger than the device copies.
    for op in [0, 7, 99, 4096, u32::MAX] {
        assert_eq!(g.call(op, 1, &[0u8; 32]).0, libc::ENOSYS, "opcode {op}");
    }
    for lie in [0u32, 1, 39, 41, 1 << 20, u32::MAX] {
        let mut req = InHeader {
            opcode: opcode::GETATTR,
            unique: 2,
            nodeid: 1,
            ..InHeader::default()
        }
        .request(&[0u8; 16]);
        req[..4].copy_from_slice(&lie.to_le_bytes());
        let (_, errno) = g.raw(&req, 4096);
        assert_ne!(
            errno,
            Some(0),
            "a header of length {lie} for {} bytes",
            req.len()
        );
    }
    let mut huge = InHeader {
        opcode: opcode::LOOKUP,
        unique: 3,
        nodeid: 1,
        ..InHeader::default()
    }
    .request(&vec![b'a'; 60_000]);
    huge.push(0);
    let (_, errno) = g.raw(&huge, 4096);
    assert_ne!(errno, Some(0), "a 60,000-byte name was looked up");

    // Afterwards: bounded memory and descriptors, none outside the tree, and a true READ.
    let grew = rss_kib().saturating_sub(rss_before);
    eprintln!(
        "after the barrage: resident memory +{grew} KiB, {} descriptors ({fds_before} before)",
        fd_targets().len()
    );
    assert!(grew <= 8 << 10, "resident memory grew by {grew} KiB");
    let targets = fd_targets();
    assert!(
        targets.len() <= fds_before + MAX_INODES,
        "{} descriptors, {fds_before} before the barrage",
        targets.len()
    );
    let secret_dir = outside.path().canonicalize().unwrap();
    let leaked: Vec<&PathBuf> = targets
        .iter()
        .filter(|p| p.starts_with(&secret_dir) || p.starts_with("/etc"))
        .collect();
    assert!(
        leaked.is_empty(),
        "host files outside the tree opened: {leaked:?}"
    );
    let (e, data) = g.call(opcode::READ, node, &read_in(fh, 4096, 64 << 10));
    assert_eq!(e, 0);
    assert_eq!(data, file_bytes(4096, 64 << 10));
}
