//! A real Debian userland as the guest's root: the bookworm python3 + numpy erofs image that
//! `images/rootfs-debian.sh` builds and caches (ci/setup.sh builds it when missing). In the
//! guest, numpy imports and computes, commands run as the configured user, a write to `/usr`
//! lands in the tmpfs upper and is gone in the next VM, and the image file's sha256 is the
//! same afterwards.

use std::path::Path;

use vm_spec::ImageConfig;
use vm_tests::host::sha256_hex;
use vm_tests::rootfs::debian_root;
use vm_tests::{Cases, Ctx, GuestSpec, boot, ensure, exec_as, exec_ok, sh};

fn spec(name: &str, image: &Path) -> GuestSpec {
    let mut g = GuestSpec::new(name);
    g.mem_mib = 512;
    g.rootfs = Some(image.to_path_buf());
    g.env = Vec::new();
    g.image_config = ImageConfig {
        env: vec![(
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        )],
        user: Some("app".into()),
        ..ImageConfig::default()
    };
    g
}

#[test]
fn rootfs_debian() {
    let image = match debian_root() {
        Ok(Some(p)) => p,
        Ok(None) => {
            vm_test_support::skip(
                "rootfs_debian",
                "the Debian rootfs is not built on this host (images/rootfs-debian.sh, \
                 which ci/setup-tests.sh runs) and VM_TEST_DEBIAN_ROOT names no image",
            );
            return;
        }
        Err(e) => panic!("{e}"),
    };
    vm_tests::scenario("rootfs_debian", |driver| {
        let image = image.clone();
        async move {
            let before = sha256_hex(&std::fs::read(&image).ctx("reading the image")?);
            let vm = boot(driver, &spec("debian", &image)).await?;
            let mut c = Cases::new("rootfs_debian", driver);
            c.run("numpy", async {
                let out = exec_ok(
                    &vm,
                    "python3 -c 'import numpy; print(numpy.arange(6).sum())'",
                )
                .await?;
                ensure!(out == "15\n", "python3 printed {out:?}");
                Ok(())
            })
            .await;
            c.run("runs_as_user", async {
                let uid = exec_ok(&vm, "id -u; id -un").await?;
                ensure!(uid == "1000\napp\n", "id: {uid:?}");
                let w = sh(&vm, "echo x > /usr/vm-upper-test").await?;
                ensure!(!w.status.success(), "user app could write to /usr");
                Ok(())
            })
            .await;
            c.run("usr_write_lands_in_upper", async {
                let out = exec_as(
                    &vm,
                    "root",
                    "echo upper > /usr/vm-upper-test && cat /usr/vm-upper-test",
                )
                .await?;
                ensure!(out == "upper\n", "read back {out:?}");
                Ok(())
            })
            .await;
            vm.close().await;

            let vm = boot(driver, &spec("debian-again", &image)).await?;
            c.run("write_gone_in_next_vm", async {
                let gone = sh(&vm, "test -e /usr/vm-upper-test").await?;
                ensure!(!gone.status.success(), "/usr/vm-upper-test survived the VM");
                Ok(())
            })
            .await;
            vm.close().await;
            c.run("image_unchanged", async {
                let after = sha256_hex(&std::fs::read(&image).ctx("reading the image")?);
                ensure!(
                    after == before,
                    "the erofs image changed: {before} -> {after}"
                );
                Ok(())
            })
            .await;
            c.finish()
        }
    });
}
