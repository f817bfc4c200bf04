//! The tree's own rules: what a lookup opens, and what it refuses to open.

use super::*;

#[test]
fn a_fifo_is_never_opened_and_cannot_be_read() {
    let d = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(
        &d.path().join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let mut fs = Fs::open(d.path(), Limits::default()).unwrap();
    // Were it opened for reading without O_NONBLOCK, this lookup would block forever.
    let (node, attr) = fs.lookup(ROOT_ID, b"pipe").unwrap();
    assert_eq!(attr.mode & libc::S_IFMT, libc::S_IFIFO);
    assert_eq!(fs.inode(node).unwrap().kind, Kind::Other);
    assert!(!fs.inode(node).unwrap().readable);
    assert_eq!(fs.open_handle(node, false), Err(Errno::ENXIO));
}

#[test]
fn a_file_the_server_may_not_read_is_stat_only() {
    if !nix::unistd::geteuid().is_root() {
        vm_test_support::skip(
            "a_file_the_server_may_not_read_is_stat_only",
            "needs root to become an unprivileged uid",
        );
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("secret");
    std::fs::write(&f, b"root only").unwrap();
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // In a child that is an unprivileged stranger, as the jailed server is.
    let (r, w) = nix::unistd::pipe().unwrap();
    // SAFETY: the child only makes system calls and the lookups below, then exits.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let ok = nix::unistd::setresgid(65534.into(), 65534.into(), 65534.into()).is_ok()
                && nix::unistd::setresuid(65534.into(), 65534.into(), 65534.into()).is_ok();
            let verdict = ok
                && Fs::open(d.path(), Limits::default()).is_ok_and(|mut fs| {
                    let (node, attr) = fs.lookup(ROOT_ID, b"secret").unwrap();
                    attr.size == 9
                        && !fs.inode(node).unwrap().readable
                        && fs.open_handle(node, false) == Err(Errno::EACCES)
                });
            let _ = nix::unistd::write(&w, &[u8::from(verdict)]);
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(w);
            let mut b = [0u8; 1];
            assert_eq!(nix::unistd::read(&r, &mut b).unwrap(), 1);
            nix::sys::wait::waitpid(child, None).unwrap();
            assert_eq!(b[0], 1);
        }
    }
}

#[test]
fn the_root_must_be_a_directory_or_a_regular_file() {
    let d = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/etc", d.path().join("link")).unwrap();
    for p in [d.path().join("link"), d.path().join("missing")] {
        assert!(Fs::open(&p, Limits::default()).is_err(), "{}", p.display());
    }
}

#[test]
fn limits_fit_the_descriptors_left_or_refuse_below_the_minimum() {
    let l = Limits::default();
    assert_eq!(l.fit(1_000_000, 16), Some(l), "room for the default");
    assert_eq!(l.fit(1000, 64).map(|f| f.max_inodes), Some(936));
    assert_eq!(l.fit(1000, 64).map(|f| f.max_handles), Some(l.max_handles));
    assert_eq!(l.fit(16 + MIN_INODES, 16).map(|f| f.max_inodes), Some(16));
    assert_eq!(l.fit(16 + MIN_INODES - 1, 16), None);
    assert_eq!(l.fit(0, 16), None);
}
