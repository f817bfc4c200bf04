//! ReadFile / WriteFile / List round trips and confinement.
mod common;

use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::TestAgent;
use vm_agent_client::ClientLimits;
use vm_agent_protocol::ErrorKind;

#[tokio::test]
async fn round_trips() {
    let a = TestAgent::start();
    let c = a.client();
    c.write_file("/", "a/b/c.txt", b"hello").await.unwrap();
    assert_eq!(std::fs::read(a.root().join("a/b/c.txt")).unwrap(), b"hello");
    assert_eq!(c.read_file("/", "a/b/c.txt").await.unwrap(), b"hello");
    assert_eq!(c.read_file("/a", "b/c.txt").await.unwrap(), b"hello");
    // Overwrite truncates; empty files work.
    c.write_file("/", "a/b/c.txt", b"hi").await.unwrap();
    assert_eq!(c.read_file("/", "a/b/c.txt").await.unwrap(), b"hi");
    c.write_file("/", "empty", b"").await.unwrap();
    assert_eq!(c.read_file("/", "empty").await.unwrap(), b"");
    // Multi-chunk file.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    c.write_file("/", "big.bin", &big).await.unwrap();
    assert_eq!(c.read_file("/", "big.bin").await.unwrap(), big);
    let mut l = c.list("/", "").await.unwrap();
    l.sort_by(|x, y| x.path.cmp(&y.path));
    let got: Vec<(&str, u64)> = l.iter().map(|e| (e.path.as_str(), e.size)).collect();
    assert_eq!(
        got,
        [("a/b/c.txt", 2), ("big.bin", 3_000_000), ("empty", 0)]
    );
    let l = c.list("/", "a").await.unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].path, "b/c.txt");
    let e = c.read_file("/", "missing").await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::NotFound), "{e}");
    let e = c.read_file("/", "a").await.unwrap_err();
    assert!(e.agent_kind().is_some(), "{e}");
}

#[tokio::test]
async fn size_limits() {
    let a = TestAgent::start();
    let c = a.client();
    let f = std::fs::File::create(a.root().join("huge")).unwrap();
    f.set_len(65 * 1024 * 1024).unwrap(); // sparse
    let mut out = Vec::new();
    let e = c
        .read_file_to("/", "huge", 64 * 1024 * 1024, &mut out)
        .await
        .unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::TooLarge), "{e}");
    assert!(e.to_string().contains("over the cap of 67108864"), "{e}");
    assert!(
        out.is_empty(),
        "{} bytes arrived before the refusal",
        out.len()
    );
    // The in-memory read keeps its 64 MiB default; the streaming call takes any cap.
    let e = c.read_file("/", "huge").await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::TooLarge), "{e}");
    let mut sink = vm_agent_protocol::sparse::Plain(tokio::io::sink());
    let n = c
        .read_file_to("/", "huge", 128 * 1024 * 1024, &mut sink)
        .await
        .unwrap();
    assert_eq!(n, 65 * 1024 * 1024);
    let small = c.clone().with_limits(ClientLimits {
        max_file_bytes: 10,
        ..Default::default()
    });
    assert!(matches!(
        small.write_file("/", "x", &[0u8; 11]).await,
        Err(vm_agent_client::ClientError::TooLarge { .. })
    ));
    std::fs::write(a.root().join("eleven"), [1u8; 11]).unwrap();
    let e = small.read_file("/", "eleven").await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::TooLarge), "{e}");
}

