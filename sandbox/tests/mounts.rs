//! Mount preparation: erofs images cached by content key, raw disks for files, the size cap.

mod common;

use std::fs;
use std::time::{Duration, SystemTime};

use vm_drivers::ShareKind;
use vm_sandbox::mounts::{MountCache, MountError, dir_key};
use vm_spec::{MountVia, ValidMount};

fn set_mtime(path: &std::path::Path, t: SystemTime) {
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

#[test]
fn key_tracks_names_sizes_and_mtimes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::write(d.join("sub/f"), b"1234").unwrap();
    let k1 = dir_key(&d, u64::MAX).unwrap();
    assert_eq!(k1, dir_key(&d, u64::MAX).unwrap(), "stable");
    fs::write(d.join("sub/f"), b"12345").unwrap();
    let k2 = dir_key(&d, u64::MAX).unwrap();
    assert_ne!(k1, k2, "size change");
    set_mtime(
        &d.join("sub/f"),
        SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
    );
    let k3 = dir_key(&d, u64::MAX).unwrap();
    assert_ne!(k2, k3, "mtime change");
    fs::rename(d.join("sub/f"), d.join("sub/g")).unwrap();
    assert_ne!(k3, dir_key(&d, u64::MAX).unwrap(), "rename");
    // Same content at another path is another key (the path is part of it).
    let e = tmp.path().join("e");
    fs::rename(&d, &e).unwrap();
    assert_ne!(dir_key(&e, u64::MAX).unwrap(), k3);
}

#[test]
fn directory_over_the_cap_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("big"), vec![0u8; 2048]).unwrap();
    let err = dir_key(tmp.path(), 1024).unwrap_err();
    assert!(
        matches!(
            err,
            MountError::TooLarge {
                bytes: 2048,
                max: 1024,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("over the 1024-byte cap"), "{err}");
    let cache = MountCache::new(tmp.path().join("cache")).with_max_dir_bytes(1024);
    let m = ValidMount {
        host_path: tmp.path().to_path_buf(),
        guest_path: "/d".into(),
        via: MountVia::Erofs,
    };
    assert!(matches!(
        cache.prepare(&[m]),
        Err(MountError::TooLarge { .. })
    ));
    assert!(
        !tmp.path().join("cache").exists(),
        "nothing built for a refused directory"
    );
}

#[test]
fn erofs_image_is_built_once_reused_and_rebuilt_after_a_change() {
    if !common::have_mkfs_erofs() {
        common::skip(
            "erofs_image_is_built_once_reused_and_rebuilt_after_a_change",
            "mkfs.erofs missing",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("nested")).unwrap();
    fs::write(src.join("nested/model.txt"), b"weights").unwrap();
    let cache = MountCache::new(tmp.path().join("cache"));

    let first = cache.erofs_for_dir(&src).unwrap();
    let bytes = fs::read(&first).unwrap();
    // erofs superblock magic 0xE0F5E1E2 at offset 1024.
    assert_eq!(
        &bytes[1024..1028],
        &0xE0F5_E1E2u32.to_le_bytes(),
        "not an erofs image"
    );
    assert!(
        bytes.windows(7).any(|w| w == b"weights"),
        "file content missing from image"
    );
    let built_at = fs::metadata(&first).unwrap().modified().unwrap();

    let again = cache.erofs_for_dir(&src).unwrap();
    assert_eq!(again, first);
    assert_eq!(
        fs::metadata(&again).unwrap().modified().unwrap(),
        built_at,
        "image was rebuilt"
    );

    fs::write(src.join("nested/model.txt"), b"weights v2").unwrap();
    let changed = cache.erofs_for_dir(&src).unwrap();
    assert_ne!(changed, first);
    assert!(
        fs::read(&changed)
            .unwrap()
            .windows(10)
            .any(|w| w == b"weights v2")
    );

    // Only finished images are left in the cache, no temp files.
    let names: Vec<String> = fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(".erofs") && !n.starts_with('.')),
        "{names:?}"
    );
}

#[test]
fn every_mount_is_a_share_but_an_erofs_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("w.bin");
    fs::write(&f, b"x").unwrap();
    let d = tmp.path().join("d");
    fs::create_dir(&d).unwrap();
    let cache = MountCache::new(tmp.path().join("cache"));
    let mount = |p: &std::path::Path, guest: &str, via| ValidMount {
        host_path: p.to_path_buf(),
        guest_path: guest.into(),
        via,
    };
    let (disks, shares) = cache
        .prepare(&[
            mount(&f, "/w.bin", MountVia::Share),
            mount(&d, "/d", MountVia::Share),
        ])
        .unwrap();
    assert!(
        disks.is_empty(),
        "no raw disk for a file, no erofs for a directory"
    );
    assert_eq!(
        shares
            .iter()
            .map(|s| (s.host_path.as_path(), s.guest_path.as_str(), s.kind))
            .collect::<Vec<_>>(),
        [
            (f.as_path(), "/w.bin", ShareKind::File),
            (d.as_path(), "/d", ShareKind::Dir)
        ]
    );
    assert!(
        !tmp.path().join("cache").exists(),
        "nothing cached for a share"
    );
    // An erofs copy of a file is refused, naming it.
    let e = cache
        .prepare(&[mount(&f, "/w.bin", MountVia::Erofs)])
        .unwrap_err();
    assert!(matches!(e, MountError::ErofsFile(_)), "{e}");
    assert!(e.to_string().contains("w.bin"), "{e}");
}
