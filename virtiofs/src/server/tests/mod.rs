//! The server against real host trees in temporary directories, driven by a client that
//! speaks the FUSE wire format as the guest kernel does (and as a hostile guest would not):
//! [`guest`]; the DAX window's requests are [`dax`]'s.

use std::os::unix::fs::{PermissionsExt, symlink};

use super::session::{ChunkMapping, SessionState};
use super::*;
use crate::abi::{ENTRY_OUT_LEN, opcode};
use crate::fs::{Limits, ROOT_ID};
use guest::{Guest, init_body, request};

mod dax;
mod guest;

fn tree() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("small.bin"), b"hello weights").unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    std::fs::write(d.path().join("sub/inner"), vec![7u8; 3 << 20]).unwrap();
    symlink("sub/inner", d.path().join("inside")).unwrap();
    symlink("/etc", d.path().join("outside")).unwrap();
    d
}

#[test]
fn a_file_reads_back_whole_with_its_host_size_and_mode() {
    let d = tree();
    std::fs::set_permissions(
        d.path().join("small.bin"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let mut g = Guest::new(d.path());
    let (node, size, mode) = g.lookup(ROOT_ID, "small.bin").entry();
    assert_eq!(size, 13);
    assert_eq!(mode, libc::S_IFREG | 0o640);
    assert_eq!(g.read_all(node, 4), b"hello weights");
    assert_eq!(g.lookup(node, "inner").errno, libc::ENOTDIR);
    let (sub, _, mode) = g.lookup(ROOT_ID, "sub").entry();
    assert_eq!(mode & libc::S_IFMT, libc::S_IFDIR);
    let (inner, size, _) = g.lookup(sub, "inner").entry();
    assert_eq!(size, 3 << 20);
    // READs larger than the cap come back capped.
    let fh = g.open(inner, libc::O_RDONLY).u64_at(0);
    assert_eq!(g.read(fh, 0, u32::MAX).body.len(), 1 << 20);
    assert_eq!(g.read_all(inner, 1 << 20), vec![7u8; 3 << 20]);
}

#[test]
fn symlinks_are_shown_never_followed_on_the_host() {
    let d = tree();
    let mut g = Guest::new(d.path());
    let (node, _, mode) = g.lookup(ROOT_ID, "outside").entry();
    assert_eq!(mode & libc::S_IFMT, libc::S_IFLNK);
    let link = g.call(opcode::READLINK, node, &[]);
    assert_eq!(link.body, b"/etc");
    // Nothing can be looked up *through* it, and it cannot be opened.
    assert_eq!(g.lookup(node, "passwd").errno, libc::ENOTDIR);
    assert_eq!(g.open(node, libc::O_RDONLY).errno, libc::ELOOP);
    assert_eq!(
        g.call(opcode::OPENDIR, node, &[0u8; 8]).errno,
        libc::ENOTDIR
    );
    let (inside, _, _) = g.lookup(ROOT_ID, "inside").entry();
    assert_eq!(g.call(opcode::READLINK, inside, &[]).body, b"sub/inner");
}

#[test]
fn every_write_like_opcode_is_erofs_and_the_tree_is_unchanged() {
    let d = tree();
    let before = std::fs::read(d.path().join("small.bin")).unwrap();
    let mut g = Guest::new(d.path());
    let (node, _, _) = g.lookup(ROOT_ID, "small.bin").entry();
    for o in opcode::WRITE_LIKE {
        assert_eq!(
            g.call(o, node, &[0u8; 128]).errno,
            libc::EROFS,
            "opcode {o}"
        );
    }
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        assert_eq!(g.open(node, flags).errno, libc::EROFS, "{flags:#o}");
    }
    let mut access = Vec::new();
    put_u32(&mut access, libc::W_OK as u32);
    put_u32(&mut access, 0);
    assert_eq!(g.call(opcode::ACCESS, node, &access).errno, libc::EROFS);
    for o in [opcode::FSYNC, opcode::INTERRUPT, 99, 4096, u32::MAX] {
        assert_eq!(
            g.call(o, node, &[0u8; 64]).errno,
            libc::ENOSYS,
            "opcode {o}"
        );
    }
    assert_eq!(std::fs::read(d.path().join("small.bin")).unwrap(), before);
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 4);
}

