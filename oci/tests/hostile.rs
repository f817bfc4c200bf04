//! Hostile images: each is refused with a clear error or neutralised, nothing is written
//! outside the unpack target, and nothing is left in the store.

mod common;

use std::io::Read as _;
use std::path::Path;

use common::*;
use vm_oci::{Limits, Store};

fn skip(test: &str) -> bool {
    if let Some(why) = cannot_convert() {
        vm_test_support::skip(test, &why);
        return true;
    }
    false
}

/// Imports `img` as a layout into a fresh store; returns the store dir's owner and result.
fn import(
    tmp: &Path,
    img: &TestImage,
    limits: Limits,
) -> (Store, Result<vm_oci::Image, vm_oci::Error>) {
    let layout = tmp.join("layout");
    let _ = std::fs::remove_dir_all(&layout);
    img.write_layout(&layout, "t");
    let store = Store::open(tmp.join("store")).unwrap().with_limits(limits);
    let r = store.import(&layout);
    (store, r)
}

/// Asserts the import failed with `expect` in its message and left nothing in the store.
fn refused(store: &Store, r: Result<vm_oci::Image, vm_oci::Error>, expect: &str) {
    let e = error_chain(&r.expect_err("the hostile image was accepted"));
    assert!(e.contains(expect), "error {e:?} does not say {expect:?}");
    assert!(store.list().unwrap().is_empty(), "an image was stored");
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0,
        "a build directory was left behind"
    );
}

fn one_layer(l: Layer) -> TestImage {
    TestImage::new(&[l], serde_json::json!({}))
}

#[test]
fn dotdot_entries_are_refused() {
    if skip("dotdot_entries_are_refused") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let marker = format!("vm-oci-dotdot-{}", std::process::id());
    for path in [
        format!("../{marker}"),
        format!("a/../../{marker}"),
        "..".into(),
    ] {
        let img = one_layer(Layer::new().dir("a/", 0o755).file(&path, b"x"));
        let (store, r) = import(tmp.path(), &img, Limits::default());
        refused(&store, r, "would escape the image root");
    }
    assert!(!tmp.path().join(&marker).exists());
    assert!(!tmp.path().join("store/tmp").join(&marker).exists());
}

#[test]
fn absolute_paths_land_inside_the_image() {
    if skip("absolute_paths_land_inside_the_image") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("vm-oci-abs-{}", std::process::id());
    let img = one_layer(Layer::new().file(&format!("/tmp/{name}"), b"inside"));
    let (_store, r) = import(tmp.path(), &img, Limits::default());
    let got = r.unwrap();
    assert!(
        !Path::new("/tmp").join(&name).exists(),
        "written on the host"
    );
    let root = extract(&got.erofs, tmp.path());
    assert_eq!(
        std::fs::read(root.join("tmp").join(&name)).unwrap(),
        b"inside"
    );
}

#[test]
fn symlinks_out_are_followed_only_inside_the_image() {
    if skip("symlinks_out_are_followed_only_inside_the_image") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap(); // a real host directory the image points at
    let h = host.path().to_str().unwrap();
    // A symlink to a host directory that is not in the image, then a file through it.
    let img = one_layer(Layer::new().symlink("evil", h).file("evil/pwned", b"x"));
    let (store, r) = import(tmp.path(), &img, Limits::default());
    refused(&store, r, "symlink to a missing directory");
    // A directory swapped for such a symlink between two entries.
    let img = one_layer(
        Layer::new()
            .dir("d/", 0o755)
            .file("d/a", b"a")
            .symlink("d", h)
            .file("d/b", b"b"),
    );
    let (store, r) = import(tmp.path(), &img, Limits::default());
    refused(&store, r, "symlink to a missing directory");
    assert_eq!(
        std::fs::read_dir(host.path()).unwrap().count(),
        0,
        "wrote on the host"
    );

    // A symlink to /etc (absolute, and via ../..) when the image has its own /etc: the
    // files land in the image's /etc.
    let name = format!("vm-oci-etc-{}", std::process::id());
    let img = one_layer(
        Layer::new()
            .dir("etc/", 0o755)
            .symlink("etc-link", "/etc")
            .file(&format!("etc-link/{name}"), b"1")
            .dir("x/", 0o755)
            .symlink("x/up", "../../../../../../etc")
            .file(&format!("x/up/{name}.2"), b"2"),
    );
    let (_store, r) = import(tmp.path(), &img, Limits::default());
    let got = r.unwrap();
    assert!(
        !Path::new("/etc").join(&name).exists(),
        "written to the host's /etc"
    );
    assert!(!Path::new("/etc").join(format!("{name}.2")).exists());
    let root = extract(&got.erofs, tmp.path());
    assert_eq!(std::fs::read(root.join("etc").join(&name)).unwrap(), b"1");
    assert_eq!(
        std::fs::read(root.join("etc").join(format!("{name}.2"))).unwrap(),
        b"2"
    );
}

