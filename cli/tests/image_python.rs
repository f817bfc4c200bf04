//! A real userland through the whole OCI road: the Debian bookworm python3 + numpy root
//! (`images/oci-debian.sh`, the same files `images/rootfs-debian.sh` boots as `--rootfs`) is
//! pushed as an OCI image to a real `docker-registry` on 127.0.0.1 with `skopeo`, pulled with
//! `vm images pull`, and booted with `--image` under tcg: the image's `Cmd` prints numpy's
//! `arange(6).sum()`, commands run as the image's `User` in its `WorkingDir`, the root is
//! read-only to that user, a root write lands in the tmpfs upper and is gone in the next VM,
//! Python's `madvise`, `posix_fadvise`, `membarrier` and glibc's rseq work in the guest, and
//! the cached erofs is byte-for-byte unchanged.

mod common;
#[path = "../../oci/tests/common/mod.rs"]
mod oci_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Env;
use oci_common::registry::Registry;
use oci_common::{cannot_convert, have};
use sha2::{Digest, Sha256};

const TEST: &str = "python_image_pulled_from_a_registry_boots";

/// The OCI layout of the Debian root and its tag, when `images/oci-debian.sh` has built it.
fn debian_layout() -> Option<(PathBuf, String)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/oci-debian.sh");
    let out = Command::new(script).arg("--print-path").output().ok()?;
    let line = String::from_utf8(out.stdout).ok()?;
    let (dir, tag) = line.trim().rsplit_once(':')?;
    out.status
        .success()
        .then(|| (PathBuf::from(dir), tag.to_owned()))
}

fn sha256_file(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

#[test]
fn python_image_pulled_from_a_registry_boots() {
    let env = Env::new();
    if common::no_guest_here(&env, TEST) {
        return;
    }
    if let Some(why) = cannot_convert() {
        return common::skip(TEST, &why);
    }
    if !have("docker-registry") || !have("skopeo") {
        return common::skip(
            TEST,
            "docker-registry or skopeo missing (ci/setup-tests.sh)",
        );
    }
    let Some((layout, tag)) = debian_layout() else {
        return common::skip(
            TEST,
            "the Debian OCI image is not built on this host \
             (images/oci-debian.sh, which ci/setup-tests.sh runs)",
        );
    };
    let reg = Registry::start();
    reg.push(&layout, &tag, "debian/python", false);
    let reference = format!("{}/debian/python:{tag}", reg.addr);

    let out = env.run_with_store(&["images", "pull", &reference, "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let pulled = out.json();
    let erofs = PathBuf::from(pulled["erofs"].as_str().unwrap());
    let before = sha256_file(&erofs);
    assert_eq!(pulled["config"]["user"], "app", "{pulled}");
    assert_eq!(pulled["config"]["working_dir"], "/home/app", "{pulled}");

    // One VM per call: `sh -c script` as `user` (the image's own when `None`), or the image's
    // Cmd when `script` is `None`.
    let boot = |user: Option<&str>, script: Option<&str>| {
        let mut args = vec!["exec", "--allow-emulation", "--memory", "512M"];
        args.extend(["--image", &reference]);
        if let Some(u) = user {
            args.extend(["--user", u]);
        }
        if let Some(s) = script {
            args.extend(["--", "sh", "-c", s]);
        }
        let out = env.run_with_store(&args);
        assert_eq!(out.code, 0, "{:?}: {}", script, out.stderr);
        out.stdout
    };
    assert_eq!(
        boot(None, None),
        "15
",
        "the image's Cmd"
    );
    assert_eq!(
        boot(
            None,
            Some(
                "id -u; id -un; pwd; echo x > /usr/vm-upper-test 2>/dev/null && echo wrote || echo refused"
            )
        ),
        "1000\napp\n/home/app\nrefused\n"
    );
    let write = "echo upper > /usr/vm-upper-test && cat /usr/vm-upper-test";
    assert_eq!(boot(Some("0"), Some(write)), "upper\n");
    let check = "test -e /usr/vm-upper-test && echo survived || echo gone";
    assert_eq!(
        boot(Some("0"), Some(check)),
        "gone\n",
        "the write outlived its VM"
    );

    // The guest kernel's system calls a real userland uses: madvise and fadvise (allocators,
    // loaders), membarrier, and glibc's rseq registration (`__rseq_size` is 0 when it failed).
    let syscalls = "import ctypes, mmap, os
m = mmap.mmap(-1, 1 << 20)
m.madvise(mmap.MADV_DONTNEED)
fd = os.open('/etc/passwd', os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
libc = ctypes.CDLL(None, use_errno=True)
query = libc.syscall(324, 0, 0, 0)
print('madvise fadvise', 'membarrier' if query >= 0 else os.strerror(ctypes.get_errno()),
      'rseq' if ctypes.c_uint.in_dll(libc, '__rseq_size').value else 'no-rseq')";
    let script = format!("python3 -c \"{syscalls}\"");
    assert_eq!(
        boot(None, Some(&script)),
        "madvise fadvise membarrier rseq\n",
        "a system call missing from the guest kernel"
    );

    assert_eq!(sha256_file(&erofs), before, "the image's erofs changed");
}
