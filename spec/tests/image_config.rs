//! Image roots and image defaults: the root file's format, each default's rule (each refusal
//! names the field), the environment merge and the effective user.

use std::path::Path;

use vm_spec::{
    Guarantees, Image, ImageConfig, ImageDigests, Limits, RootfsFormat, Spec, SpecError,
};

fn spec(dir: &Path) -> Spec {
    let kernel = dir.join("vmlinux");
    std::fs::write(&kernel, b"k").unwrap();
    let image = Image {
        kernel,
        bz_image: None,
        initrd: None,
        rootfs: None,
        digests: ImageDigests::default(),
        config: ImageConfig::default(),
        source: None,
    };
    let limits = Limits {
        vcpus: 1,
        mem_mib: 128,
        pids: 64,
        wall: None,
    };
    Spec::new(image, Guarantees::untrusted(limits, Vec::new()))
}

fn write_magic(path: &Path, offset: usize, magic: &[u8]) {
    let mut b = vec![0u8; 4096];
    b[offset..offset + magic.len()].copy_from_slice(magic);
    std::fs::write(path, b).unwrap();
}

/// One change to a valid spec.
type Edit = Box<dyn Fn(&mut Spec)>;

fn refused_field(s: &Spec) -> String {
    let e = s.validate().expect_err("should be refused");
    e.to_string()
}

#[test]
fn rootfs_format_is_read_from_the_superblock() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path());
    let erofs = dir.path().join("a.erofs");
    write_magic(&erofs, 1024, &0xE0F5_E1E2u32.to_le_bytes());
    s.image.rootfs = Some(erofs);
    assert_eq!(
        s.validate().unwrap().image().rootfs_format,
        Some(RootfsFormat::Erofs)
    );
    let ext4 = dir.path().join("a.ext4");
    write_magic(&ext4, 1080, &0xEF53u16.to_le_bytes());
    s.image.rootfs = Some(ext4);
    assert_eq!(
        s.validate().unwrap().image().rootfs_format,
        Some(RootfsFormat::Ext4)
    );
    for (name, bytes) in [("zeros", vec![0u8; 4096]), ("short", vec![0u8; 100])] {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        s.image.rootfs = Some(p);
        let e = s.validate().unwrap_err();
        assert!(matches!(e, SpecError::RootfsFormat { .. }), "{name}: {e}");
        assert!(e.to_string().starts_with("image.rootfs: "), "{e}");
    }
    s.image.rootfs = None;
    assert_eq!(s.validate().unwrap().image().rootfs_format, None);
}

#[test]
fn each_default_is_checked_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let base = spec(dir.path());
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|s| s.image.config.env = vec![("A=B".into(), "1".into())]),
            "image.config.env[0]",
        ),
        (
            Box::new(|s| {
                s.image.config.env = vec![("X".into(), "1".into()), ("X".into(), "2".into())]
            }),
            "image.config.env[1]",
        ),
        (
            Box::new(|s| s.image.config.env = vec![("GPG_KEY".into(), "abc".into())]),
            "image.config.env[0]",
        ),
        (
            Box::new(|s| s.image.config.working_dir = Some("relative".into())),
            "image.config.working_dir",
        ),
        (
            Box::new(|s| s.image.config.working_dir = Some("/a/../b".into())),
            "image.config.working_dir",
        ),
        (
            Box::new(|s| s.image.config.user = Some("a b".into())),
            "image.config.user",
        ),
        (Box::new(|s| s.user = Some("x:".into())), "user"),
        (
            Box::new(|s| s.image.config.cmd = vec!["a\0b".into()]),
            "image.config.cmd[0]",
        ),
        (
            Box::new(|s| s.image.config.entrypoint = vec!["x".into(); 5000]),
            "image.config.cmd",
        ),
    ];
    for (edit, field) in cases {
        let mut s = base.clone();
        edit(&mut s);
        let msg = refused_field(&s);
        assert!(msg.starts_with(&format!("{field}:")), "{field}: {msg}");
    }
    // A secret-looking image variable passes when listed in env_allow, like an explicit one.
    let mut s = base.clone();
    s.image.config.env = vec![("GPG_KEY".into(), "abc".into())];
    s.guarantees.env_allow = vec!["GPG_KEY".into()];
    s.validate().unwrap();
}

#[test]
fn explicit_env_and_user_override_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(dir.path());
    s.image.config = ImageConfig {
        env: vec![
            ("PATH".into(), "/image/bin".into()),
            ("MODE".into(), "image".into()),
            ("ONLY_IMAGE".into(), "1".into()),
        ],
        user: Some("app".into()),
        ..ImageConfig::default()
    };
    s.guarantees.env = vec![("MODE".into(), "explicit".into())];
    // The default PATH is not added over the image's own.
    let s = s.with_default_env();
    let v = s.validate().unwrap();
    assert_eq!(
        v.env(),
        [
            ("PATH".to_string(), "/image/bin".to_string()),
            ("ONLY_IMAGE".into(), "1".into()),
            ("MODE".into(), "explicit".into()),
        ]
    );
    assert_eq!(v.user(), Some("app"));
    let mut s2 = s.clone();
    s2.user = Some("1000:1000".into());
    assert_eq!(s2.validate().unwrap().user(), Some("1000:1000"));
    // Without image env, the default PATH is written in as before.
    let mut s3 = s.clone();
    s3.image.config.env.clear();
    s3.guarantees.env.clear();
    let s3 = s3.with_default_env();
    assert_eq!(s3.guarantees.env, vm_spec::default_guest_env());
}