#[test]
fn nothing_is_served_before_init_and_destroy_ends_the_session() {
    let d = tree();
    let fs = Fs::open(d.path(), Limits::default()).unwrap();
    let mut s = Server::new(fs, None);
    let mut out = Vec::new();
    let req = request(opcode::GETATTR, 1, ROOT_ID, &[0u8; 16]);
    assert_eq!(
        s.handle(&req, req.len(), 4096, &mut out),
        Outcome::Replied {
            len: 16,
            errno: libc::EIO
        }
    );
    let mut bad = init_body();
    bad[..4].copy_from_slice(&8u32.to_le_bytes());
    let req = request(opcode::INIT, 2, 0, &bad);
    assert!(matches!(
        s.handle(&req, req.len(), 4096, &mut out),
        Outcome::Replied {
            errno: libc::EPROTO,
            ..
        }
    ));
    let mut g = Guest::new(d.path());
    let (node, _, _) = g.lookup(ROOT_ID, "small.bin").entry();
    assert_eq!(g.server.fs().usage(), (2, 0));
    assert_eq!(g.call(opcode::DESTROY, 0, &[]).errno, 0);
    assert_eq!(g.server.fs().usage(), (1, 0));
    assert_eq!(g.call(opcode::GETATTR, node, &[0u8; 16]).errno, libc::EIO);
}

#[test]
fn hostile_requests_get_errors_never_a_panic() {
    let d = tree();
    let mut g = Guest::new(d.path());
    // Bogus node ids and handles.
    for node in [0, 999, u64::MAX] {
        assert_eq!(g.call(opcode::GETATTR, node, &[0u8; 16]).errno, libc::EBADF);
        assert_eq!(g.lookup(node, "x").errno, libc::EBADF);
    }
    assert_eq!(g.read(12345, 0, 4096).errno, libc::EBADF);
    assert_eq!(
        g.readdir(opcode::READDIRPLUS, 7, 0, 4096).errno,
        libc::EBADF
    );
    let mut rel = Vec::new();
    put_u64(&mut rel, 77);
    rel.extend_from_slice(&[0u8; 16]);
    assert_eq!(g.call(opcode::RELEASE, 1, &rel).errno, libc::EBADF);
    // A name with a slash or `..` never reaches the host.
    assert_eq!(
        g.call(opcode::LOOKUP, ROOT_ID, b"../etc\0").errno,
        libc::EINVAL
    );
    assert_eq!(g.call(opcode::LOOKUP, ROOT_ID, b"..\0").errno, libc::EINVAL);
    // A header that lies about the length, and a request too short for a header.
    let mut req = request(opcode::STATFS, 1, ROOT_ID, &[]);
    req[0] = 200;
    let mut out = Vec::new();
    assert!(matches!(
        g.server.handle(&req, req.len(), 4096, &mut out),
        Outcome::Replied {
            errno: libc::EINVAL,
            ..
        }
    ));
    assert_eq!(
        g.server.handle(&req[..7], 7, 4096, &mut out),
        Outcome::NoReply
    );
    // No room for even a header: nothing written.
    assert_eq!(
        g.send(opcode::STATFS, ROOT_ID, &[], 15).map(|a| a.errno),
        None
    );
    // Room for a header but not the entry: EINVAL, cut to the room.
    let a = g
        .send(opcode::LOOKUP, ROOT_ID, b"small.bin\0", ENTRY_OUT_LEN)
        .unwrap();
    assert_eq!(a.errno, libc::EINVAL);
    // A READ into a small buffer is cut to it.
    let (node, _, _) = g.lookup(ROOT_ID, "small.bin").entry();
    let fh = g.open(node, libc::O_RDONLY).u64_at(0);
    let mut b = Vec::new();
    put_u64(&mut b, fh);
    put_u64(&mut b, 0);
    put_u32(&mut b, 1 << 30);
    b.extend_from_slice(&[0u8; 20]);
    assert_eq!(g.send(opcode::READ, 1, &b, 16 + 5).unwrap().body, b"hello");
    // SETUPMAPPING without a window.
    assert_eq!(
        g.call(opcode::SETUPMAPPING, node, &[0u8; 40]).errno,
        libc::ENOSYS
    );
}

