//! `vsock-probe`, the static guest program the vsock scenarios run inside the guest
//! (`tests/guest-tools/vsock_probe.c`: `connect`, `hold`, `sink`). Built here with
//! `cc -static`, or taken prebuilt from `VM_TEST_VSOCK_PROBE` (the kvm proof pack carries one
//! for hosts without a C compiler), and copied into the guest's work directory.

use std::path::Path;

use crate::{MicroVm, ensure, exec_ok};

/// The probe's file name in the guest's work directory (run it as `./vsock-probe`).
pub const PROBE: &str = "vsock-probe";

/// The probe's source, embedded so the suite binary needs only a C compiler where it runs.
const PROBE_SOURCE: &str = include_str!("../guest-tools/vsock_probe.c");

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
    ensure!(
        r.status.success(),
        "cc -static {}: {}",
        src.display(),
        String::from_utf8_lossy(&r.stderr)
    );
    std::fs::read(&out).map_err(|e| format!("reading {}: {e}", out.display()))
}

/// The probe's bytes: the prebuilt static binary `VM_TEST_VSOCK_PROBE` names, else built here.
fn probe() -> Result<Vec<u8>, String> {
    if let Some(path) = std::env::var_os("VM_TEST_VSOCK_PROBE") {
        let path = Path::new(&path);
        return std::fs::read(path)
            .map_err(|e| format!("reading VM_TEST_VSOCK_PROBE {}: {e}", path.display()));
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    build_probe(dir.path())
}

/// Copies the probe into the guest's work directory, executable.
pub async fn install_probe(vm: &MicroVm) -> Result<(), String> {
    let bin = probe()?;
    vm.write_file(PROBE, &bin)
        .await
        .map_err(|e| format!("copying the probe in: {e}"))?;
    exec_ok(vm, &format!("chmod 755 {PROBE}")).await?;
    Ok(())
}
