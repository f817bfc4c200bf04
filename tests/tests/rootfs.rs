//! Image roots (`image.rootfs`): a small erofs root built here (static busybox, a passwd
//! with a non-root user, a marker file) becomes the guest's root under a tmpfs overlay.
//! In it: commands run inside the image with /proc, /sys, /dev and /tmp present; the image's
//! defaults apply (User as uid/gid with its groups, WorkingDir, Env under the explicit
//! environment, Entrypoint + Cmd when no command is given); file operations work on the image
//! root with the same confinement; a host mount appears inside it, read-only. Writes to
//! image files land in the upper layer and are gone in the next VM, and the erofs file on the
//! host is byte-identical afterwards.

use std::time::{Duration, Instant};
use vm_agent_protocol::protocol::Command;

use vm_sandbox::{PublishSpec, Run, ServeSpec};
use vm_spec::{ImageConfig, Mount};
use vm_tests::host::{http_get, sha256_hex};
use vm_tests::rootfs::{BUSYBOX_ROOT_MARKER, busybox_root, missing_tools};
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure, exec_as, exec_ok, sh};

const MARKER: &str = BUSYBOX_ROOT_MARKER;
const MODELS: &str = "/models";

fn image_config() -> ImageConfig {
    ImageConfig {
        env: vec![
            ("PATH".into(), "/bin".into()),
            ("GREETING".into(), "from-image".into()),
            ("MODE".into(), "image".into()),
        ],
        working_dir: Some("/opt/app".into()),
        user: Some("app".into()),
        entrypoint: vec!["/bin/sh".into(), "-c".into()],
        cmd: vec!["echo entry $GREETING $MODE; id -u".into()],
    }
}

async fn runs_in_image_root(vm: &MicroVm) -> Result<(), String> {
    let marker = exec_ok(vm, &format!("cat {MARKER}")).await?;
    ensure!(marker == "image\n", "{MARKER} reads {marker:?}");
    // The initramfs (with /init, the agent) is not visible.
    let init = sh(vm, "test -e /init").await?;
    ensure!(!init.status.success(), "/init of the initramfs is visible");
    exec_ok(
        vm,
        "test -r /proc/self/status && test -d /sys/fs/cgroup && test -c /dev/null \
         && test -d /tmp && test -w /tmp && test -d /dev/pts",
    )
    .await?;
    let mounts = exec_ok(vm, "cat /proc/mounts").await?;
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/"));
    ensure!(
        root.is_some_and(|l| l.starts_with("overlay / overlay")),
        "/ is not the overlay: {mounts}"
    );
    Ok(())
}

async fn user_and_groups(vm: &MicroVm) -> Result<(), String> {
    let ids = exec_ok(vm, "id -u; id -g; id -G").await?;
    let lines: Vec<&str> = ids.lines().collect();
    ensure!(lines.first() == Some(&"1000"), "uid: {ids:?}");
    ensure!(lines.get(1) == Some(&"1000"), "gid: {ids:?}");
    let groups: Vec<&str> = lines.get(2).unwrap_or(&"").split_whitespace().collect();
    ensure!(
        groups.contains(&"1000") && groups.contains(&"50") && !groups.contains(&"0"),
        "groups: {ids:?}"
    );
    // Setuid binaries cannot raise it: no_new_privs is set for the user's processes.
    let nnp = exec_ok(vm, "grep NoNewPrivs /proc/self/status").await?;
    ensure!(nnp.split_whitespace().nth(1) == Some("1"), "{nnp:?}");
    // Root's files stay root's.
    let w = sh(vm, &format!("echo x > {MARKER}")).await?;
    ensure!(!w.status.success(), "user app could overwrite {MARKER}");
    Ok(())
}

async fn workdir_and_env(vm: &MicroVm) -> Result<(), String> {
    let pwd = exec_ok(vm, "pwd").await?;
    ensure!(pwd == "/opt/app\n", "default working directory {pwd:?}");
    let env = exec_ok(vm, "env | sort").await?;
    for want in ["GREETING=from-image", "MODE=explicit", "PATH=/bin"] {
        ensure!(env.lines().any(|l| l == want), "{want} missing: {env:?}");
    }
    ensure!(
        !env.lines()
            .any(|l| l.starts_with("HOME=") || l.starts_with("USER=")),
        "a variable nobody set: {env:?}"
    );
    Ok(())
}

async fn entrypoint_runs_without_command(vm: &MicroVm) -> Result<(), String> {
    let out = vm
        .run(Run {
            command: Command::Argv(Vec::new()),
            ..Default::default()
        })
        .await
        .ctx("running the image's entrypoint")?;
    let text = String::from_utf8_lossy(&out.output);
    ensure!(
        out.status.success() && text == "entry from-image explicit\n1000\n",
        "entrypoint + cmd gave {:?}: {text:?}",
        out.status
    );
    Ok(())
}

async fn writes_land_in_the_upper(vm: &MicroVm) -> Result<(), String> {
    let text = exec_as(vm, "0", &format!("echo changed > {MARKER}; cat {MARKER}")).await?;
    ensure!(
        text == "changed\n",
        "after the write {MARKER} reads {text:?}"
    );
    let lower = exec_as(vm, "0", "grep ' /.vm/lower ' /proc/mounts || true").await?;
    // The lower is mounted outside the new root, so it is not even listed here.
    ensure!(
        lower.is_empty(),
        "the image's lower mount is visible: {lower:?}"
    );
    Ok(())
}

