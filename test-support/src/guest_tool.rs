//! `vsock-probe`, the static guest program the scenarios run inside a guest
//! (`tests/guest-tools/vsock_probe.c`: `connect`, `hold`, `sink`, `http`). Built with
//! `cc -static`, or taken prebuilt from `VM_TEST_VSOCK_PROBE` (the kvm proof pack carries one
//! for hosts without a C compiler). `vm_tests::probe` copies it into a booted guest; the CLI's
//! tests mount it (`-v`).

use std::path::Path;

/// The probe's file name (run it as `./vsock-probe` from the directory it is copied to).
pub const PROBE: &str = "vsock-probe";

/// The probe's source, embedded so a test binary needs only a C compiler where it runs.
const PROBE_SOURCE: &str = include_str!("../../tests/guest-tools/vsock_probe.c");

/// Builds the probe for the guest (static: the guest has no libc).
fn build_probe(dir: &Path) -> Result<Vec<u8>, String> {
    let src = dir.join("vsock_probe.c");
    std::fs::write(&src, PROBE_SOURCE).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let out = dir.join(PROBE);
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

/// The probe's bytes: the prebuilt static binary `VM_TEST_VSOCK_PROBE` names, else built here.
pub fn vsock_probe() -> Result<Vec<u8>, String> {
    if let Some(path) = std::env::var_os("VM_TEST_VSOCK_PROBE") {
        let path = Path::new(&path);
        return std::fs::read(path)
            .map_err(|e| format!("reading VM_TEST_VSOCK_PROBE {}: {e}", path.display()));
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    build_probe(dir.path())
}
