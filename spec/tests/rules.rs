//! One test per validation rule; each asserts the refusal names the field and the value.

use std::path::{Path, PathBuf};

use tempfile::TempDir;
use vm_spec::digest::sha256_file;
use vm_spec::{Guarantees, Image, ImageDigests, Limits, Mount, Spec, SpecError, ValidateContext};

struct Fixture {
    dir: TempDir,
    spec: Spec,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("vmlinux");
        let initrd = dir.path().join("initramfs.cpio");
        std::fs::write(&kernel, b"kernel bytes").unwrap();
        std::fs::write(&initrd, b"initrd bytes").unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let image = Image {
            kernel,
            bz_image: None,
            initrd: Some(initrd),
            rootfs: None,
            digests: ImageDigests::default(),
            config: Default::default(),
            source: None,
        };
        let limits = Limits {
            vcpus: 1,
            mem_mib: 128,
            pids: i64::from(vm_spec::DEFAULT_PIDS),
            wall: None,
        };
        let guarantees = Guarantees::untrusted(limits, vec![Mount::read_only(&data, "/data")]);
        Fixture {
            dir,
            spec: Spec::new(image, guarantees),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Validate with `home` as the user's home.
    fn check_home(&self, home: &Path) -> Result<vm_spec::ValidSpec, SpecError> {
        self.spec.validate_with(&ValidateContext {
            home: Some(home.to_path_buf()),
        })
    }

    fn check(&self) -> Result<vm_spec::ValidSpec, SpecError> {
        self.check_home(Path::new("/nonexistent-home-for-tests"))
    }

    fn refused(&self) -> String {
        match self.check() {
            Ok(_) => panic!("spec was accepted: {:?}", self.spec),
            Err(e) => e.to_string(),
        }
    }
}

fn assert_names(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not name {p:?}");
    }
}

#[test]
fn valid_spec_passes_and_normalizes() {
    let mut f = Fixture::new();
    f.spec.guarantees.mounts[0].guest_path = "/data//".into();
    f.spec
        .guarantees
        .env
        .push(("LANG".into(), "C.UTF-8".into()));
    let v = f.check().unwrap();
    assert_eq!(v.root(), "/work");
    assert_eq!(v.mounts()[0].guest_path, "/data");
    assert_eq!(
        v.mounts()[0].host_path,
        f.path("data").canonicalize().unwrap()
    );
    assert_eq!(v.limits().pids, vm_spec::DEFAULT_PIDS);
    assert_eq!(v.env(), &[("LANG".to_string(), "C.UTF-8".to_string())]);
}

#[test]
fn untrusted_constructor_forces_read_only_and_no_egress() {
    let m = Mount {
        host_path: "/x".into(),
        guest_path: "/x".into(),
        read_only: false,
        via: vm_spec::MountVia::Share,
    };
    let g = Guarantees::untrusted(Limits::default(), vec![m]);
    assert!(g.egress_denied);
    assert!(g.mounts.iter().all(|m| m.read_only));
    assert!(g.env.is_empty());
}

#[test]
fn spec_round_trips_through_json() {
    let f = Fixture::new();
    let json = serde_json::to_string(&f.spec).unwrap();
    let back: Spec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, f.spec);
    let valid = serde_json::to_value(f.check().unwrap()).unwrap();
    assert_eq!(valid["mounts"][0]["guest_path"], "/data");
}

#[test]
fn rule_egress_must_be_denied() {
    let mut f = Fixture::new();
    f.spec.guarantees.egress_denied = false;
    assert_names(&f.refused(), &["guarantees.egress_denied", "false"]);
}

#[test]
fn rule_memory_must_be_capped() {
    let mut f = Fixture::new();
    f.spec.guarantees.limits.mem_mib = 0;
    assert_names(&f.refused(), &["guarantees.limits.mem_mib", ": 0"]);
}

#[test]
fn rule_limits_have_upper_bounds() {
    let mut f = Fixture::new();
    f.spec.guarantees.limits.vcpus = 1000;
    assert_names(&f.refused(), &["guarantees.limits.vcpus", "1000"]);
}

