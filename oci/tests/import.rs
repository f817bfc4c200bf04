//! Import of the three local forms (OCI layout, oci-archive, docker save), the flattened tree
//! they produce, and the store's get / list / remove / prune.

mod common;

use common::*;
use vm_oci::{ImageConfig, Store};

fn skip_unless_can_convert(test: &str) -> bool {
    if let Some(why) = cannot_convert() {
        vm_test_support::skip(test, &why);
        return true;
    }
    false
}

fn sample_config() -> ImageConfig {
    ImageConfig {
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("GREETING".into(), "hi".into()),
        ],
        working_dir: Some("/srv".into()),
        user: Some("1000:1000".into()),
        entrypoint: vec!["/bin/tool".into()],
        cmd: vec!["--help".into()],
    }
}

#[test]
fn import_layout_flattens_layers_with_oci_semantics() {
    if skip_unless_can_convert("import_layout_flattens_layers_with_oci_semantics") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = sample();
    let layout = tmp.path().join("layout");
    img.write_layout(&layout, "127.0.0.1:5000/sample:1");
    let store = Store::open(tmp.path().join("store")).unwrap();
    let got = store.import(&layout).unwrap();
    assert_eq!(got.digest.as_str(), img.manifest_digest());
    assert_eq!(got.config, sample_config());
    assert_eq!(got.refs, ["127.0.0.1:5000/sample:1"]);
    assert!(got.erofs.starts_with(store.dir()));
    let meta = std::fs::metadata(&got.erofs).unwrap();
    assert_eq!(got.size, meta.len());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o444,
        "the cached erofs is writable"
    );
    assert_sample_tree(&got.erofs, tmp.path());
    // Nothing left in tmp/, and the image is found by digest, prefix and name.
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0
    );
    for name in [
        got.digest.as_str(),
        &got.digest.hex()[..12],
        "127.0.0.1:5000/sample:1",
    ] {
        assert_eq!(store.get(name).unwrap().as_ref(), Some(&got), "{name}");
    }
    // A second import is a cache hit: same file, not rebuilt.
    let mtime = std::fs::metadata(&got.erofs).unwrap().modified().unwrap();
    let again = store.import(&layout).unwrap();
    assert_eq!(again, got);
    assert_eq!(
        std::fs::metadata(&got.erofs).unwrap().modified().unwrap(),
        mtime
    );
}

#[test]
fn import_oci_archive_and_docker_save() {
    if skip_unless_can_convert("import_oci_archive_and_docker_save") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let img = sample();
    let layout = tmp.path().join("layout");
    img.write_layout(&layout, "latest");
    let archive = tmp.path().join("image.oci.tar");
    tar_dir(&layout, &archive);
    let saved = tmp.path().join("image.docker.tar");
    img.write_docker_save(&saved, "example.com/team/sample:2");
    let store = Store::open(tmp.path().join("store")).unwrap();

    let from_archive = store.import(&archive).unwrap();
    assert_eq!(from_archive.digest.as_str(), img.manifest_digest());
    assert!(from_archive.refs.is_empty(), "a bare tag is not a name");
    assert_eq!(from_archive.config, sample_config());

    let from_save = store.import(&saved).unwrap();
    assert_ne!(from_save.digest, from_archive.digest);
    assert_eq!(from_save.refs, ["example.com/team/sample:2"]);
    assert_eq!(from_save.config, sample_config());
    let s1 = tmp.path().join("s1");
    let s2 = tmp.path().join("s2");
    std::fs::create_dir_all(&s1).unwrap();
    std::fs::create_dir_all(&s2).unwrap();
    assert_sample_tree(&from_archive.erofs, &s1);
    assert_sample_tree(&from_save.erofs, &s2);
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0
    );
}

#[test]
fn list_remove_prune() {
    if skip_unless_can_convert("list_remove_prune") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let a = TestImage::new(&[Layer::new().file("a", b"a")], serde_json::json!({}));
    let b = TestImage::new(&[Layer::new().file("b", b"b")], serde_json::json!({}));
    let (la, lb) = (tmp.path().join("a"), tmp.path().join("b"));
    a.write_layout(&la, "x");
    b.write_layout(&lb, "y");
    let ra: vm_oci::Reference = "127.0.0.1:1/a:1".parse().unwrap();
    let ra2: vm_oci::Reference = "127.0.0.1:1/a:2".parse().unwrap();
    let ia = store.import_as(&la, &[ra.clone(), ra2.clone()]).unwrap();
    let ib = store.import(&lb).unwrap(); // no name: dangling
    let listed = store.list().unwrap();
    assert_eq!(listed.len(), 2);
    let la_listed = listed.iter().find(|i| i.digest == ia.digest).unwrap();
    assert_eq!(la_listed.refs, ["127.0.0.1:1/a:1", "127.0.0.1:1/a:2"]);

    // prune removes only the unnamed image.
    let pruned = store.prune().unwrap();
    assert_eq!(
        pruned.iter().map(|i| &i.digest).collect::<Vec<_>>(),
        [&ib.digest]
    );
    assert!(!ib.erofs.exists() && ia.erofs.exists());

    // Removing one name keeps the image; the last name removes it.
    let r = store.remove("127.0.0.1:1/a:1").unwrap();
    assert_eq!(
        (r.refs.as_slice(), r.deleted),
        (&["127.0.0.1:1/a:1".to_string()][..], false)
    );
    assert!(ia.erofs.exists());
    let r = store.remove(&ra2.whole()).unwrap();
    assert!(r.deleted);
    assert!(!ia.erofs.exists());
    assert!(store.list().unwrap().is_empty());
    let e = store.remove("127.0.0.1:1/a:1").unwrap_err().to_string();
    assert!(e.contains("no image"), "{e}");

    // Removing by digest removes every name.
    let ia = store.import_as(&la, &[ra.clone(), ra2]).unwrap();
    let r = store.remove(ia.digest.as_str()).unwrap();
    assert!(r.deleted);
    assert_eq!(r.refs.len(), 2);
    assert!(store.get(&ra.whole()).unwrap().is_none());

    // An abandoned build directory (no lock held) goes on prune.
    std::fs::create_dir_all(store.dir().join("tmp/build-dead/tree")).unwrap();
    store.prune().unwrap();
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0
    );
}