#[test]
fn inodes_and_handles_are_capped_and_forgets_give_them_back() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..20 {
        std::fs::write(d.path().join(format!("f{i}")), b"x").unwrap();
    }
    let limits = Limits {
        max_inodes: 10,
        max_handles: 4,
        ..Limits::default()
    };
    let mut g = Guest::with(d.path(), limits, None);
    let mut nodes = Vec::new();
    for i in 0..9 {
        nodes.push(g.lookup(ROOT_ID, &format!("f{i}")).entry().0);
    }
    assert_eq!(g.lookup(ROOT_ID, "f9").errno, libc::ENFILE);
    // The same name again is the same inode: no new one.
    assert_eq!(g.lookup(ROOT_ID, "f0").entry().0, nodes[0]);
    for _ in 0..4 {
        assert_eq!(g.open(nodes[1], libc::O_RDONLY).errno, 0);
    }
    assert_eq!(g.open(nodes[1], libc::O_RDONLY).errno, libc::ENFILE);
    // FORGET storms: bogus ids, huge counts, repeats. Node 0 had two lookups.
    for _ in 0..10_000 {
        assert!(g.send(opcode::FORGET, 4242, &[0xff; 8], 64).is_none());
    }
    let mut n = Vec::new();
    put_u64(&mut n, 1);
    assert!(g.send(opcode::FORGET, nodes[0], &n, 64).is_none());
    assert_eq!(g.server.fs().usage().0, 10);
    let mut batch = Vec::new();
    put_u32(&mut batch, 3);
    put_u32(&mut batch, 0);
    for (node, count) in [(nodes[0], 1), (nodes[2], u64::MAX), (ROOT_ID, u64::MAX)] {
        put_u64(&mut batch, node);
        put_u64(&mut batch, count);
    }
    assert!(g.send(opcode::BATCH_FORGET, 0, &batch, 64).is_none());
    // Two forgotten; the root stays.
    assert_eq!(g.server.fs().usage().0, 8);
    assert_eq!(g.call(opcode::GETATTR, ROOT_ID, &[0u8; 16]).errno, 0);
    assert_eq!(g.lookup(ROOT_ID, "f9").errno, 0);
}

/// The scenario of the nested kvm run: a directory of more entries than the server may hold
/// inodes for. Every name is still listed; the ones past the cap have no node id.
#[test]
fn a_directory_past_the_inode_cap_still_lists_every_name() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..50 {
        std::fs::write(d.path().join(format!("f{i:02}")), b"x").unwrap();
    }
    let limits = Limits {
        max_inodes: 10,
        ..Limits::default()
    };
    let mut g = Guest::with(d.path(), limits, None);
    let fh = g.call(opcode::OPENDIR, ROOT_ID, &[0u8; 8]).u64_at(0);
    let entries = g.list_plus(fh, 1024);
    assert_eq!(
        entries.len(),
        52,
        "every name, . and .. included: {entries:?}"
    );
    let linked = entries.iter().filter(|(node, _)| *node != 0).count();
    assert_eq!(linked, 9, "the cap (the root holds one)");
    assert_eq!(g.lookup(ROOT_ID, "f49").errno, libc::ENFILE);
}

#[test]
fn a_hundred_thousand_lookups_hold_one_inode() {
    let d = tree();
    let mut g = Guest::new(d.path());
    for _ in 0..100_000 {
        g.lookup(ROOT_ID, "small.bin").entry();
    }
    assert_eq!(g.server.fs().usage(), (2, 0));
}

