//! Pulls from a real registry (Debian's `docker-registry`, started here on 127.0.0.1) that
//! `skopeo` filled with images built offline: by tag and by digest, OCI and Docker v2s2,
//! a manifest list, and blobs that are short, altered or missing.

mod common;

use common::registry::Registry;
use common::*;
use vm_oci::{Auth, Reference, Store};

fn skip(test: &str) -> bool {
    let why = cannot_convert().or_else(|| {
        ["docker-registry", "skopeo"]
            .into_iter()
            .find(|t| !have(t))
            .map(|t| format!("{t} not installed (ci/setup.sh installs it)"))
    });
    if let Some(why) = why {
        vm_test_support::skip(test, &why);
        return true;
    }
    false
}

/// A registry holding the sample image (tag `1`) under each `(name, v2s2)`, and an empty store.
fn sample_in_registry(names: &[(&str, bool)]) -> (tempfile::TempDir, Registry, TestImage, Store) {
    let tmp = tempfile::tempdir().unwrap();
    let reg = Registry::start();
    let img = sample();
    let layout = tmp.path().join("layout");
    img.write_layout(&layout, "1");
    for (name, v2s2) in names {
        reg.push(&layout, "1", name, *v2s2);
    }
    let store = Store::open(tmp.path().join("store")).unwrap();
    (tmp, reg, img, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_by_tag_and_digest_oci_and_v2s2() {
    if skip("pull_by_tag_and_digest_oci_and_v2s2") {
        return;
    }
    let (tmp, reg, img, store) = sample_in_registry(&[("sample", false), ("sample-v2", true)]);

    let by_tag: Reference = format!("{}/sample:1", reg.addr).parse().unwrap();
    let oci = store.pull(&by_tag, &Auth::Anonymous).await.unwrap();
    assert_eq!(
        oci.digest.as_str(),
        img.manifest_digest(),
        "skopeo kept the OCI manifest"
    );
    assert_eq!(oci.refs, [by_tag.whole()]);
    assert_eq!(oci.config.user.as_deref(), Some("1000:1000"));
    let s = tmp.path().join("oci");
    std::fs::create_dir(&s).unwrap();
    assert_sample_tree(&oci.erofs, &s);

    let v2: Reference = format!("{}/sample-v2:1", reg.addr).parse().unwrap();
    let docker = store.pull(&v2, &Auth::Anonymous).await.unwrap();
    assert_ne!(docker.digest, oci.digest, "v2s2 has its own manifest");
    assert_eq!(docker.config, oci.config);
    let s = tmp.path().join("v2");
    std::fs::create_dir(&s).unwrap();
    assert_sample_tree(&docker.erofs, &s);

    let by_digest: Reference = format!("{}/sample@{}", reg.addr, oci.digest)
        .parse()
        .unwrap();
    let again = store.pull(&by_digest, &Auth::Anonymous).await.unwrap();
    assert_eq!(again.digest, oci.digest);
    assert_eq!(again.erofs, oci.erofs);
    assert!(again.refs.contains(&by_digest.whole()) && again.refs.contains(&by_tag.whole()));
    assert_eq!(store.list().unwrap().len(), 2);

    // Once stored, a digest or a name resolves with the registry gone.
    drop(reg);
    let cached = store.resolve(&by_digest, &Auth::Anonymous).await.unwrap();
    assert_eq!(cached.erofs, oci.erofs);
    for what in [
        by_tag.whole(),
        oci.digest.to_string(),
        oci.digest.hex()[..8].to_string(),
    ] {
        assert_eq!(
            store.get_or_pull(&what).await.unwrap().erofs,
            oci.erofs,
            "{what}"
        );
    }
    let e = error_chain(&store.pull(&by_tag, &Auth::Anonymous).await.unwrap_err());
    assert!(e.contains("fetching manifest"), "{e}");
    assert_eq!(
        std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_list_resolves_to_linux_amd64() {
    if skip("manifest_list_resolves_to_linux_amd64") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let reg = Registry::start();
    let amd = TestImage::new(
        &[Layer::new().file("arch", b"amd64")],
        serde_json::json!({}),
    );
    let mut arm = TestImage::new(
        &[Layer::new().file("arch", b"arm64")],
        serde_json::json!({}),
    );
    arm.config = String::from_utf8(arm.config.clone())
        .unwrap()
        .replace("\"amd64\"", "\"arm64\"")
        .into_bytes();
    let layout = tmp.path().join("layout");
    write_multi_arch_layout(&layout, "1", &[(&arm, "arm64"), (&amd, "amd64")]);
    reg.push(&layout, "1", "multi", false);
    let store = Store::open(tmp.path().join("store")).unwrap();
    let r: Reference = format!("{}/multi:1", reg.addr).parse().unwrap();
    let got = store.pull(&r, &Auth::Anonymous).await.unwrap();
    assert_eq!(got.digest.as_str(), amd.manifest_digest());
    let root = extract(&got.erofs, tmp.path());
    assert_eq!(std::fs::read(root.join("arch")).unwrap(), b"amd64");
}

/// A layout whose index.json holds one index listing `images` per architecture.
fn write_multi_arch_layout(dir: &std::path::Path, tag: &str, images: &[(&TestImage, &str)]) {
    let blobs = dir.join("blobs/sha256");
    let mut entries = Vec::new();
    for (img, arch) in images {
        img.write_layout(dir, "unused");
        let m = img.manifest();
        entries.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha(&m), "size": m.len(),
            "platform": {"architecture": arch, "os": "linux"}}));
    }
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries}))
    .unwrap();
    std::fs::write(blobs.join(&sha(&index)[7..]), &index).unwrap();
    let top = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "digest": sha(&index), "size": index.len(),
        "annotations": {"org.opencontainers.image.ref.name": tag}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&top).unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_altered_and_missing_blobs_are_refused() {
    if skip("short_altered_and_missing_blobs_are_refused") {
        return;
    }
    let (_tmp, reg, img, store) = sample_in_registry(&[("bad", false)]);
    let r: Reference = format!("{}/bad:1", reg.addr).parse().unwrap();
    let layer = sha(&img.layers[1].0);
    let file = reg.blob_file(&layer);
    let good = std::fs::read(&file).unwrap();

    let refused = |e: vm_oci::Error, expect: &str| {
        let e = error_chain(&e);
        assert!(e.contains(expect), "{e:?} does not say {expect:?}");
        assert!(store.list().unwrap().is_empty());
        assert_eq!(
            std::fs::read_dir(store.dir().join("tmp")).unwrap().count(),
            0
        );
    };
    std::fs::write(&file, &good[..good.len() / 2]).unwrap();
    let e = store.pull(&r, &Auth::Anonymous).await.unwrap_err();
    refused(
        e,
        &format!(
            "blob {layer} is {} bytes, the manifest says {}",
            good.len() / 2,
            good.len()
        ),
    );

    let mut other = good.clone();
    let n = other.len();
    other[n / 2] ^= 0xff;
    std::fs::write(&file, &other).unwrap();
    let e = store.pull(&r, &Auth::Anonymous).await.unwrap_err();
    refused(e, &format!("fetching blob {layer}"));

    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
    let e = store.pull(&r, &Auth::Anonymous).await.unwrap_err();
    refused(e, &format!("fetching blob {layer}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_from_docker_config() {
    if skip("basic_auth_from_docker_config") {
        return;
    }
    let Some(reg) = Registry::start_with_auth("puller", "s3cret pass") else {
        vm_test_support::skip(
            "basic_auth_from_docker_config",
            "python3 with the crypt module is needed to write the registry's bcrypt htpasswd",
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let img = sample();
    let layout = tmp.path().join("layout");
    img.write_layout(&layout, "1");
    reg.push_as(&layout, "1", "private", false, Some("puller:s3cret pass"));
    let store = Store::open(tmp.path().join("store")).unwrap();
    let r: Reference = format!("{}/private:1", reg.addr).parse().unwrap();

    let e = error_chain(&store.pull(&r, &Auth::Anonymous).await.unwrap_err());
    assert!(e.contains("fetching manifest"), "{e}");
    assert!(store.list().unwrap().is_empty());

    let config = tmp.path().join("config.json");
    let write = |user_pass: &str| {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode(user_pass);
        let body = serde_json::json!({"auths": {format!("http://{}", reg.addr): {"auth": auth}}});
        std::fs::write(&config, serde_json::to_vec(&body).unwrap()).unwrap();
    };
    write("puller:wrong");
    let auth = Auth::from_config_file(&config, r.registry()).unwrap();
    assert!(matches!(auth, Auth::Basic { .. }));
    assert!(
        store.pull(&r, &auth).await.is_err(),
        "a wrong password was accepted"
    );

    write("puller:s3cret pass");
    let auth = Auth::from_config_file(&config, r.registry()).unwrap();
    let got = store.pull(&r, &auth).await.unwrap();
    assert_eq!(got.digest.as_str(), img.manifest_digest());
}