#[test]
fn rule_writable_mount_refused() {
    let mut f = Fixture::new();
    f.spec.guarantees.mounts[0].read_only = false;
    let data = f.path("data");
    assert_names(
        &f.refused(),
        &[
            "guarantees.mounts[0].read_only",
            &data.display().to_string(),
        ],
    );
}

#[test]
fn rule_relative_host_path_refused() {
    let mut f = Fixture::new();
    f.spec.guarantees.mounts[0].host_path = "data".into();
    assert_names(
        &f.refused(),
        &["guarantees.mounts[0].host_path", "\"data\"", "relative"],
    );
}

#[test]
fn rule_relative_guest_path_refused() {
    let mut f = Fixture::new();
    f.spec.guarantees.mounts[0].guest_path = "data".into();
    assert_names(
        &f.refused(),
        &["guarantees.mounts[0].guest_path", "\"data\"", "relative"],
    );
}

#[test]
fn rule_guest_path_must_be_normal() {
    let mut f = Fixture::new();
    f.spec.guarantees.mounts[0].guest_path = "/data/../proc".into();
    assert_names(
        &f.refused(),
        &["guarantees.mounts[0].guest_path", "/data/../proc"],
    );
}

#[test]
fn rule_protected_guest_paths_refused() {
    let cases = [
        ("/", "/"),
        ("/proc", "/proc"),
        ("/sys/kernel", "/sys"),
        ("/dev", "/dev"),
        ("/usr", "/usr"),
        ("/init", "/init"),
        ("/etc/passwd", "/etc"),
        ("/tmp", "/tmp"),
        ("/work", "/work"),
    ];
    for (guest, protected) in cases {
        let mut f = Fixture::new();
        f.spec.guarantees.mounts[0].guest_path = guest.into();
        let msg = f.refused();
        assert_names(
            &msg,
            &["guarantees.mounts[0].guest_path", guest, "protected"],
        );
        assert!(msg.ends_with(protected), "{msg}");
    }
    // Inside scratch is fine.
    let mut f = Fixture::new();
    f.spec.guarantees.mounts[0].guest_path = "/tmp/data".into();
    f.check().unwrap();
}

#[test]
fn rule_root_must_be_a_usable_guest_path() {
    for root in ["work", "/", "/proc/x", "/a,b"] {
        let mut f = Fixture::new();
        f.spec.root = root.into();
        assert_names(&f.refused(), &["root", root]);
    }
}

#[test]
fn rule_host_root_refused() {
    let mut f = Fixture::new();
    f.spec.guarantees.mounts[0].host_path = "/".into();
    assert_names(
        &f.refused(),
        &["guarantees.mounts[0].host_path", "filesystem root"],
    );
    // Also when `..` leads there.
    f.spec.guarantees.mounts[0].host_path = f.path("../../../../../../../..");
    assert_names(
        &f.refused(),
        &["guarantees.mounts[0].host_path", "filesystem root"],
    );
}

#[test]
fn rule_host_home_and_its_ancestors_refused() {
    let f = Fixture::new();
    let home = f.path("data");
    let msg = f.check_home(&home).unwrap_err().to_string();
    assert_names(&msg, &["guarantees.mounts[0].host_path", "home directory"]);

    let mut f = Fixture::new();
    std::fs::create_dir_all(f.path("data/me")).unwrap();
    let msg = f.check_home(&f.path("data/me")).unwrap_err().to_string();
    assert_names(
        &msg,
        &[
            "guarantees.mounts[0].host_path",
            "contains the home directory",
        ],
    );

    // A symlink to the home is resolved before the check.
    std::os::unix::fs::symlink(f.path("data"), f.path("link")).unwrap();
    f.spec.guarantees.mounts[0].host_path = f.path("link");
    let msg = f.check_home(&f.path("data")).unwrap_err().to_string();
    assert_names(&msg, &["guarantees.mounts[0].host_path", "home directory"]);

    // A directory inside the home is fine.
    f.spec.guarantees.mounts[0].host_path = f.path("data/me");
    f.check_home(&f.path("data")).unwrap();
}

