//! Smoke test on a real guest through the default registry (kvm if the host has hardware
//! virtualization, else tcg with the explicit emulation policy). Without the guest images
//! (`images/build.sh`) it fails (a SKIP only with `VM_TEST_ALLOW_NO_DRIVER=1`); a driver
//! selection error is a failure like any other.

mod common;

use std::time::Duration;

use vm_sandbox::{MicroVm, Options, images};
use vm_spec::{Guarantees, Limits, Mount, Policy, Spec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_guest_exec_files_and_mounts() {
    const NAME: &str = "real_guest_exec_files_and_mounts";
    let image = match images::default_spec_image() {
        Ok(i) => i,
        Err(e) => return vm_test_support::no_guest_driver(NAME, &e.to_string()),
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("a.txt"), b"from the host").unwrap();
    let limits = Limits {
        vcpus: 1,
        mem_mib: 256,
        pids: i64::from(vm_spec::DEFAULT_PIDS),
        wall: Some(Duration::from_secs(600)),
    };
    let guarantees = Guarantees::untrusted(limits, vec![Mount::read_only(&data, "/data")])
        .with_env("PATH", "/usr/bin:/bin:/usr/sbin:/sbin");
    let spec = Spec::new(image, guarantees);
    let options = Options {
        policy: Policy {
            allow_emulation: true,
            allow_weaker_jail: false,
        },
        mount_cache: Some(tmp.path().join("cache")),
        ..Options::default()
    };
    let vm = MicroVm::boot(spec, options)
        .await
        .unwrap_or_else(|e| panic!("boot failed: {e:?}"));
    let out = vm.exec("echo hi; pwd; cat /data/a.txt").await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.output),
        "hi\n/work\nfrom the host"
    );
    assert!(out.status.success(), "{out:?}");
    // The mount is read-only: the shell cannot create the file, and says why.
    let out = vm.exec("echo x > /data/new; echo $?").await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.output),
        "/bin/sh: can't create /data/new: Read-only file system\n1\n"
    );
    let out = vm.exec("ls /data").await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.output), "a.txt\n");
    vm.write_file("d/f.txt", b"guest file").await.unwrap();
    assert_eq!(vm.read_file("d/f.txt").await.unwrap(), b"guest file");
    assert_eq!(vm.glob("**/*.txt").await.unwrap(), ["d/f.txt"]);
    vm.close().await;
    assert!(!vm.machine().is_running());
}
