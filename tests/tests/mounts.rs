//! Mounts: a host directory and a host file are readable in the guest, writing them fails,
//! and the host copies are byte-identical afterwards.

use std::path::Path;

use vm_spec::Mount;
use vm_tests::host::{hash_tree, pseudo_random, sha256_hex};
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure, exec_ok, sh};

const DIR_GUEST: &str = "/models";
const DISK_GUEST: &str = "/data/disk.img";
const DISK_BYTES: usize = 1024 * 1024;

fn populate(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join("a.txt"), b"alpha\n")?;
    std::fs::write(dir.join("weights.bin"), pseudo_random(100 * 1024, 11))?;
    std::fs::create_dir_all(dir.join("nested/dir"))?;
    std::fs::write(dir.join("nested/dir/c.txt"), b"nested content\n")?;
    Ok(())
}

async fn dir_is_readable(vm: &MicroVm, host: &Path) -> Result<(), String> {
    let a = exec_ok(vm, &format!("cat {DIR_GUEST}/a.txt")).await?;
    ensure!(a == "alpha\n", "{DIR_GUEST}/a.txt reads {a:?}");
    let c = exec_ok(vm, &format!("cat {DIR_GUEST}/nested/dir/c.txt")).await?;
    ensure!(c == "nested content\n", "nested file reads {c:?}");
    let sum = exec_ok(vm, &format!("sha256sum {DIR_GUEST}/weights.bin")).await?;
    let want = sha256_hex(&std::fs::read(host.join("weights.bin")).ctx("reading host weights")?);
    ensure!(sum.starts_with(&want), "guest sha256 {sum:?}, host {want}");
    let mounts = exec_ok(vm, "cat /proc/mounts").await?;
    let line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(DIR_GUEST));
    let ro = line
        .and_then(|l| l.split_whitespace().nth(3))
        .is_some_and(|o| o.split(',').any(|f| f == "ro"));
    ensure!(ro, "{DIR_GUEST} is not mounted read-only: {line:?}");
    Ok(())
}

async fn dir_writes_fail(vm: &MicroVm) -> Result<(), String> {
    for line in [
        format!("echo x > {DIR_GUEST}/new.txt"),
        format!("echo x >> {DIR_GUEST}/a.txt"),
        format!("rm {DIR_GUEST}/nested/dir/c.txt"),
        format!("mkdir {DIR_GUEST}/newdir"),
        format!("touch {DIR_GUEST}/a.txt"),
    ] {
        let out = sh(vm, &line).await?;
        let text = String::from_utf8_lossy(&out.output);
        ensure!(
            !out.status.success(),
            "{line:?} succeeded on a read-only mount"
        );
        ensure!(
            text.contains("Read-only file system"),
            "{line:?} failed without EROFS: {text:?}"
        );
    }
    Ok(())
}

async fn disk_is_readable(vm: &MicroVm, host_file: &Path) -> Result<(), String> {
    let want = sha256_hex(&std::fs::read(host_file).ctx("reading host disk file")?);
    let sum = exec_ok(
        vm,
        &format!("dd if={DISK_GUEST} bs=64k 2>/dev/null | sha256sum"),
    )
    .await?;
    ensure!(
        sum.starts_with(&want),
        "guest disk sha256 {sum:?}, host {want}"
    );
    let size = exec_ok(vm, &format!("cat {DISK_GUEST} | wc -c")).await?;
    ensure!(
        size.trim() == DISK_BYTES.to_string(),
        "guest disk is {size:?} bytes"
    );
    Ok(())
}

async fn disk_writes_fail(vm: &MicroVm) -> Result<(), String> {
    for line in [
        format!("dd if=/dev/zero of={DISK_GUEST} bs=512 count=1 conv=notrunc"),
        format!("printf owned > {DISK_GUEST}"),
    ] {
        let out = sh(vm, &line).await?;
        let text = String::from_utf8_lossy(&out.output);
        ensure!(
            !out.status.success(),
            "{line:?} succeeded on a read-only disk: {text:?}"
        );
        eprintln!("    {line:?} refused: {}", text.trim());
    }
    let head = exec_ok(vm, &format!("head -c 5 {DISK_GUEST} | od -An -tx1")).await?;
    ensure!(
        !head.contains("6f 77 6e 65 64"),
        "the guest sees the written bytes: {head:?}"
    );
    Ok(())
}

#[test]
fn mounts() {
    vm_tests::scenario("mounts", |driver| async move {
        let tmp = tempfile::tempdir().ctx("temp dir")?;
        let dir = tmp.path().join("models");
        std::fs::create_dir(&dir).ctx("mkdir models")?;
        populate(&dir).ctx("populating the host directory")?;
        let disk = tmp.path().join("disk.img");
        std::fs::write(&disk, pseudo_random(DISK_BYTES, 99)).ctx("writing the host disk file")?;
        let before = hash_tree(&dir).ctx("hashing the host directory")?;
        let disk_before = sha256_hex(&std::fs::read(&disk).ctx("reading disk")?);

        let mut g = GuestSpec::new("mounts");
        g.mounts = vec![
            Mount::read_only(&dir, DIR_GUEST),
            Mount::read_only(&disk, DISK_GUEST),
        ];
        g.mount_cache = Some(tmp.path().join("cache"));
        let vm = boot(driver, &g).await?;
        let mut c = Cases::new("mounts", driver);
        c.run("dir_is_readable", dir_is_readable(&vm, &dir)).await;
        c.run("dir_writes_fail", dir_writes_fail(&vm)).await;
        c.run("disk_is_readable", disk_is_readable(&vm, &disk))
            .await;
        c.run("disk_writes_fail", disk_writes_fail(&vm)).await;
        vm.close().await;

        c.run("host_unchanged", async {
            let after = hash_tree(&dir).ctx("hashing the host directory again")?;
            ensure!(
                after == before,
                "host directory changed:\nbefore {before:?}\nafter  {after:?}"
            );
            let disk_after = sha256_hex(&std::fs::read(&disk).ctx("reading disk")?);
            ensure!(disk_after == disk_before, "host disk file changed");
            Ok(())
        })
        .await;
        c.finish()
    });
}
