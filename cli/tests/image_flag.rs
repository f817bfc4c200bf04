//! `--image REF`: an OCI image from the store (here imported by the test from an OCI layout it
//! writes: a static busybox, a passwd with a user `app`, a config with every process default)
//! is resolved before anything boots; the dry run records the manifest digest and shows the
//! image's defaults; and (where tcg and the guest images are available) the image's
//! Entrypoint + Cmd run in it as its user, in its working directory, with its environment.

mod common;
#[path = "../../oci/tests/common/mod.rs"]
mod oci_common;

use common::{Env, Out};
use oci_common::{Layer, TestImage, cannot_convert};

const NAME: &str = "example.com/team/box:1";

fn busybox_image() -> TestImage {
    let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static)");
    let mut l = Layer::new()
        .dir("bin/", 0o755)
        .dir("etc/", 0o755)
        .dir("srv/", 0o755)
        .file_as("bin/busybox", 0o755, (0, 0), &busybox)
        .file_as(
            "etc/passwd",
            0o644,
            (0, 0),
            b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/srv:/bin/sh\n",
        )
        .file_as("etc/group", 0o644, (0, 0), b"root:x:0:\napp:x:1000:\n");
    for applet in ["sh", "id", "cat", "pwd", "mkdir", "chown", "env"] {
        l = l.symlink(&format!("bin/{applet}"), "busybox");
    }
    TestImage::new(
        &[l],
        serde_json::json!({
            "Env": ["PATH=/bin", "GREETING=hi"],
            "WorkingDir": "/srv", "User": "app",
            "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo $GREETING; id -u; pwd"],
        }),
    )
}

fn vm(env: &Env, args: &[&str]) -> Out {
    env.run_with_store(args)
}

/// Imports the test image into the test's store as [`NAME`]; returns its manifest digest.
fn import(env: &Env) -> String {
    let img = busybox_image();
    let layout = env.dir.path().join("layout");
    img.write_layout(&layout, "1");
    let out = vm(
        env,
        &[
            "images",
            "import",
            layout.to_str().unwrap(),
            "--name",
            NAME,
            "--json",
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    img.manifest_digest()
}

#[test]
fn image_is_resolved_and_recorded_before_boot() {
    if let Some(why) = cannot_convert() {
        common::skip("image_is_resolved_and_recorded_before_boot", &why);
        return;
    }
    let env = Env::new();
    let digest = import(&env);
    let mut args = vec!["exec", "--dry-run", "--json", "--allow-emulation"];
    let image_args = env.image_args();
    args.extend(image_args.iter().map(String::as_str));
    args.extend(["--image", NAME, "--", "true"]);
    let out = vm(&env, &args);
    let doc = out.json();
    assert_eq!(doc["validation"]["ok"], true, "{doc}");
    let img = &doc["spec"]["image"];
    assert_eq!(img["source"]["reference"], NAME);
    assert_eq!(img["source"]["digest"], digest.as_str());
    assert_eq!(img["config"]["user"], "app");
    assert_eq!(img["config"]["working_dir"], "/srv");
    assert_eq!(
        img["config"]["entrypoint"],
        serde_json::json!(["/bin/sh", "-c"])
    );
    // The image's PATH is kept (the default PATH is not written over it).
    assert_eq!(
        doc["validation"]["normalized"]["env"],
        serde_json::json!([["PATH", "/bin"], ["GREETING", "hi"]]),
        "{doc}"
    );
    // --image and --rootfs are one or the other; an unknown image is refused before boot.
    let out = vm(
        &env,
        &["exec", "--image", NAME, "--rootfs", "/x", "--", "true"],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    let mut args = vec!["exec", "--dry-run"];
    args.extend(image_args.iter().map(String::as_str));
    args.extend(["--image", "not a reference", "--", "true"]);
    let out = vm(&env, &args);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("invalid image reference"),
        "{}",
        out.stderr
    );
}

#[test]
fn image_entrypoint_runs_as_its_user() {
    let env = Env::new();
    if common::no_guest_here(&env, "image_entrypoint_runs_as_its_user") {
        return;
    }
    if let Some(why) = cannot_convert() {
        common::skip("image_entrypoint_runs_as_its_user", &why);
        return;
    }
    import(&env);
    let out = vm(&env, &["exec", "--allow-emulation", "--image", NAME]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "hi\n1000\n/srv\n");
    let out = vm(
        &env,
        &[
            "exec",
            "--allow-emulation",
            "--image",
            NAME,
            "--user",
            "0",
            "--",
            "id",
            "-u",
        ],
    );
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "0\n"),
        "{}",
        out.stderr
    );
}