#[test]
fn rule_credential_mounts_refused_unless_named() {
    // home = <tmp>/home with the usual credential directories.
    let mut f = Fixture::new();
    let home = f.path("home");
    for d in [
        ".ssh",
        ".aws",
        ".gnupg",
        ".kube",
        ".docker",
        ".config/gcloud",
        "src",
    ] {
        std::fs::create_dir_all(home.join(d)).unwrap();
    }
    std::fs::write(home.join(".ssh/id_ed25519"), b"secret").unwrap();
    for (rel, what) in [
        (".ssh", "SSH keys"),
        (".ssh/id_ed25519", "SSH keys"),
        (".aws", "AWS credentials"),
        (".gnupg", "GnuPG keys"),
        (".kube", "Kubernetes credentials"),
        (".docker", "container registry credentials"),
        (".config/gcloud", "Google Cloud credentials"),
        // Containing one is the same exposure.
        (".config", "Google Cloud credentials"),
    ] {
        f.spec.guarantees.mounts[0].host_path = home.join(rel);
        let msg = f.check_home(&home).unwrap_err().to_string();
        assert_names(
            &msg,
            &[
                "guarantees.mounts[0].host_path",
                what,
                "--allow-mount-secret",
            ],
        );
    }
    // A symlink elsewhere that points at ~/.ssh is resolved first.
    std::os::unix::fs::symlink(home.join(".ssh"), f.path("innocent")).unwrap();
    f.spec.guarantees.mounts[0].host_path = f.path("innocent");
    let msg = f.check_home(&home).unwrap_err().to_string();
    assert_names(&msg, &["SSH keys", ".ssh"]);
    // Named explicitly (through the symlink, too): allowed, for that path only.
    f.spec.guarantees.mount_secret_allow = vec![home.join(".ssh")];
    f.check_home(&home).unwrap();
    f.spec.guarantees.mounts[0].host_path = home.join(".aws");
    let msg = f.check_home(&home).unwrap_err().to_string();
    assert_names(&msg, &["AWS credentials"]);
    // Ordinary directories under the home are fine.
    f.spec.guarantees.mount_secret_allow.clear();
    f.spec.guarantees.mounts[0].host_path = home.join("src");
    f.check_home(&home).unwrap();
}

#[test]
fn rule_missing_host_path_refused() {
    let mut f = Fixture::new();
    f.spec.guarantees.mounts[0].host_path = f.path("nope");
    assert_names(&f.refused(), &["guarantees.mounts[0].host_path", "nope"]);
}

#[test]
fn rule_delimiter_characters_refused() {
    for bad in ["a,b", "a:b", "a\nb", "a\0b"] {
        let mut f = Fixture::new();
        f.spec.guarantees.mounts[0].host_path = f.path(bad);
        let msg = f.refused();
        assert_names(
            &msg,
            &["guarantees.mounts[0].host_path", "forbidden character"],
        );
        let mut f = Fixture::new();
        f.spec.guarantees.mounts[0].guest_path = format!("/{bad}");
        let msg = f.refused();
        assert_names(
            &msg,
            &["guarantees.mounts[0].guest_path", "forbidden character"],
        );
    }
    let mut f = Fixture::new();
    f.spec.guarantees.mounts[0].guest_path = "/my data".into();
    assert_names(&f.refused(), &["guarantees.mounts[0].guest_path", "' '"]);
}

#[test]
fn rule_non_utf8_host_path_refused() {
    use std::os::unix::ffi::OsStrExt;
    let mut f = Fixture::new();
    let raw = std::ffi::OsStr::from_bytes(b"/tmp/\xff");
    f.spec.guarantees.mounts[0].host_path = PathBuf::from(raw);
    assert_names(&f.refused(), &["guarantees.mounts[0].host_path", "UTF-8"]);
}

#[test]
fn rule_overlapping_guest_paths_refused() {
    let mut f = Fixture::new();
    let other = f.path("other");
    std::fs::create_dir(&other).unwrap();
    f.spec
        .guarantees
        .mounts
        .push(Mount::read_only(&other, "/data"));
    assert_names(
        &f.refused(),
        &["guarantees.mounts[1].guest_path", "/data", "mounts[0]"],
    );
    f.spec.guarantees.mounts[1].guest_path = "/data/inner".into();
    assert_names(
        &f.refused(),
        &["guarantees.mounts[1].guest_path", "/data/inner"],
    );
}

