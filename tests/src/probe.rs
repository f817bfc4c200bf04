//! The static guest programs scenarios run inside the guest, built here with `cc -static` (the
//! guest has no libc), or taken prebuilt from an environment variable (the kvm proof pack
//! carries them for hosts without a C compiler), and copied into the guest's work directory:
//! - `vsock-probe` (`tests/guest-tools/vsock_probe.c`: `connect`, `hold`, `sink`), the vsock
//!   scenarios' probe, prebuilt in `VM_TEST_VSOCK_PROBE`;
//! - `fs-probe` (`tests/guest-tools/fs_probe.c`: `setxattr`, `mmap-write`, `trunc`,
//!   `mmap-hash`), what the mount scenario tries that busybox cannot, prebuilt in
//!   `VM_TEST_FS_PROBE`.

use std::path::Path;

use crate::{MicroVm, ensure, exec_ok};

/// A guest program: its file name in the guest's work directory (run it as `./NAME`), its
/// source, and the variable naming a prebuilt copy.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    /// File name in the guest.
    pub name: &'static str,
    source: &'static str,
    prebuilt_env: &'static str,
}

/// The vsock probe.
pub const VSOCK: Probe = Probe {
    name: "vsock-probe",
    source: include_str!("../guest-tools/vsock_probe.c"),
    prebuilt_env: "VM_TEST_VSOCK_PROBE",
};

/// The file-system probe.
pub const FS: Probe = Probe {
    name: "fs-probe",
    source: include_str!("../guest-tools/fs_probe.c"),
    prebuilt_env: "VM_TEST_FS_PROBE",
};

/// The vsock probe's file name in the guest's work directory.
pub const PROBE: &str = VSOCK.name;

impl Probe {
    /// Builds it for the guest into `dir`, static; its bytes.
    fn build(&self, dir: &Path) -> Result<Vec<u8>, String> {
        let src = dir.join(format!("{}.c", self.name));
        std::fs::write(&src, self.source).map_err(|e| format!("writing {}: {e}", src.display()))?;
        let out = dir.join(self.name);
        let r = std::process::Command::new("cc")
            .args(["-static", "-O2", "-o"])
            .arg(&out)
            .arg(&src)
            .output()
            .map_err(|e| format!("running cc (build-essential, installed by ci/setup.sh): {e}"))?;
        ensure!(
            r.status.success(),
            "cc -static {}: {}",
            src.display(),
            String::from_utf8_lossy(&r.stderr)
        );
        std::fs::read(&out).map_err(|e| format!("reading {}: {e}", out.display()))
    }

    /// Its bytes: the prebuilt static binary its variable names, else built here.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        if let Some(path) = std::env::var_os(self.prebuilt_env) {
            let path = Path::new(&path);
            return std::fs::read(path)
                .map_err(|e| format!("reading {} {}: {e}", self.prebuilt_env, path.display()));
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        self.build(dir.path())
    }

    /// Copies it into the guest's work directory, executable.
    pub async fn install(&self, vm: &MicroVm) -> Result<(), String> {
        let bin = self.bytes()?;
        vm.write_file(self.name, &bin)
            .await
            .map_err(|e| format!("copying {} in: {e}", self.name))?;
        exec_ok(vm, &format!("chmod 755 {}", self.name)).await?;
        Ok(())
    }
}

/// Copies the vsock probe into the guest's work directory, executable.
pub async fn install_probe(vm: &MicroVm) -> Result<(), String> {
    VSOCK.install(vm).await
}
