//! Shared by the in-process virtio-fs suites: the harness playing the guest's FUSE driver on
//! real guest memory against a real host tree (the device's worker under its production
//! seccomp filter, `ThreadKind::FsDevice`).

#![allow(dead_code)]

use std::time::Duration;

use vm_virtiofs::abi::{InHeader, opcode};
use vmm::virtio::DeviceConfig;
use vmm::virtio::test_utils::{Driver, Seg};

pub const T: Duration = Duration::from_secs(10);
pub const WINDOW: u64 = 64 << 20;
/// What Linux's `fuse_setup_one_mapping` sends as a `SETUPMAPPING`'s handle: always -1 (the
/// file is the node id).
pub const NO_FH: u64 = u64::MAX;
/// The high-priority queue (the guest's `FORGET`s) and the request queue.
pub const HIPRIO: usize = 0;
pub const REQUESTS: usize = 1;

pub struct Guest {
    pub d: Driver,
    pub unique: u64,
    /// One request and one reply buffer in guest memory, reused.
    pub bufs: (u64, u64),
    pub tree: tempfile::TempDir,
}

pub fn tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(5u32 << 20) + 123).map(|i| (i % 251) as u8).collect();
    std::fs::write(t.path().join("weights.bin"), data).unwrap();
    t
}

impl Guest {
    pub fn new(dax_window: u64) -> Guest {
        Guest::on(tree(), dax_window)
    }

    /// A guest of the share `t`.
    pub fn on(t: tempfile::TempDir, dax_window: u64) -> Guest {
        let cfg = DeviceConfig::Fs {
            tag: "fs0".into(),
            share: t.path().to_path_buf(),
            max_inodes: 64,
            dax_window,
        };
        let mut d = Driver::new(&cfg).unwrap();
        d.dev.open_host_files(1024).unwrap();
        d.activate(0);
        let bufs = (d.alloc(64 << 10), d.alloc(1 << 20));
        let mut g = Guest {
            d,
            unique: 0,
            bufs,
            tree: t,
        };
        let mut init = Vec::new();
        for v in [7u32, 41, 128 << 10, (1 << 22) | (1 << 26)] {
            init.extend_from_slice(&v.to_le_bytes());
        }
        init.resize(64, 0);
        assert_eq!(g.call(opcode::INIT, 0, &init).0, 0);
        g
    }

    /// The bytes of a request with the next `unique`.
    pub fn request(&mut self, op: u32, nodeid: u64, body: &[u8]) -> Vec<u8> {
        self.unique += 1;
        InHeader {
            opcode: op,
            unique: self.unique,
            nodeid,
            ..InHeader::default()
        }
        .request(body)
    }

    /// Sends a request on the request queue; its errno and reply body.
    pub fn call(&mut self, op: u32, nodeid: u64, body: &[u8]) -> (i32, Vec<u8>) {
        let req = self.request(op, nodeid, body);
        let (a, r) = self.bufs;
        self.d.write_mem(a, &req);
        self.d.add_chain(
            1,
            &[
                Seg::readable(a, req.len() as u32),
                Seg::writable(r, 1 << 20),
            ],
        );
        self.d.notify(1);
        let (_, len) = self.d.wait_used(1, T).expect("a reply");
        let out = self.d.read_mem(r, len as usize);
        assert!(out.len() >= 16, "short reply {out:?}");
        let errno = -i32::from_le_bytes(out[4..8].try_into().unwrap());
        (errno, out[16..].to_vec())
    }

    pub fn lookup_open(&mut self, name: &str) -> (u64, u64) {
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        let (e, entry) = self.call(opcode::LOOKUP, 1, &n);
        assert_eq!(e, 0);
        let node = u64::from_le_bytes(entry[..8].try_into().unwrap());
        let (e, open) = self.call(opcode::OPEN, node, &[0u8; 8]);
        assert_eq!(e, 0);
        (node, u64::from_le_bytes(open[..8].try_into().unwrap()))
    }

    pub fn setup(
        &mut self,
        node: u64,
        fh: u64,
        foffset: u64,
        len: u64,
        flags: u64,
        at: u64,
    ) -> i32 {
        let mut b = Vec::new();
        for v in [fh, foffset, len, flags, at] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        self.call(opcode::SETUPMAPPING, node, &b).0
    }

    /// `len` bytes of the window at `offset`, as the guest would read them.
    pub fn window(&self, offset: u64, len: usize) -> Vec<u8> {
        let w = self.d.dev.window().expect("a window");
        let mut out = vec![0u8; len];
        w.mapping.read(offset, &mut out).unwrap();
        out
    }
}

pub fn file_bytes(offset: u64, len: usize) -> Vec<u8> {
    (offset..offset + len as u64)
        .map(|i| (i % 251) as u8)
        .collect()
}