#[test]
fn hardlinks_out_are_refused() {
    if skip("hardlinks_out_are_refused") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = one_layer(Layer::new().hardlink("shadow", "/etc/shadow"));
    let (store, r) = import(tmp.path(), &img, Limits::default());
    refused(&store, r, "hardlink target /etc/shadow is not in the image");
    let img = one_layer(Layer::new().hardlink("shadow", "../../../etc/shadow"));
    let (store, r) = import(tmp.path(), &img, Limits::default());
    refused(&store, r, "would escape the image root");
    // Through a symlink planted first: resolved inside the image, where there is no shadow.
    let img = one_layer(
        Layer::new()
            .symlink("e", "/etc")
            .hardlink("shadow", "e/shadow"),
    );
    let (store, r) = import(tmp.path(), &img, Limits::default());
    refused(&store, r, "is not in the image");
}

#[test]
fn devices_are_dropped_and_setid_bits_cleared() {
    if skip("devices_are_dropped_and_setid_bits_cleared") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let img = one_layer(
        Layer::new()
            .raw("dev/sda", tar::EntryType::Block, 0o660, (0, 6), None, b"")
            .raw("dev/mem", tar::EntryType::Char, 0o640, (0, 0), None, b"")
            .file_as("suid", 0o4755, (0, 0), b"s")
            .file_as("sgid", 0o2711, (0, 0), b"g")
            .dir("sticky/", 0o1777),
    );
    let (_store, r) = import(tmp.path(), &img, Limits::default());
    let root = extract(&r.unwrap().erofs, tmp.path());
    assert!(!root.join("dev/sda").exists() && !root.join("dev/mem").exists());
    let mode = |p: &str| {
        std::fs::symlink_metadata(root.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(
        (mode("suid"), mode("sgid"), mode("sticky")),
        (0o755, 0o711, 0o1777)
    );
}

/// A gzip layer holding one file of `size` zero bytes, built as a stream.
fn zeros_layer(size: u64) -> Vec<u8> {
    use std::io::Write;
    let mut h = tar::Header::new_gnu();
    h.set_path("zeros").unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(h.as_bytes()).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = size + 1024;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        e.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    e.finish().unwrap()
}

#[test]
fn gzip_bomb_stops_early() {
    if skip("gzip_bomb_stops_early") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bomb = zeros_layer(1 << 30);
    assert!(bomb.len() < 2 << 20, "the bomb is {} bytes", bomb.len());
    let img = TestImage::from_blobs(vec![(bomb, Vec::new())], serde_json::json!({}));
    let t = std::time::Instant::now();
    let (store, r) = import(tmp.path(), &img, Limits::default());
    refused(&store, r, "refusing a decompression bomb");
    eprintln!("gzip bomb refused after {:?}", t.elapsed());
    // The same bomb as a gzipped docker-save archive holding the layer stops too, before
    // the archive is unpacked to disk.
    let saved = tmp.path().join("bomb.tar.gz");
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        std::fs::File::create(&saved).unwrap(),
        flate2::Compression::fast(),
    ));
    let mut h = tar::Header::new_gnu();
    h.set_size(1 << 30);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append_data(&mut h, "layer.tar", std::io::repeat(0).take(1 << 30))
        .unwrap();
    tar.into_inner().unwrap().finish().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    refused(
        &store,
        store.import(&saved),
        "refusing a decompression bomb",
    );

    // The total-size and entry caps stop a plain (uncompressed-size) flood too.
    let big = one_layer(Layer::new().file("a", &vec![7u8; 64 << 10]));
    let small = Limits {
        max_unpacked_bytes: 16 << 10,
        ..Limits::default()
    };
    let (store, r) = import(tmp.path(), &big, small);
    refused(&store, r, "unpacks to more than 16384 bytes");
    let many = one_layer((0..50).fold(Layer::new(), |l, i| l.file(&format!("f{i}"), b"")));
    let few = Limits {
        max_entries: 10,
        ..Limits::default()
    };
    let (store, r) = import(tmp.path(), &many, few);
    refused(&store, r, "more than 10 entries");
}

