//! One module per subcommand group.

pub mod cp;
pub mod drivers;
pub mod exec;
pub mod from;
pub mod images;
pub mod manage;
pub mod mcp;
pub mod pause;
pub mod run;
pub mod serve;
pub mod snapshot;
pub mod stats;

/// Once `vm`'s processes are started this process starts nothing more: it is confined as a
/// reader of agent frames ([`vm_sandbox::confine_reader`]) before it reads more of the
/// guest. If that fails, the VM is closed and the error returned (never run unconfined).
pub async fn confine_reader(vm: &vm_sandbox::MicroVm) -> anyhow::Result<()> {
    if let Err(e) = vm_sandbox::confine_reader() {
        vm.close().await;
        return Err(e.into());
    }
    Ok(())
}
