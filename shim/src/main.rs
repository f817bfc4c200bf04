//! `containerd-shim-vm-v1`: a containerd runtime v2 shim that runs each container in its own
//! `vm` microVM, booted through `vm-sandbox` like every other VM (validate → admit → select →
//! boot), so the same guarantees hold: no network device, every host mount read-only, memory
//! capped, untrusted work only at microVM containment unless the runtime's options say
//! `allow_emulation`.
//!
//! containerd starts the binary three ways (`-namespace N -id ID -address A … start|delete`,
//! or with `-socket` to serve): the `containerd-shim` crate (pinned to 0.11.0, whose start
//! handshake containerd 1.6 understands) parses that and runs our [`service::VmShim`].
//!
//! Modules: [`options`] (the runtime options → trust and policy), [`bundle`] (the OCI bundle's
//! `config.json` → our `Spec`, with the refusals), [`rootfs`] (containerd's snapshot mounts →
//! a cached read-only erofs root), [`process`] (one guest process wired to containerd's
//! FIFOs), [`container`] (one VM and its processes), [`pod`] (a pod's containers in one VM),
//! [`ports`] and [`discover`] (the ports reached from the container's network namespace),
//! [`service`] (the shim and task services).

mod bundle;
mod container;
mod discover;
mod error;
mod metrics;
mod options;
mod pod;
mod ports;
mod process;
mod rootfs;
mod service;

use containerd_shim::Config;

/// The runtime name containerd knows this shim by (`io.containerd.vm.v1` ↔ the binary
/// `containerd-shim-vm-v1`).
pub const RUNTIME_ID: &str = "io.containerd.vm.v1";

#[tokio::main]
async fn main() {
    let config = Config {
        // The VM's host processes are supervised (and reaped) by vm-drivers; the crate's
        // SIGCHLD reaper would reap them under its feet, and a subreaper would collect
        // orphans nobody waits for.
        no_reaper: true,
        no_sub_reaper: true,
        ..Config::default()
    };
    containerd_shim::asynchronous::run::<service::VmShim>(RUNTIME_ID, Some(config)).await;
}