#[tokio::test]
async fn escapes_are_refused() {
    let a = TestAgent::start();
    let c = a.client();
    let outside = a.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"SECRET").unwrap();
    let r = a.root();
    std::fs::create_dir(r.join("a")).unwrap();
    std::fs::write(r.join("a/ok"), b"ok").unwrap();
    symlink(&outside, r.join("abs_out")).unwrap();
    symlink("../outside", r.join("rel_out")).unwrap();
    symlink(outside.join("secret"), r.join("file_out")).unwrap();
    symlink("/proc/self/root/etc/passwd", r.join("magic")).unwrap();
    symlink("a", r.join("inside")).unwrap();

    let reads = [
        "../outside/secret",
        "a/../../outside/secret",
        "/etc/passwd",
        "abs_out/secret",
        "rel_out/secret",
        "file_out",
        "magic",
        "a/../a/../../outside/secret",
    ];
    for p in reads {
        match c.read_file("/", p).await {
            Ok(data) => panic!(
                "read of {p:?} succeeded: {:?}",
                String::from_utf8_lossy(&data)
            ),
            Err(e) => assert!(
                matches!(
                    e.agent_kind(),
                    Some(ErrorKind::Escape | ErrorKind::NotFound)
                ),
                "{p}: unexpected error {e}"
            ),
        }
    }
    for p in [
        "../x",
        "/tmp/vm-agent-escape",
        "abs_out/new",
        "rel_out/new",
        "file_out",
        "abs_out/secret",
    ] {
        assert!(
            c.write_file("/", p, b"PWNED").await.is_err(),
            "write {p:?} succeeded"
        );
    }
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"SECRET");
    assert!(!outside.join("new").exists());
    for p in ["..", "/", "abs_out", "rel_out", "a/../.."] {
        assert!(c.list("/", p).await.is_err(), "list {p:?} succeeded");
    }
    // Roots are confined to the agent's base too.
    assert!(c.read_file("/../outside", "secret").await.is_err());
    assert!(c.read_file("/abs_out", "secret").await.is_err());
    // Listing the root never follows symlinks out.
    let l = c.list("/", "").await.unwrap();
    assert_eq!(
        l.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
        ["a/ok"]
    );
    // A symlink that stays inside is fine.
    assert_eq!(c.read_file("/", "inside/ok").await.unwrap(), b"ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_swapped_for_symlink_during_reads() {
    let a = TestAgent::start();
    let c = a.client();
    let outside = a.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("f"), b"SECRET-OUTSIDE").unwrap();
    std::fs::write(outside.join("marker"), b"x").unwrap();
    let r = a.root().to_path_buf();
    std::fs::create_dir(r.join("d")).unwrap();
    std::fs::write(r.join("d/f"), b"inside").unwrap();
    symlink(&outside, r.join("s")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let swapper = std::thread::spawn(move || {
        let d = std::ffi::CString::new(r.join("d").to_str().unwrap()).unwrap();
        let s = std::ffi::CString::new(r.join("s").to_str().unwrap()).unwrap();
        let mut swaps = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            // SAFETY: valid NUL-terminated paths; atomic exchange of two names.
            let rc = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    d.as_ptr(),
                    libc::AT_FDCWD,
                    s.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            };
            assert_eq!(rc, 0, "renameat2: {}", std::io::Error::last_os_error());
            swaps += 1;
        }
        swaps
    });
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..300 {
        match c.read_file("/", "d/f").await {
            Ok(data) => {
                assert_eq!(data, b"inside", "read returned outside content");
                ok += 1;
            }
            // While `d` is the symlink out, the agent refuses: that and nothing else.
            Err(e) => {
                assert_eq!(e.agent_kind(), Some(ErrorKind::Escape), "read: {e}");
                refused += 1;
            }
        }
        match c.list("/", "d").await {
            Ok(l) => assert!(
                l.iter().all(|e| e.size == 6 && e.path == "f"),
                "list saw outside entries: {l:?}"
            ),
            Err(e) => assert_eq!(e.agent_kind(), Some(ErrorKind::Escape), "list: {e}"),
        }
        if let Err(e) = c.write_file("/", "d/f", b"inside").await {
            assert_eq!(e.agent_kind(), Some(ErrorKind::Escape), "write: {e}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert_eq!(
        std::fs::read(outside.join("f")).unwrap(),
        b"SECRET-OUTSIDE",
        "a write went outside"
    );
    eprintln!("race: {ok} reads ok, {refused} refused, {swaps} swaps");
    assert!(swaps > 100, "the swapper did not run");
    // Both sides of the race were hit: reads through the real directory succeeded and reads
    // through the swapped-in symlink were refused.
    assert!(ok > 0 && refused > 0, "{ok} ok, {refused} refused");
}

#[tokio::test]
async fn make_dirs_creates_confined_and_hands_over() {
    use std::os::unix::fs::MetadataExt;
    let a = TestAgent::start();
    let c = a.client();
    let r = a.root();
    c.make_dirs("/work/a/b", None).await.unwrap();
    assert!(r.join("work/a/b").is_dir());
    // Existing directories are fine (idempotent).
    c.make_dirs("/work/a", None).await.unwrap();
    // An owner given by number: the last directory only is handed over (needs root).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        c.make_dirs("/srv/app", Some("4321:4322")).await.unwrap();
        let m = std::fs::metadata(r.join("srv/app")).unwrap();
        assert_eq!((m.uid(), m.gid()), (4321, 4322));
        assert_eq!(std::fs::metadata(r.join("srv")).unwrap().uid(), 0);
    }
    // An owner that is malformed or unknown in /etc is refused, naming it.
    let e = c.make_dirs("/x", Some("no such user!")).await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::BadRequest), "{e}");
    let e = c
        .make_dirs("/y", Some("vm-no-such-user-here"))
        .await
        .unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::BadRequest), "{e}");
    assert!(e.to_string().contains("vm-no-such-user-here"), "{e}");
    // Never outside the base: `..` and symlinks out are refused, nothing is created there.
    let outside = a.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    symlink(&outside, r.join("abs_out")).unwrap();
    symlink("../outside", r.join("rel_out")).unwrap();
    for p in [
        "/../outside/new",
        "/abs_out/new",
        "/rel_out/new",
        "/work/../../x",
    ] {
        assert!(
            c.make_dirs(p, None).await.is_err(),
            "make_dirs {p:?} succeeded"
        );
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
}

