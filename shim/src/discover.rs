//! Ports without annotations: a VM's container listening on a TCP port is reachable in the
//! container's network namespace (a pod's: on the pod's IP) as on any runtime. The agent
//! reports the ports something in the guest listens on at every address
//! ([`vm_sandbox::Guest::listening_ports`]); every [`POLL`] the shim binds each new one on
//! all addresses of the namespace and forwards its connections over vsock ([`crate::ports`]),
//! and drops the listener of a port nothing listens on any more (a server that comes back is
//! bound again). The guest keeps no NIC. A port the namespace already has taken is logged
//! (rate-limited) and tried again; the `vm.shim/ports` annotation stays for ports that must
//! exist before the server listens (those are bound before the boot and left alone here).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use vm_sandbox::MicroVm;

use crate::ports::{self, Forwards};

/// How often the guest's listening ports are asked for.
pub const POLL: Duration = Duration::from_secs(1);
/// How long one answer may take (the guest answers it).
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// Most ports forwarded this way at once.
pub const MAX_DISCOVERED: usize = 256;
/// At most one warning about a port that cannot be bound per this long.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The discovery task of one VM, stopped (with its forwards) when dropped.
#[derive(Debug, Default)]
pub struct Discovery(Option<JoinHandle<()>>);

impl Drop for Discovery {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

/// Starts forwarding the ports `vm`'s guest listens on from the network namespace `netns`,
/// beside the `declared` ones (already forwarded). Nothing without a namespace path.
pub fn start(vm: Arc<MicroVm>, netns: Option<PathBuf>, declared: Vec<u16>) -> Discovery {
    match netns {
        Some(netns) => Discovery(Some(tokio::spawn(run(vm, netns, declared)))),
        None => Discovery(None),
    }
}

async fn run(vm: Arc<MicroVm>, netns: PathBuf, declared: Vec<u16>) {
    let mut forwarded: HashMap<u16, Forwards> = HashMap::new();
    let mut warned: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let listening = match tokio::time::timeout(ASK_TIMEOUT, vm.listening_ports()).await {
            Ok(Ok(p)) => p,
            // The VM is going (or slow): ask again next time.
            Ok(Err(e)) => {
                tracing::debug!(error = %vm_error_chain::error_chain(&e), "listening ports");
                continue;
            }
            Err(_) => continue,
        };
        forwarded.retain(|port, _| listening.contains(port));
        let new: Vec<u16> = listening
            .into_iter()
            .filter(|p| !declared.contains(p) && !forwarded.contains_key(p))
            .take(MAX_DISCOVERED.saturating_sub(forwarded.len()))
            .collect();
        for port in new {
            let ns = netns.clone();
            let bound = tokio::task::spawn_blocking(move || ports::bind_in(Some(&ns), &[port]))
                .await
                .map_err(|e| crate::error::ShimError::State(e.to_string()))
                .and_then(|r| r)
                .and_then(|b| b.forward_to(&vm));
            match bound {
                Ok(f) => {
                    tracing::info!(port, "a guest port is listening: forwarded");
                    forwarded.insert(port, f);
                }
                Err(e) => {
                    let now = tokio::time::Instant::now();
                    if warned.is_none_or(|w| now.duration_since(w) >= WARN_EVERY) {
                        warned = Some(now);
                        tracing::warn!(port, error = %e, "a guest port cannot be forwarded");
                    }
                }
            }
        }
    }
}