async fn file_ops_are_confined(vm: &MicroVm) -> Result<(), String> {
    vm.write_file("out/f.txt", b"written by the host")
        .await
        .ctx("write_file")?;
    let back = vm.read_file("out/f.txt").await.ctx("read_file")?;
    ensure!(back == b"written by the host", "read back {back:?}");
    let seen = exec_ok(vm, "cat /work/out/f.txt").await?;
    ensure!(seen == "written by the host", "the guest sees {seen:?}");
    let files = vm.walk("").await.ctx("walk")?;
    ensure!(files.contains(&"out/f.txt".to_string()), "walk: {files:?}");
    // The root belongs to the image's user, so its work can write there.
    exec_ok(vm, "echo mine > /work/mine.txt").await?;
    exec_ok(vm, &format!("ln -s {MARKER} /work/escape")).await?;
    ensure!(
        vm.read_file("escape").await.is_err(),
        "a symlink out of the root was followed"
    );
    ensure!(
        vm.read_file("../etc/passwd").await.is_err(),
        "a path out of the root was accepted"
    );
    Ok(())
}

async fn host_mount_inside(vm: &MicroVm) -> Result<(), String> {
    let a = exec_ok(vm, &format!("cat {MODELS}/a.txt")).await?;
    ensure!(a == "alpha\n", "{MODELS}/a.txt reads {a:?}");
    let w = sh(vm, &format!("echo x > {MODELS}/a.txt")).await?;
    ensure!(!w.status.success(), "a write to the host mount succeeded");
    let w = exec_as(vm, "0", &format!("echo x > {MODELS}/a.txt 2>&1 || true")).await?;
    ensure!(w.contains("Read-only file system"), "root's write: {w:?}");
    Ok(())
}

/// A server started with `serve` runs in the image root as the image's user, in its working
/// directory, and answers on the published host port.
async fn serve_in_image_root(vm: &MicroVm) -> Result<(), String> {
    vm.write_file("srv/index.html", b"image root page\n")
        .await
        .ctx("write index.html")?;
    let line = "id -u > /tmp/serve-id; pwd >> /tmp/serve-id; \
                exec httpd -f -p 127.0.0.1:8000 -h /work/srv";
    let spec = ServeSpec {
        argv: vec!["sh".into(), "-c".into(), line.into()],
        publish: vec![PublishSpec::parse("0:8000").ctx("publish spec")?],
    };
    let server = vm.serve(spec).await.ctx("serve httpd")?;
    let addr = server.addr();
    let deadline = Instant::now() + Duration::from_secs(30);
    let reply = loop {
        let r = tokio::task::spawn_blocking(move || {
            http_get(addr, "/index.html", Duration::from_secs(2))
        })
        .await
        .map_err(|e| format!("join: {e}"))?;
        match r {
            Ok(r) if r.text().starts_with("HTTP/1.") => break r.text(),
            other => {
                ensure!(server.running(), "httpd exited: {}", server.output());
                ensure!(Instant::now() < deadline, "no answer in 30 s: {other:?}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    ensure!(reply.ends_with("image root page\n"), "reply {reply:?}");
    let id = exec_ok(vm, "cat /tmp/serve-id").await?;
    ensure!(id == "1000\n/opt/app\n", "the server ran as/in {id:?}");
    server.stop().await.ctx("stop")?;
    Ok(())
}

#[test]
fn rootfs() {
    if let Some(why) = missing_tools() {
        vm_test_support::skip("rootfs", &why);
        return;
    }
    vm_tests::scenario("rootfs", |driver| async move {
        let tmp = tempfile::tempdir().ctx("temp dir")?;
        let image = busybox_root(tmp.path())?;
        let before = sha256_hex(&std::fs::read(&image).ctx("reading the image")?);
        let models = tmp.path().join("models");
        std::fs::create_dir(&models).ctx("mkdir models")?;
        std::fs::write(models.join("a.txt"), "alpha\n").ctx("writing a.txt")?;

        let mut g = GuestSpec::new("rootfs");
        g.rootfs = Some(image.clone());
        g.image_config = image_config();
        g.env = vec![("MODE".into(), "explicit".into())];
        g.mounts = vec![Mount::read_only(&models, MODELS)];
        g.mount_cache = Some(tmp.path().join("cache"));
        let vm = boot(driver, &g).await?;
        let mut c = Cases::new("rootfs", driver);
        c.run("runs_in_image_root", runs_in_image_root(&vm)).await;
        c.run("user_and_groups", user_and_groups(&vm)).await;
        c.run("workdir_and_env", workdir_and_env(&vm)).await;
        c.run("entrypoint", entrypoint_runs_without_command(&vm))
            .await;
        c.run("file_ops_are_confined", file_ops_are_confined(&vm))
            .await;
        c.run("host_mount_inside", host_mount_inside(&vm)).await;
        c.run("serve_in_image_root", serve_in_image_root(&vm)).await;
        c.run("writes_land_in_the_upper", writes_land_in_the_upper(&vm))
            .await;
        vm.close().await;

        // A second VM on the same file: no config, so root; the first VM's writes are gone.
        let mut g2 = GuestSpec::new("rootfs-again");
        g2.rootfs = Some(image.clone());
        let vm = boot(driver, &g2).await?;
        c.run("writes_vanish_with_the_vm", async {
            let marker = exec_ok(&vm, &format!("cat {MARKER}")).await?;
            ensure!(marker == "image\n", "{MARKER} reads {marker:?} in a new VM");
            let left = sh(&vm, "test -e /work/mine.txt").await?;
            ensure!(!left.status.success(), "/work/mine.txt survived the VM");
            let uid = exec_ok(&vm, "id -u").await?;
            ensure!(uid == "0\n", "no User configured, yet uid {uid:?}");
            Ok(())
        })
        .await;
        vm.close().await;

        c.run("image_file_unchanged", async {
            let after = sha256_hex(&std::fs::read(&image).ctx("reading the image")?);
            ensure!(after == before, "the erofs image changed on the host");
            Ok(())
        })
        .await;
        c.finish()
    });
}
