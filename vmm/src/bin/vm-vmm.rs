//! `vm-vmm`: runs one VM in this process for a launcher (see `vmm::process`).
//!
//! Takes no arguments: the configuration is the first line on stdin, later lines are control
//! commands, the guest console goes to stdout, the log to stderr (`vmm::logger`), and the exit
//! code says how the VM ended (`vmm::process::ExitKind`).

fn main() -> std::process::ExitCode {
    vmm::logger::init();
    if std::env::args_os().len() > 1 {
        tracing::error!("vm-vmm takes no arguments (the configuration comes on stdin)");
        return std::process::ExitCode::from(vmm::process::ExitKind::SetupFailed.code());
    }
    std::process::ExitCode::from(vmm::process::child::main())
}
