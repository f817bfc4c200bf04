//! The static guest programs the scenarios run inside the guest (built by
//! `vm_test_support::guest_tool`), copied into the guest's work directory.

use vm_test_support::guest_tool::GuestTool;

use crate::{MicroVm, exec_ok};

/// The probe's file name in the guest's work directory (run it as `./vsock-probe`).
pub use vm_test_support::guest_tool::PROBE;

/// The file-system probe (`./fs-probe`).
pub const FS: GuestTool = vm_test_support::guest_tool::FS_PROBE;

/// Copies `tool` into the guest's work directory, executable.
pub async fn install(vm: &MicroVm, tool: GuestTool) -> Result<(), String> {
    let bin = tool.bytes()?;
    vm.write_file(tool.name, &bin)
        .await
        .map_err(|e| format!("copying {} in: {e}", tool.name))?;
    exec_ok(vm, &format!("chmod 755 {}", tool.name)).await?;
    Ok(())
}

/// Copies the vsock probe into the guest's work directory, executable.
pub async fn install_probe(vm: &MicroVm) -> Result<(), String> {
    install(vm, vm_test_support::guest_tool::VSOCK_PROBE).await
}