#[test]
fn rule_env_names_well_formed() {
    for name in ["", "A=B", "A\0B"] {
        let mut f = Fixture::new();
        f.spec.guarantees.env.push((name.into(), "v".into()));
        assert_names(&f.refused(), &["guarantees.env[0]", &format!("{name:?}")]);
    }
}

#[test]
fn rule_env_values_without_nul() {
    let mut f = Fixture::new();
    f.spec
        .guarantees
        .env
        .push(("GREETING".into(), "hi\0there".into()));
    assert_names(&f.refused(), &["guarantees.env[0]", "GREETING", "NUL"]);
}

#[test]
fn rule_env_names_unique() {
    let mut f = Fixture::new();
    f.spec.guarantees.env.push(("LANG".into(), "C".into()));
    f.spec.guarantees.env.push(("LANG".into(), "en".into()));
    assert_names(&f.refused(), &["guarantees.env[1]", "LANG"]);
}

#[test]
fn rule_secret_env_refused_unless_allowed() {
    let mut f = Fixture::new();
    f.spec
        .guarantees
        .env
        .push(("GITHUB_TOKEN".into(), "x".into()));
    assert_names(
        &f.refused(),
        &["guarantees.env[0]", "GITHUB_TOKEN", "env_allow"],
    );
    f.spec.guarantees.env_allow.push("GITHUB_TOKEN".into());
    f.check().unwrap();
}

#[test]
fn rule_image_digest_must_match() {
    let mut f = Fixture::new();
    let good = sha256_file(&f.spec.image.kernel).unwrap();
    f.spec.image.digests.kernel = Some(good.clone());
    f.check().unwrap();
    f.spec.image.digests.kernel = Some("0".repeat(64));
    assert_names(
        &f.refused(),
        &["image.kernel", "vmlinux", &good, &"0".repeat(64)],
    );
}

#[test]
fn rule_image_digest_well_formed() {
    let mut f = Fixture::new();
    f.spec.image.digests.initrd = Some("sha256:abc".into());
    assert_names(&f.refused(), &["image.digests.initrd", "sha256:abc"]);
    let mut f = Fixture::new();
    f.spec.image.digests.rootfs = Some("0".repeat(64));
    assert_names(&f.refused(), &["image.digests.rootfs"]);
}

#[test]
fn rule_image_files_must_exist() {
    let mut f = Fixture::new();
    f.spec.image.initrd = Some(f.path("missing.cpio"));
    assert_names(&f.refused(), &["image.initrd", "missing.cpio"]);
    let mut f = Fixture::new();
    f.spec.image.kernel = f.path("data");
    assert_names(&f.refused(), &["image.kernel", "data"]);
}

#[test]
fn rule_mount_count_is_bounded() {
    let mut f = Fixture::new();
    let m = f.spec.guarantees.mounts[0].clone();
    for i in 0..vm_spec::MAX_MOUNTS {
        f.spec.guarantees.mounts.push(Mount {
            guest_path: format!("/m{i}"),
            ..m.clone()
        });
    }
    assert_names(&f.refused(), &["guarantees.mounts", "17", "16"]);
}

#[test]
fn rule_guest_paths_are_short() {
    let mut f = Fixture::new();
    let long = format!("/{}", "d".repeat(vm_spec::paths::MAX_GUEST_PATH));
    f.spec.guarantees.mounts[0].guest_path = long.clone();
    assert_names(
        &f.refused(),
        &["guarantees.mounts[0].guest_path", &long, "longer"],
    );
}

#[test]
fn rule_env_size_is_bounded() {
    let mut f = Fixture::new();
    f.spec
        .guarantees
        .env
        .push(("BIG".into(), "x".repeat(vm_spec::env::MAX_ENV_BYTES)));
    assert_names(&f.refused(), &["guarantees.env", "exceed"]);
}