#[test]
fn large_directories_list_in_bounded_batches() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..3000 {
        std::fs::write(d.path().join(format!("entry-{i:05}")), b"").unwrap();
    }
    std::fs::write(d.path().join("ünïcödé ✓"), b"").unwrap();
    let mut g = Guest::new(d.path());
    let mut names = g.list(ROOT_ID, 4096);
    names.sort();
    assert_eq!(names.len(), 3003);
    assert_eq!(names[0], ".");
    assert_eq!(names.last().unwrap(), "ünïcödé ✓");
    // READDIRPLUS: each entry is a lookup, counted; batches never exceed the size asked.
    let fh = g.call(opcode::OPENDIR, ROOT_ID, &[0u8; 8]).u64_at(0);
    assert_eq!(g.list_plus(fh, 4096).len(), 3003);
    assert_eq!(
        g.server.fs().usage().0,
        3002,
        "every entry but . and .. looked up once"
    );
}

#[test]
fn a_single_file_share_shows_only_that_file() {
    let d = tree();
    let mut g = Guest::new(&d.path().join("small.bin"));
    let mut names = g.list(ROOT_ID, 4096);
    names.sort();
    assert_eq!(names, [".", "..", "small.bin"]);
    assert_eq!(g.lookup(ROOT_ID, "sub").errno, libc::ENOENT);
    assert_eq!(g.lookup(ROOT_ID, "inside").errno, libc::ENOENT);
    let (node, size, _) = g.lookup(ROOT_ID, "small.bin").entry();
    assert_eq!(size, 13);
    assert_eq!(g.read_all(node, 4096), b"hello weights");
    let root = g.call(opcode::GETATTR, ROOT_ID, &[0u8; 16]);
    assert_eq!(root.u32_at(16 + 60) & libc::S_IFMT, libc::S_IFDIR);
    // A forget of everything never drops the pinned file.
    let mut n = Vec::new();
    put_u64(&mut n, u64::MAX);
    assert!(g.send(opcode::FORGET, node, &n, 64).is_none());
    assert_eq!(g.read_all(node, 4096), b"hello weights");
}

#[test]
fn a_directory_swapped_for_a_symlink_reveals_nothing_outside() {
    let d = tree();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("inner"), b"host secret").unwrap();
    let mut g = Guest::new(d.path());
    let (sub, _, _) = g.lookup(ROOT_ID, "sub").entry();
    // The host swaps `sub` for a symlink to a directory outside the tree.
    std::fs::rename(d.path().join("sub"), d.path().join("sub.old")).unwrap();
    symlink(outside.path(), d.path().join("sub")).unwrap();
    // A fresh lookup sees a symlink; the held inode still reads the old directory's file.
    let (again, _, mode) = g.lookup(ROOT_ID, "sub").entry();
    assert_ne!(again, sub);
    assert_eq!(mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(g.lookup(again, "inner").errno, libc::ENOTDIR);
    let (inner, _, _) = g.lookup(sub, "inner").entry();
    assert_eq!(g.read_all(inner, 1 << 20), vec![7u8; 3 << 20]);
}

#[test]
fn user_xattrs_are_read_and_others_are_not() {
    let d = tree();
    let f = d.path().join("small.bin");
    let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: NUL-terminated path and name, a 3-byte value.
    let set = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.sha".as_ptr(),
            b"abc".as_ptr().cast(),
            3,
            0,
        )
    };
    if set != 0 {
        vm_test_support::skip(
            "user_xattrs_are_read_and_others_are_not",
            "the temporary directory's file system has no user xattrs",
        );
        return;
    }
    let mut g = Guest::new(d.path());
    let (node, _, _) = g.lookup(ROOT_ID, "small.bin").entry();
    let get = |g: &mut Guest, name: &[u8], size: u32| {
        let mut b = Vec::new();
        put_u32(&mut b, size);
        put_u32(&mut b, 0);
        b.extend_from_slice(name);
        g.call(opcode::GETXATTR, node, &b)
    };
    assert_eq!(get(&mut g, b"user.sha\0", 0).u32_at(0), 3);
    assert_eq!(get(&mut g, b"user.sha\0", 64).body, b"abc");
    assert_eq!(get(&mut g, b"user.sha\0", 2).errno, libc::ERANGE);
    assert_eq!(get(&mut g, b"security.selinux\0", 64).errno, libc::ENODATA);
    let mut b = Vec::new();
    put_u32(&mut b, 64);
    put_u32(&mut b, 0);
    assert_eq!(g.call(opcode::LISTXATTR, node, &b).body, b"user.sha\0");
}

