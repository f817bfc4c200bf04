//! A guest for the tests: builds FUSE requests as the guest kernel does, hands them to the
//! server, parses the replies.

use std::path::Path;

use super::super::*;
use crate::abi::{ENTRY_OUT_LEN, opcode};
use crate::fs::Limits;

/// A guest: builds requests, hands them to the server, parses replies.
pub(crate) struct Guest {
    pub server: Server,
    unique: u64,
    out: Vec<u8>,
}

/// A parsed reply.
#[derive(Debug)]
pub(crate) struct Answer {
    pub errno: i32,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.body[at..at + 8].try_into().unwrap())
    }
    pub fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.body[at..at + 4].try_into().unwrap())
    }
    /// `fuse_entry_out`: node id and the attribute's size and mode.
    pub fn entry(&self) -> (u64, u64, u32) {
        assert_eq!(self.errno, 0, "{self:?}");
        (self.u64_at(0), self.u64_at(48), self.u32_at(40 + 60))
    }
}

pub(crate) fn request(opcode: u32, unique: u64, nodeid: u64, body: &[u8]) -> Vec<u8> {
    InHeader {
        opcode,
        unique,
        nodeid,
        ..InHeader::default()
    }
    .request(body)
}

pub(crate) fn init_body() -> Vec<u8> {
    let mut b = Vec::new();
    put_u32(&mut b, 7);
    put_u32(&mut b, 41);
    put_u32(&mut b, 128 << 10);
    put_u32(&mut b, (OFFERED | init::MAP_ALIGNMENT) as u32);
    b.extend_from_slice(&[0u8; 48]);
    b
}

impl Guest {
    pub fn new(root: &Path) -> Guest {
        Guest::with(root, Limits::default(), None)
    }

    pub fn with(root: &Path, limits: Limits, dax: Option<Box<dyn DaxWindow>>) -> Guest {
        let fs = Fs::open(root, limits).unwrap();
        let mut g = Guest {
            server: Server::new(fs, dax),
            unique: 0,
            out: Vec::new(),
        };
        assert_eq!(g.call(opcode::INIT, 0, &init_body()).errno, 0);
        g
    }

    /// Sends a request with 1 MiB + a header of room; `None` when nothing was answered.
    pub fn send(&mut self, op: u32, nodeid: u64, body: &[u8], room: usize) -> Option<Answer> {
        self.unique += 1;
        let req = request(op, self.unique, nodeid, body);
        match self.server.handle(&req, req.len(), room, &mut self.out) {
            Outcome::NoReply => None,
            Outcome::Replied { len, errno } => {
                assert_eq!(len as usize, self.out.len());
                assert!(self.out.len() <= room);
                let got = u32::from_le_bytes(self.out[..4].try_into().unwrap());
                assert_eq!(got as usize, self.out.len());
                let e = i32::from_le_bytes(self.out[4..8].try_into().unwrap());
                assert_eq!(-e, errno);
                assert_eq!(
                    u64::from_le_bytes(self.out[8..16].try_into().unwrap()),
                    self.unique
                );
                Some(Answer {
                    errno,
                    body: self.out[16..].to_vec(),
                })
            }
        }
    }

    pub fn call(&mut self, op: u32, nodeid: u64, body: &[u8]) -> Answer {
        self.send(op, nodeid, body, (1 << 20) + 4096)
            .expect("a reply")
    }

    pub fn lookup(&mut self, parent: u64, name: &str) -> Answer {
        let mut b = name.as_bytes().to_vec();
        b.push(0);
        self.call(opcode::LOOKUP, parent, &b)
    }

    pub fn open(&mut self, node: u64, flags: i32) -> Answer {
        let mut b = Vec::new();
        put_u32(&mut b, flags as u32);
        put_u32(&mut b, 0);
        self.call(opcode::OPEN, node, &b)
    }

    pub fn read(&mut self, fh: u64, offset: u64, size: u32) -> Answer {
        let mut b = Vec::new();
        put_u64(&mut b, fh);
        put_u64(&mut b, offset);
        put_u32(&mut b, size);
        b.extend_from_slice(&[0u8; 20]);
        self.call(opcode::READ, 1, &b)
    }

    pub fn readdir(&mut self, op: u32, fh: u64, offset: u64, size: u32) -> Answer {
        let mut b = Vec::new();
        put_u64(&mut b, fh);
        put_u64(&mut b, offset);
        put_u32(&mut b, size);
        b.extend_from_slice(&[0u8; 20]);
        self.call(op, 1, &b)
    }

    /// Every name of directory `node` through READDIR batches of `size` bytes.
    pub fn list(&mut self, node: u64, size: u32) -> Vec<String> {
        let fh = self.call(opcode::OPENDIR, node, &[0u8; 8]).u64_at(0);
        let (mut names, mut offset) = (Vec::new(), 0u64);
        loop {
            let a = self.readdir(opcode::READDIR, fh, offset, size);
            assert_eq!(a.errno, 0);
            if a.body.is_empty() {
                break;
            }
            let mut at = 0;
            while at < a.body.len() {
                let off = a.u64_at(at + 8);
                let len = a.u32_at(at + 16) as usize;
                names.push(String::from_utf8(a.body[at + 24..at + 24 + len].to_vec()).unwrap());
                offset = off;
                at += abi::dirent_size(len);
            }
        }
        names
    }

    /// Every entry of directory handle `fh` through `READDIRPLUS` batches of `size` bytes, each
    /// answered and within `size`: its node id (0: not looked up) and name.
    pub fn list_plus(&mut self, fh: u64, size: u32) -> Vec<(u64, String)> {
        let (mut offset, mut entries) = (0u64, Vec::new());
        loop {
            let a = self.readdir(opcode::READDIRPLUS, fh, offset, size);
            assert_eq!(a.errno, 0, "a batch after {} entries", entries.len());
            assert!(a.body.len() <= size as usize);
            if a.body.is_empty() {
                break;
            }
            let mut at = 0;
            while at < a.body.len() {
                let len = a.u32_at(at + ENTRY_OUT_LEN + 16) as usize;
                offset = a.u64_at(at + ENTRY_OUT_LEN + 8);
                let name = &a.body[at + ENTRY_OUT_LEN + 24..at + ENTRY_OUT_LEN + 24 + len];
                entries.push((a.u64_at(at), String::from_utf8(name.to_vec()).unwrap()));
                at += ENTRY_OUT_LEN + abi::dirent_size(len);
            }
        }
        entries
    }

    /// The whole of a file through READs of `chunk` bytes.
    pub fn read_all(&mut self, node: u64, chunk: u32) -> Vec<u8> {
        let fh = self.open(node, libc::O_RDONLY).u64_at(0);
        let mut data = Vec::new();
        loop {
            let a = self.read(fh, data.len() as u64, chunk);
            assert_eq!(a.errno, 0);
            if a.body.is_empty() {
                break;
            }
            data.extend_from_slice(&a.body);
        }
        data
    }
}
