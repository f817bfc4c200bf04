//! An agent that cannot start says why where the host can see it: a root image whose erofs
//! superblock is only a magic number passes the host's format check, the guest cannot mount
//! it, and the agent (PID 1) gives up and powers off. The boot error's console tail must hold
//! the agent's own fatal line (what failed, and why), not only the kernel's last words.

use vm_tests::{GuestSpec, boot, ensure};

/// An "erofs" image that is nothing but the superblock magic: accepted by the host's
/// format check, refused by the guest kernel's mount.
fn fake_erofs(dir: &std::path::Path) -> std::path::PathBuf {
    let mut b = vec![0u8; 1 << 20];
    b[1024..1028].copy_from_slice(&0xE0F5_E1E2u32.to_le_bytes());
    let p = dir.join("broken.erofs");
    std::fs::write(&p, b).unwrap();
    p
}

#[test]
fn agent_fatal_error_reaches_the_console_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let image = fake_erofs(tmp.path());
    vm_tests::scenario("agent_fatal_error_reaches_the_console_tail", |driver| {
        let image = image.clone();
        async move {
            let mut g = GuestSpec::new("broken-root");
            g.rootfs = Some(image);
            let err = match boot(driver, &g).await {
                Ok(vm) => {
                    vm.close().await;
                    return Err("a root image the guest cannot mount booted".into());
                }
                Err(e) => e,
            };
            let tail = err
                .split_once("--- guest console tail ---")
                .map(|(_, t)| t)
                .ok_or_else(|| format!("no console tail in the boot error: {err}"))?;
            ensure!(
                tail.contains("vm-agent: fatal: image root root:") && tail.contains("/.vm/lower"),
                "the agent's fatal line is not in the console tail:\n{tail}"
            );
            ensure!(
                tail.contains("vm-agent: powering off"),
                "no power-off line in the console tail:\n{tail}"
            );
            Ok(())
        }
    });
}
