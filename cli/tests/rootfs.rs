//! `--rootfs` and `--user` through the built `vm` binary: the dry run shows the root file, its
//! detected filesystem, the image defaults and the user; bad values are refused before
//! anything boots; and (where tcg and the guest images are available) a command really runs
//! inside the image root as the given user.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Env;

const REFUSED: i32 = 126;
const USAGE: i32 = 2;

/// A tiny erofs root in `dir`: a static busybox (`sh`, `id`, `cat` linked), a marker file.
fn erofs_root(dir: &Path) -> PathBuf {
    let root = dir.join("tree");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in ["sh", "id", "cat", "mkdir", "chown"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("marker"), "from the image\n").unwrap();
    let image = dir.join("root.erofs");
    let st = Command::new("mkfs.erofs")
        .arg(&image)
        .arg(&root)
        .output()
        .expect("mkfs.erofs (erofs-utils) runs");
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    image
}

fn dry(env: &Env, extra: &[&str], command: &[&str]) -> common::Out {
    let mut args: Vec<String> = vec![
        "exec".into(),
        "--dry-run".into(),
        "--allow-emulation".into(),
    ];
    args.extend(env.image_args());
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(command.iter().map(|s| s.to_string()));
    env.run(&args)
}

#[test]
fn dry_run_shows_rootfs_defaults_and_user() {
    let env = Env::new();
    let image = erofs_root(env.dir.path());
    let img = image.display().to_string();
    let out = dry(
        &env,
        &["--json", "--rootfs", &img, "--user", "1000:50"],
        &["id"],
    );
    let doc = out.json();
    assert_eq!(doc["validation"]["ok"], true, "{doc}");
    assert_eq!(doc["spec"]["image"]["rootfs"], img.as_str());
    assert_eq!(doc["spec"]["user"], "1000:50");
    let cfg = &doc["spec"]["image"]["config"];
    // A bare rootfs has no config, and every default is shown (empty).
    for key in ["env", "working_dir", "user", "entrypoint", "cmd"] {
        assert!(
            cfg.get(key).is_some(),
            "image.config.{key} not shown: {doc}"
        );
    }
    assert_eq!(cfg["env"], serde_json::json!([]));
    let norm = &doc["validation"]["normalized"];
    assert_eq!(norm["image"]["rootfs_format"], "erofs", "{doc}");
    assert_eq!(norm["user"], "1000:50");

    let out = dry(&env, &["--rootfs", &img, "--user", "app"], &["id"]);
    assert!(
        out.stdout.contains(&format!("rootfs       {img}")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("user         app"), "{}", out.stdout);
}

#[test]
fn ext4_roots_are_detected() {
    let env = Env::new();
    let tree = env.dir.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("f"), "x").unwrap();
    let image = env.dir.path().join("root.ext4");
    let st = Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-d"])
        .arg(&tree)
        .arg(&image)
        .arg("8M")
        .output()
        .expect("mke2fs (e2fsprogs) runs");
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let out = dry(
        &env,
        &["--json", "--rootfs", &image.display().to_string()],
        &["true"],
    );
    let doc = out.json();
    assert_eq!(
        doc["validation"]["normalized"]["image"]["rootfs_format"], "ext4",
        "{doc}"
    );
}

#[test]
fn bad_roots_users_and_missing_commands_are_refused() {
    let env = Env::new();
    let not_an_image = env.dir.path().join("kernel").display().to_string();
    let out = dry(&env, &["--rootfs", &not_an_image], &["true"]);
    assert_eq!(out.code, REFUSED, "{}", out.stderr);
    assert!(
        out.stderr.contains("image.rootfs") && out.stderr.contains("neither an erofs nor an ext4"),
        "{}",
        out.stderr
    );
    let out = dry(&env, &["--rootfs", "/nonexistent/root.erofs"], &["true"]);
    assert_eq!(out.code, REFUSED, "{}", out.stderr);
    assert!(out.stderr.contains("image.rootfs"), "{}", out.stderr);
    for bad in ["a b", "root:", "x/y", ":0"] {
        let out = dry(&env, &["--user", bad], &["true"]);
        assert_eq!(out.code, REFUSED, "--user {bad:?}: {}", out.stderr);
        assert!(out.stderr.contains("user:"), "{}", out.stderr);
    }
    // No command and no Entrypoint/Cmd to run instead: a usage error before any boot.
    let image = erofs_root(env.dir.path());
    let out = dry(&env, &["--rootfs", &image.display().to_string()], &[]);
    assert_eq!(out.code, USAGE, "{}", out.stderr);
    assert!(out.stderr.contains("no command given"), "{}", out.stderr);
}

#[test]
fn exec_runs_in_the_image_root_as_the_user() {
    let env = Env::new();
    if common::no_guest_here(&env, "exec_runs_in_the_image_root_as_the_user") {
        return;
    }
    let image = erofs_root(env.dir.path());
    let out = env.run(&[
        "exec",
        "--allow-emulation",
        "--rootfs",
        &image.display().to_string(),
        "--user",
        "4242",
        "-e",
        "PATH=/bin",
        "--",
        "sh",
        "-c",
        "cat /marker; id -u; id -g; test -e /init || echo no-initramfs",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "from the image\n4242\n4242\nno-initramfs\n");
}

/// `vm run -d --rootfs … --user …`: every `vm exec NAME` runs in the image root as the VM's
/// user unless `--user` says otherwise.
#[test]
fn named_vm_keeps_its_root_and_user() {
    let env = Env::new();
    if common::no_guest_here(&env, "named_vm_keeps_its_root_and_user") {
        return;
    }
    let image = erofs_root(env.dir.path());
    let _cleanup = common::VmGuard {
        env: &env,
        name: "imgbox",
    };
    let out = env.run(&[
        "run",
        "-d",
        "--name",
        "imgbox",
        "--allow-emulation",
        "--rootfs",
        &image.display().to_string(),
        "--user",
        "4242",
        "-e",
        "PATH=/bin",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = env.run(&[
        "exec",
        "imgbox",
        "--",
        "sh",
        "-c",
        "cat /marker; id -u; pwd",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "from the image\n4242\n/work\n");
    let out = env.run(&["exec", "imgbox", "--user", "0", "--", "id", "-u"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "0\n"),
        "{}",
        out.stderr
    );
    // vm cp reads and writes the image root (writes land in the overlay).
    let host_out = env.dir.path().join("marker.out");
    let out = env.run(&["cp", "imgbox:/marker", host_out.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(std::fs::read(&host_out).unwrap(), b"from the image\n");
    let host_in = env.dir.path().join("in.txt");
    std::fs::write(&host_in, "to the image\n").unwrap();
    let out = env.run(&["cp", host_in.to_str().unwrap(), "imgbox:/marker"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = env.run(&["exec", "imgbox", "--", "cat", "/marker"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "to the image\n"),
        "{}",
        out.stderr
    );
    let out = env.run(&["stop", "imgbox"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
}