#[test]
fn a_saved_session_restores_with_the_same_ids_or_is_refused_naming_what_changed() {
    let d = tree();
    let mut g = Guest::new(d.path());
    let (sub, _, _) = g.lookup(ROOT_ID, "sub").entry();
    let (inner, _, _) = g.lookup(sub, "inner").entry();
    let (small, _, _) = g.lookup(ROOT_ID, "small.bin").entry();
    let fh = g.open(small, libc::O_RDONLY).u64_at(0);
    let dh = g.call(opcode::OPENDIR, sub, &[0u8; 8]).u64_at(0);
    let saved = g.server.save();
    assert_eq!(saved.fs.inodes.len(), 3);

    // A fresh server over the same tree answers for the same node ids and handles.
    let mut again = Guest::with(d.path(), Limits::default(), None);
    again.server.restore(&saved).unwrap();
    assert_eq!(again.read(fh, 0, 64).body, b"hello weights");
    assert_eq!(again.read_all(inner, 1 << 20).len(), 3 << 20);
    assert_eq!(again.readdir(opcode::READDIR, dh, 0, 4096).errno, 0);
    // New ids do not collide with restored ones.
    let (fresh, _, _) = again.lookup(ROOT_ID, "inside").entry();
    assert!(fresh > inner && fresh > small);

    // The tree changed under the snapshot: refused, naming the path.
    std::fs::remove_file(d.path().join("sub/inner")).unwrap();
    std::fs::write(d.path().join("sub/inner"), b"other").unwrap();
    let mut changed = Guest::with(d.path(), Limits::default(), None);
    let e = changed.server.restore(&saved).unwrap_err();
    assert_eq!(
        e,
        crate::fs::RestoreError::Changed {
            path: "sub/inner".into()
        }
    );
    std::fs::remove_file(d.path().join("sub/inner")).unwrap();
    let mut gone = Guest::with(d.path(), Limits::default(), None);
    let e = gone.server.restore(&saved).unwrap_err().to_string();
    assert!(e.contains("sub/inner") && e.contains("changed"), "{e}");
}

#[test]
fn a_hostile_saved_session_is_refused() {
    let d = tree();
    let mut g = Guest::new(d.path());
    let (sub, _, _) = g.lookup(ROOT_ID, "sub").entry();
    g.lookup(sub, "inner").entry();
    let saved = g.server.save();
    let refused = |edit: &dyn Fn(&mut SessionState)| {
        let mut s = saved.clone();
        edit(&mut s);
        let mut fresh = Guest::with(d.path(), Limits::default(), None);
        fresh.server.restore(&s).unwrap_err()
    };
    // A child before its parent, a name with a slash, a duplicate id, a parent that is not a
    // directory, a huge list, a handle on nothing, a mapping without a window.
    refused(&|s| s.fs.inodes.reverse());
    refused(&|s| s.fs.inodes[1].name = b"../etc".to_vec());
    refused(&|s| s.fs.inodes[1].nodeid = s.fs.inodes[0].nodeid);
    refused(&|s| s.fs.inodes[0].nodeid = 1);
    refused(&|s| {
        let i = s.fs.inodes[1].clone();
        s.fs.inodes = vec![i; 40_000];
    });
    refused(&|s| {
        s.fs.handles.push(crate::fs::SavedHandle {
            fh: 1,
            nodeid: 999,
            dir: false,
        })
    });
    refused(&|s| {
        s.mappings.push(ChunkMapping {
            moffset: 0,
            nodeid: 2,
            foffset: 0,
            file_len: 4096,
        })
    });
}
