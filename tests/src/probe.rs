//! `vsock-probe`, the static guest program the vsock scenarios run inside the guest
//! (built by `vm_test_support::guest_tool`), copied into the guest's work directory.

use crate::{MicroVm, exec_ok};

/// The probe's file name in the guest's work directory (run it as `./vsock-probe`).
pub use vm_test_support::guest_tool::PROBE;

/// Copies the probe into the guest's work directory, executable.
pub async fn install_probe(vm: &MicroVm) -> Result<(), String> {
    let bin = vm_test_support::guest_tool::vsock_probe()?;
    vm.write_file(PROBE, &bin)
        .await
        .map_err(|e| format!("copying the probe in: {e}"))?;
    exec_ok(vm, &format!("chmod 755 {PROBE}")).await?;
    Ok(())
}
