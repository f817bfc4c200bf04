//! Image roots for the tests and benchmarks: a small busybox erofs root built on the spot,
//! and the cached Debian python3 + numpy root of `images/rootfs-debian.sh`.

use std::path::{Path, PathBuf};
use std::process::Command as HostCommand;

use crate::cases::Ctx;
use crate::ensure;

/// A file in the busybox root holding `image\n`.
pub const BUSYBOX_ROOT_MARKER: &str = "/usr/share/vm-marker";

/// What [`busybox_root`] needs from the host and lacks here (`/bin/busybox` from
/// busybox-static, `mkfs.erofs` from erofs-utils; ci/setup.sh installs both), if anything.
pub fn missing_tools() -> Option<String> {
    let mut missing = Vec::new();
    if !Path::new("/bin/busybox").is_file() {
        missing.push("/bin/busybox (busybox-static)");
    }
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
    };
    if !on_path("mkfs.erofs") {
        missing.push("mkfs.erofs (erofs-utils)");
    }
    (!missing.is_empty()).then(|| format!("this host lacks {}", missing.join(" and ")))
}

/// Builds `<tmp>/root.erofs`: busybox with every applet linked in /bin, /etc/passwd and
/// /etc/group with `app` (1000:1000, also in `staff` 50), a marker file, /opt/app.
pub fn busybox_root(tmp: &Path) -> Result<PathBuf, String> {
    let root = tmp.join("root");
    for d in ["bin", "etc", "usr/share", "opt/app", "root"] {
        std::fs::create_dir_all(root.join(d)).ctx(&format!("mkdir {d}"))?;
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).ctx("copying /bin/busybox")?;
    let list = HostCommand::new("/bin/busybox")
        .arg("--list")
        .output()
        .ctx("busybox --list")?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" && !applet.is_empty() {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))
                .ctx(&format!("linking {applet}"))?;
        }
    }
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/opt/app:/bin/sh\n",
    )
    .ctx("writing passwd")?;
    std::fs::write(
        root.join("etc/group"),
        "root:x:0:\napp:x:1000:\nstaff:x:50:app\n",
    )
    .ctx("writing group")?;
    std::fs::write(
        root.join(BUSYBOX_ROOT_MARKER.trim_start_matches('/')),
        "image\n",
    )
    .ctx("marker")?;
    let image = tmp.join("root.erofs");
    let out = HostCommand::new("mkfs.erofs")
        .arg(&image)
        .arg(&root)
        .output()
        .ctx("running mkfs.erofs (erofs-utils)")?;
    ensure!(
        out.status.success(),
        "mkfs.erofs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(image)
}

/// The variable naming the Debian root explicitly: how a pack run elsewhere (the kvm proof,
/// the nested-KVM runner) is handed the image, which is too large to pack.
pub const DEBIAN_ROOT_VAR: &str = "VM_TEST_DEBIAN_ROOT";

/// The Debian root: the file `VM_TEST_DEBIAN_ROOT` names (it must exist), else the image
/// `images/rootfs-debian.sh` cached on this host; `None` when neither is there (a pack on
/// another host without the variable, or a host that has not built it).
pub fn debian_root() -> Result<Option<PathBuf>, String> {
    if let Some(path) = std::env::var_os(DEBIAN_ROOT_VAR) {
        let path = PathBuf::from(path);
        ensure!(
            path.is_file(),
            "{DEBIAN_ROOT_VAR}={} is not a file",
            path.display()
        );
        return Ok(Some(path));
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../images/rootfs-debian.sh");
    if !script.is_file() {
        return Ok(None);
    }
    let out = HostCommand::new("bash")
        .arg(&script)
        .arg("--print-path")
        .output()
        .ctx("running images/rootfs-debian.sh --print-path")?;
    if !out.status.success() {
        return Ok(None);
    }
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(Some(PathBuf::from(path)))
}
