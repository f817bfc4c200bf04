//! Image roots from a store: a resolved image becomes the spec's root, defaults and recorded
//! source, and validation checks what it wrote.

mod common;

use std::path::Path;

use vm_sandbox::{ResolvedImage, use_image};
use vm_spec::{ImageConfig, SpecError};

/// A file with an erofs superblock magic at byte 1024 (all validation reads).
fn erofs_file(dir: &Path) -> std::path::PathBuf {
    let mut bytes = vec![0u8; 4096];
    bytes[1024..1028].copy_from_slice(&0xE0F5_E1E2u32.to_le_bytes());
    let p = dir.join("img.erofs");
    std::fs::write(&p, bytes).unwrap();
    p
}

fn resolved(dir: &Path) -> ResolvedImage {
    ResolvedImage {
        reference: "127.0.0.1:5000/py:3".into(),
        digest: format!("sha256:{}", "ab".repeat(32)),
        rootfs: erofs_file(dir),
        config: ImageConfig {
            env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
            working_dir: Some("/app/src".into()),
            user: Some("1000:1000".into()),
            entrypoint: vec!["python3".into()],
            cmd: vec!["-m".into(), "http.server".into()],
        },
    }
}

#[test]
fn a_resolved_image_is_recorded_and_validated() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = common::spec_in(dir.path());
    use_image(&mut spec, resolved(dir.path()));
    let src = spec.image.source.clone().expect("source recorded");
    assert_eq!(src.digest, format!("sha256:{}", "ab".repeat(32)));
    let valid = spec.validate().unwrap();
    assert_eq!(valid.image().source.as_ref(), Some(&src));
    assert_eq!(valid.working_dir(), Some("/app/src"));
    assert_eq!(valid.user(), Some("1000:1000"));
    assert_eq!(valid.default_command(), ["python3", "-m", "http.server"]);
    assert!(
        valid
            .env()
            .iter()
            .any(|(k, v)| k == "PATH" && v == "/usr/local/bin:/usr/bin:/bin"),
        "{:?}",
        valid.env()
    );
}

#[test]
fn a_bad_digest_or_a_source_without_root_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = common::spec_in(dir.path());
    let mut image = resolved(dir.path());
    image.digest = "sha256:XYZ".into();
    use_image(&mut spec, image);
    let e = spec.validate().unwrap_err();
    assert!(matches!(e, SpecError::ImageConfig { .. }), "{e}");
    assert!(e.to_string().starts_with("image.source.digest"), "{e}");

    spec.image.source.as_mut().unwrap().digest = format!("sha256:{}", "0".repeat(64));
    spec.image.rootfs = None;
    let e = spec.validate().unwrap_err();
    assert!(e.to_string().starts_with("image.source:"), "{e}");
}
