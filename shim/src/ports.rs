//! A VM's declared ports ([`crate::bundle::pod::PORTS`]) reachable in its container's network
//! namespace — for a pod, the namespace containerd's CRI made through CNI — without a guest
//! NIC: the shim listens on each port there and forwards every connection over vsock to the
//! guest's loopback, as `vm serve --publish` does. The guest keeps no network device, so
//! nothing in it can open a connection out.
//!
//! The listeners are bound before the VM boots (a port already taken in the namespace fails
//! the create, naming it), on a short-lived thread that enters the namespace (`setns`); a
//! socket keeps the namespace it was made in, so the forwarding runs on the shim's runtime.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};
use tokio::task::JoinHandle;
use vm_sandbox::Guest;

use crate::bundle::pod::PORTS;
use crate::error::ShimError;

/// Listeners bound in a network namespace, not yet forwarding.
#[derive(Debug)]
pub struct Bound(Vec<(u16, std::net::TcpListener)>);

/// Forwarding tasks, stopped when dropped.
#[derive(Debug, Default)]
pub struct Forwards(Vec<JoinHandle<()>>);

impl Drop for Forwards {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Binds `ports` on all addresses of the network namespace `netns` (`None`: refused, there is
/// none to listen in). Blocking: call off the async runtime.
pub fn bind_in(netns: Option<&Path>, ports: &[u16]) -> Result<Bound, ShimError> {
    if ports.is_empty() {
        return Ok(Bound(Vec::new()));
    }
    let netns: PathBuf = netns.map(Path::to_path_buf).ok_or_else(|| {
        ShimError::Refused(format!(
            "annotations.{PORTS:?}: forwarding needs the container's network namespace path \
             (linux.namespaces: network has none)"
        ))
    })?;
    let ports = ports.to_vec();
    std::thread::Builder::new()
        .name("netns-bind".into())
        .spawn(move || bind_on_this_thread(&netns, &ports))
        .map_err(ShimError::io("starting the thread that binds the ports"))?
        .join()
        .map_err(|_| ShimError::State("the thread binding the ports panicked".into()))?
}

/// Enters `netns` (this thread only; it ends right after) and binds every port.
fn bind_on_this_thread(netns: &Path, ports: &[u16]) -> Result<Bound, ShimError> {
    let ns = std::fs::File::open(netns).map_err(ShimError::io(format!(
        "opening the network namespace {}",
        netns.display()
    )))?;
    setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|e| {
        ShimError::io(format!(
            "entering the network namespace {}",
            netns.display()
        ))(e.into())
    })?;
    let mut bound = Vec::with_capacity(ports.len());
    for &port in ports {
        let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        let l = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(ShimError::io(format!(
                "listening on port {port} in {} ({PORTS})",
                netns.display()
            )))?;
        bound.push((port, l));
    }
    Ok(Bound(bound))
}

impl Bound {
    /// Starts forwarding each listener to the same port in `guest`.
    pub fn forward_to(self, guest: &Guest) -> Result<Forwards, ShimError> {
        let mut tasks = Vec::with_capacity(self.0.len());
        for (port, l) in self.0 {
            let l = tokio::net::TcpListener::from_std(l)
                .map_err(ShimError::io(format!("port {port}")))?;
            tracing::info!(port, "forwarding from the container's network namespace");
            tasks.push(guest.forward_from(l, port));
        }
        Ok(Forwards(tasks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_without_a_namespace_are_refused_by_the_annotation() {
        let e = bind_in(None, &[8080]).unwrap_err().to_string();
        assert!(e.contains(PORTS) && e.contains("network namespace"), "{e}");
        assert!(bind_in(None, &[]).unwrap().0.is_empty(), "nothing to bind");
    }

    #[test]
    fn a_path_that_is_not_a_network_namespace_is_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let e = bind_in(Some(f.path()), &[8080]).unwrap_err();
        assert!(
            e.to_string().contains("entering the network namespace"),
            "{e}"
        );
    }
}
