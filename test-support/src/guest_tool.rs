//! The static guest programs the scenarios run inside a guest, each built with `cc -static`
//! (the guest has no libc), or taken prebuilt from an environment variable (the kvm proof pack
//! carries them for hosts without a C compiler). `vm_tests::probe` copies them into a booted
//! guest; the CLI's tests mount the vsock probe (`-v`).
//!
//! - `vsock-probe` (`tests/guest-tools/vsock_probe.c`: `connect`, `hold`, `sink`, `http`),
//!   prebuilt in `VM_TEST_VSOCK_PROBE`;
//! - `fs-probe` (`tests/guest-tools/fs_probe.c`: `setxattr`, `mmap-write`, `trunc`,
//!   `mmap-hash`), what the mount scenario tries that busybox cannot, prebuilt in
//!   `VM_TEST_FS_PROBE`.

use std::path::Path;

/// A guest program: its file name (run it as `./NAME` from the directory it is copied to), its
/// source (embedded, so a test binary needs only a C compiler where it runs) and the variable
/// naming a prebuilt copy.
#[derive(Debug, Clone, Copy)]
pub struct GuestTool {
    /// File name in the guest.
    pub name: &'static str,
    source: &'static str,
    prebuilt_env: &'static str,
}

/// The vsock probe.
pub const VSOCK_PROBE: GuestTool = GuestTool {
    name: "vsock-probe",
    source: include_str!("../../tests/guest-tools/vsock_probe.c"),
    prebuilt_env: "VM_TEST_VSOCK_PROBE",
};

/// The file-system probe.
pub const FS_PROBE: GuestTool = GuestTool {
    name: "fs-probe",
    source: include_str!("../../tests/guest-tools/fs_probe.c"),
    prebuilt_env: "VM_TEST_FS_PROBE",
};

/// The vsock probe's file name.
pub const PROBE: &str = VSOCK_PROBE.name;

impl GuestTool {
    /// Builds it for the guest into `dir`; its bytes.
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
        if !r.status.success() {
            return Err(format!(
                "cc -static {}: {}",
                src.display(),
                String::from_utf8_lossy(&r.stderr)
            ));
        }
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
}

/// The vsock probe's bytes: the prebuilt static binary `VM_TEST_VSOCK_PROBE` names, else
/// built here.
pub fn vsock_probe() -> Result<Vec<u8>, String> {
    VSOCK_PROBE.bytes()
}
