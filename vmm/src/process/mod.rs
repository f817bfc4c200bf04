//! One VM per host process: the `vm-vmm` binary ([`child`]) and, re-exported here, the
//! protocol its launcher speaks ([`vm_vmm_protocol`], a crate of its own so a launcher links
//! the interface and not the VMM).

pub mod child;
pub mod snapshot;

pub use vm_vmm_protocol::process::*;