#[test]
fn bad_blobs_are_refused() {
    if skip("bad_blobs_are_refused") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = sample();
    let layer_digest = sha(&img.layers[0].0);
    let blob = |dir: &Path| dir.join("layout/blobs/sha256").join(&layer_digest[7..]);

    // Truncated: half the blob.
    let store = Store::open(tmp.path().join("store")).unwrap();
    img.write_layout(&tmp.path().join("layout"), "t");
    let data = std::fs::read(blob(tmp.path())).unwrap();
    std::fs::write(blob(tmp.path()), &data[..data.len() / 2]).unwrap();
    refused(
        &store,
        store.import(&tmp.path().join("layout")),
        "the manifest says",
    );

    // Same length, other bytes: the digest does not match.
    let mut other = data.clone();
    let n = other.len();
    other[n / 2] ^= 0xff;
    std::fs::write(blob(tmp.path()), &other).unwrap();
    refused(
        &store,
        store.import(&tmp.path().join("layout")),
        "blob digest is",
    );

    // The manifest names a blob the layout lacks.
    std::fs::remove_file(blob(tmp.path())).unwrap();
    refused(
        &store,
        store.import(&tmp.path().join("layout")),
        &layer_digest[7..],
    );

    // A layer whose uncompressed content is not what the config's diff ID says.
    let l = Layer::new().file("a", b"a");
    let wrong = TestImage::from_blobs(
        vec![(l.gzip(), b"not the tar".to_vec())],
        serde_json::json!({}),
    );
    let (store, r) = import(tmp.path(), &wrong, Limits::default());
    refused(&store, r, "differs from the config's diff ID");
}

/// `user.*` xattrs are kept; file capabilities (`security.capability`) and `trusted.*` are not.
#[test]
fn only_user_xattrs_are_kept() {
    if skip("only_user_xattrs_are_kept") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A real file capability blob (v2, cap_net_raw effective+permitted).
    let cap: &[u8] = &[
        0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let img = one_layer(
        Layer::new()
            .pax(&[("SCHILY.xattr.user.note", b"hello")])
            .file("noted", b"n")
            .pax(&[
                ("SCHILY.xattr.security.capability", cap),
                ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
            ])
            .file_as("pinger", 0o755, (0, 0), b"p"),
    );
    let (_store, r) = import(tmp.path(), &img, Limits::default());
    let got = r.unwrap();
    let xattr_size = |p: &str| {
        let out = std::process::Command::new("dump.erofs")
            .arg(format!("--path={p}"))
            .arg(&got.erofs)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let i = text.find("Xattr size:").unwrap_or_else(|| panic!("{text}")) + 11;
        text[i..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(xattr_size("/noted") > 0, "user.note was dropped");
    assert_eq!(
        xattr_size("/pinger"),
        0,
        "a capability or trusted xattr was kept"
    );
}

/// What cannot be a linux/amd64 root is refused by name: a zstd layer, an arm64 config.
#[test]
fn unsupported_images_are_refused_by_name() {
    if skip("unsupported_images_are_refused_by_name") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let zstd = vec![0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0];
    let img = TestImage::from_blobs(vec![(zstd, Vec::new())], serde_json::json!({}));
    let (store, r) = import(tmp.path(), &img, Limits::default());
    refused(&store, r, "zstd-compressed layers are not supported");

    let mut arm = one_layer(Layer::new().file("a", b"a"));
    arm.config = String::from_utf8(arm.config)
        .unwrap()
        .replace("\"amd64\"", "\"arm64\"")
        .into_bytes();
    let (store, r) = import(tmp.path(), &arm, Limits::default());
    refused(
        &store,
        r,
        "image is for linux/arm64; only linux/amd64 images run here",
    );
}