#[tokio::test]
async fn mount_tmpfs_is_refused_unless_pid1() {
    // A host-side agent never mounts: the refusal says why, and nothing is created.
    let a = TestAgent::start();
    let e = a.client().mount_tmpfs("/cache", 1 << 20).await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::Unsupported), "{e}");
    assert!(e.to_string().contains("PID 1"), "{e}");
    assert!(!a.root().join("cache").exists());
}

#[tokio::test]
async fn set_mode_sets_permission_bits_of_a_confined_regular_file() {
    use std::os::unix::fs::PermissionsExt;
    let a = TestAgent::start();
    let c = a.client();
    let r = a.root();
    std::fs::create_dir_all(r.join("dev")).unwrap();
    std::fs::write(r.join("dev/termination-log"), b"").unwrap();
    c.set_mode("/dev/termination-log", 0o4666).await.unwrap();
    let mode = std::fs::metadata(r.join("dev/termination-log"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o666, "never a set-id bit");
    // Only a regular file below the root: a directory, a missing file, an escape are refused.
    assert!(c.set_mode("/dev", 0o777).await.is_err());
    let e = c.set_mode("/nope", 0o666).await.unwrap_err();
    assert_eq!(e.agent_kind(), Some(ErrorKind::NotFound), "{e}");
    let outside = a.dir.path().join("outside-file");
    std::fs::write(&outside, b"").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
    symlink(&outside, r.join("link")).unwrap();
    assert!(c.set_mode("/link", 0o666).await.is_err());
    assert!(c.set_mode("/../outside-file", 0o666).await.is_err());
    let mode = std::fs::metadata(&outside).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "a file outside the root changed");
}

/// Remove: a file goes, and a symlink goes while what it points to (outside the root) stays;
/// a directory, a path with nothing there, the root itself and every way out are refused,
/// with nothing removed.
#[tokio::test]
async fn remove_takes_a_file_or_a_link_never_what_it_points_to() {
    let a = TestAgent::start();
    let c = a.client();
    let outside = a.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("victim"), b"keep").unwrap();
    let r = a.root();
    std::fs::create_dir_all(r.join("a/d")).unwrap();
    std::fs::write(r.join("a/f"), b"x").unwrap();
    std::fs::write(r.join("a/g"), b"x").unwrap();
    symlink(outside.join("victim"), r.join("link_out")).unwrap();
    symlink(&outside, r.join("dir_out")).unwrap();
    symlink("../outside", r.join("rel_out")).unwrap();

    c.remove("/", "a/f").await.unwrap();
    assert!(!r.join("a/f").exists());
    c.remove("/a", "g").await.unwrap();
    assert!(!r.join("a/g").exists());
    c.remove("/", "link_out").await.unwrap();
    assert!(r.join("link_out").symlink_metadata().is_err());

    let refused = [
        ("a/d", ErrorKind::BadRequest),
        ("", ErrorKind::BadRequest),
        ("missing", ErrorKind::NotFound),
        ("a/missing/f", ErrorKind::NotFound),
        ("dir_out/victim", ErrorKind::Escape),
        ("rel_out/victim", ErrorKind::Escape),
        ("../outside/victim", ErrorKind::Escape),
        ("/etc/passwd", ErrorKind::Escape),
    ];
    for (p, kind) in refused {
        let e = c.remove("/", p).await.unwrap_err();
        assert_eq!(e.agent_kind(), Some(kind), "remove {p:?}: {e}");
    }
    assert!(r.join("a/d").is_dir());
    assert!(r.join("dir_out").symlink_metadata().is_ok());
    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"keep");
}
