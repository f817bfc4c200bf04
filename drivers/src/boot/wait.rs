//! Waiting for a booted guest's agent to answer: a ping through the agent client, bounded by
//! the boot timeout and cut short when the VM stops; for backends whose vsock device must not
//! see a connection early, only after the agent's ready line is on the console.

use std::io;
use std::time::{Duration, Instant};

use vm_agent_client::AgentClient;

use crate::DriverError;
use crate::machine::VmHandle;

/// What the guest agent prints on the console once its vsock listener is bound
/// (`vm-agent: ready port=<port> proto=<n>`, guest-agent `run.rs`).
pub(crate) const AGENT_READY_MARKER: &str = "vm-agent: ready port=";

/// How often the console is checked for [`AGENT_READY_MARKER`].
const CONSOLE_POLL: Duration = Duration::from_millis(20);

/// Like [`wait_for_agent`], but sends nothing to the agent socket before `marker` has appeared
/// on the console (both waits share `timeout`).
///
/// Written for a backend whose vsock device must not see a host connection while the guest is
/// still starting it: `vhost-device-vsock` 0.3.0 (the tcg driver's backend before `vm-vsock`)
/// handled a host `CONNECT` that arrived between the guest's memory table and its TX vring
/// being set up by returning `QueueNotReady` from its vring worker, which ended that thread for
/// good. Our `vm-vsock` has no such window (it serves no queue before it is enabled and holds
/// the connection meanwhile); the tcg driver keeps this wait because it is harmless and saves
/// connection attempts the agent could not answer yet. The guest starts its vsock device long
/// before the agent can print the marker, so connecting only afterwards never hits that window. The marker is only a hint of when to
/// start: a guest that prints it early harms only itself, and the agent handshake still decides.
pub(crate) fn wait_for_agent_after_console(
    handle: &dyn VmHandle,
    client: &AgentClient,
    marker: &str,
    timeout: Duration,
) -> Result<(), DriverError> {
    let start = Instant::now();
    let fail = |reason: &str| DriverError::AgentNotReady {
        waited: start.elapsed(),
        reason: reason.into(),
        console_tail: handle.console_tail(),
        source: None,
    };
    while !handle.console_tail().contains(marker) {
        if !handle.is_running() {
            return Err(fail(&stopped_reason(handle)));
        }
        if start.elapsed() >= timeout {
            return Err(fail(&format!(
                "timed out waiting for {marker:?} on the console"
            )));
        }
        std::thread::sleep(CONSOLE_POLL);
    }
    wait_for_agent(handle, client, timeout.saturating_sub(start.elapsed())).map_err(|e| match e {
        DriverError::AgentNotReady {
            reason,
            console_tail,
            source,
            ..
        } => DriverError::AgentNotReady {
            waited: start.elapsed(),
            reason,
            console_tail,
            source,
        },
        e => e,
    })
}

/// "the vm stopped before the agent answered", with the agent's fatal line when the console
/// holds one (why it gave up, whatever the kernel printed after it) and the backend's account
/// of how the VM ended: the same diagnosis on every driver.
fn stopped_reason(handle: &dyn VmHandle) -> String {
    let mut why = "the vm stopped before the agent answered".to_string();
    if let Some(fatal) = agent_fatal_line(&handle.console_tail()) {
        why.push_str(&format!(": the agent said {fatal:?}"));
    }
    let detail = handle.stop_detail();
    if !detail.is_empty() {
        why.push_str(&format!("; {detail}"));
    }
    why
}

/// The agent's last fatal line in a console tail, clipped: the guest writes the console.
fn agent_fatal_line(console: &str) -> Option<&str> {
    console.lines().rev().find_map(|l| {
        l.find(vm_agent_protocol::FATAL_PREFIX)
            .map(|at| crate::process::clip(l[at..].trim_end()))
    })
}

/// Waits until the agent answers a ping, the VM stops, or `timeout` passes. Runs the async
/// client on a private thread with its own runtime, so this works whether or not the caller
/// is inside a tokio runtime.
pub(crate) fn wait_for_agent(
    handle: &dyn VmHandle,
    client: &AgentClient,
    timeout: Duration,
) -> Result<(), DriverError> {
    let start = Instant::now();
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ("cannot build a runtime".to_string(), Some(e), None))?;
            rt.block_on(async {
                let stopped = async {
                    while handle.is_running() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                };
                tokio::select! {
                    r = client.wait_ready(timeout) => match r {
                        Ok(_) => Ok(()),
                        Err(e) => Err(("timed out or refused".to_string(), None, Some(e))),
                    },
                    () = stopped => Err((stopped_reason(handle), None, None)),
                }
            })
        })
        .join()
        .unwrap_or_else(|_| Err(("the waiting thread panicked".to_string(), None, None)))
    });
    outcome.map_err(
        |(reason, io, source): (String, Option<io::Error>, Option<_>)| {
            let reason = match io {
                Some(e) => format!("{reason}: {e}"),
                None => reason,
            };
            DriverError::AgentNotReady {
                waited: start.elapsed(),
                reason,
                console_tail: handle.console_tail(),
                source,
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use vm_sync::Lock;

    use vm_agent_protocol::frame::encode_frame;
    use vm_agent_protocol::protocol::{AgentFrame, AgentInfo, MAX_FRAME};

    use super::*;
    use std::path::Path;

    use vm_agent_protocol::AGENT_PORT;

    /// A VM whose console and liveness the test controls.
    #[derive(Default)]
    struct FakeVm {
        console: Mutex<String>,
        stopped: AtomicBool,
    }

    impl VmHandle for Arc<FakeVm> {
        fn is_running(&self) -> bool {
            !self.stopped.load(Ordering::SeqCst)
        }
        fn kill(&self) {
            self.stopped.store(true, Ordering::SeqCst);
        }
        fn wait(&self, _timeout: Duration) -> bool {
            !self.is_running()
        }
        fn console_tail(&self) -> String {
            self.console.locked().clone()
        }
        fn host_pids(&self) -> Vec<u32> {
            Vec::new()
        }
    }

    fn read_frame_blocking(s: &mut UnixStream) -> std::io::Result<()> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len)?;
        let mut body = vec![0u8; u32::from_le_bytes(len).min(MAX_FRAME) as usize];
        s.read_exact(&mut body)
    }

    fn answer_as_agent(s: &mut UnixStream) -> std::io::Result<()> {
        s.write_all(b"OK 1\n")?;
        read_frame_blocking(s)?; // Hello
        let hello = AgentFrame::HelloOk {
            version: vm_agent_protocol::PROTOCOL_VERSION,
            info: AgentInfo::default(),
        };
        s.write_all(&encode_frame(&hello, MAX_FRAME).unwrap())?;
        read_frame_blocking(s)?; // Ping
        s.write_all(&encode_frame(&AgentFrame::Pong, MAX_FRAME).unwrap())
    }

    /// Stands in for `vhost-device-vsock` 0.3.0 in front of an agent: a `CONNECT` that arrives
    /// before the guest's vsock device is up (here: before the agent's ready line is on the
    /// console) ends its worker, after which connections are accepted and never answered.
    /// Returns how many connections it saw.
    fn fake_vsock_backend(path: &Path, vm: Arc<FakeVm>) -> Arc<AtomicUsize> {
        let listener = UnixListener::bind(path).unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let count = seen.clone();
        std::thread::spawn(move || {
            let mut broken = false;
            let mut held = Vec::new();
            for s in listener.incoming() {
                let Ok(mut s) = s else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let mut line = [0u8; 13];
                if s.read_exact(&mut line).is_err() || &line != b"CONNECT 1024\n" {
                    continue;
                }
                broken |= !vm.console_tail().contains(AGENT_READY_MARKER);
                if broken {
                    held.push(s);
                } else {
                    std::thread::spawn(move || answer_as_agent(&mut s));
                }
            }
        });
        seen
    }

    fn marker_after(vm: &Arc<FakeVm>, delay: Duration) {
        let vm = vm.clone();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            vm.console.locked().push_str(
                "[    0.56] Run /init as init process\nvm-agent: ready port=1024 proto=1\n",
            );
        });
    }

    /// F3: connecting while the guest is still starting its vsock device breaks the tcg
    /// backend for the rest of the boot. Without the console gate this boot times out (the
    /// client's first attempt lands before the marker); with it, the agent answers.
    #[test]
    fn agent_socket_is_not_touched_before_the_ready_line() {
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("vsock.sock");
        let vm = Arc::new(FakeVm::default());
        vm.console.locked().push_str("Linux version 6.12\n");
        let seen = fake_vsock_backend(&sock, vm.clone());
        marker_after(&vm, Duration::from_millis(300));
        let client = AgentClient::hybrid_vsock(&sock, AGENT_PORT);
        let started = Instant::now();
        wait_for_agent_after_console(&vm, &client, AGENT_READY_MARKER, Duration::from_secs(4))
            .expect("agent ready after the console marker");
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(seen.load(Ordering::SeqCst) >= 1);
    }

    #[test]
    fn no_ready_line_times_out_without_connecting() {
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("vsock.sock");
        let vm = Arc::new(FakeVm::default());
        let seen = fake_vsock_backend(&sock, vm.clone());
        let client = AgentClient::hybrid_vsock(&sock, AGENT_PORT);
        let timeout = Duration::from_millis(300);
        let err =
            wait_for_agent_after_console(&vm, &client, AGENT_READY_MARKER, timeout).unwrap_err();
        match err {
            DriverError::AgentNotReady { reason, waited, .. } => {
                assert!(reason.contains("on the console"), "{reason}");
                assert!(waited >= timeout, "{waited:?}");
            }
            e => panic!("unexpected error: {e}"),
        }
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn vm_stopping_before_the_ready_line_ends_the_wait() {
        let vm = Arc::new(FakeVm::default());
        vm.kill();
        let client = AgentClient::hybrid_vsock("/nonexistent/vsock.sock", AGENT_PORT);
        let started = Instant::now();
        let err =
            wait_for_agent_after_console(&vm, &client, AGENT_READY_MARKER, Duration::from_secs(30))
                .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(&err, DriverError::AgentNotReady { reason, .. } if reason.contains("stopped")),
            "{err}"
        );
    }

    /// Whatever the kernel prints after it, the agent's fatal line is in the reason, on every
    /// driver (the kvm one waits with [`wait_for_agent`], tcg after the console gate).
    #[test]
    fn a_stopped_vm_is_reported_with_the_agents_last_words() {
        let vm = Arc::new(FakeVm::default());
        vm.console.locked().push_str(
            "[ 0.9] Run /init as init process\nvm-agent: fatal: image root root: mount: EINVAL\n\
             vm-agent: powering off\n[ 1.0] reboot: Restarting system\n[ 1.0] reboot: machine restart\n",
        );
        vm.kill();
        let client = AgentClient::hybrid_vsock("/nonexistent/vsock.sock", AGENT_PORT);
        let err = wait_for_agent(&vm, &client, Duration::from_secs(30)).unwrap_err();
        let DriverError::AgentNotReady { reason, .. } = &err else {
            panic!("unexpected error: {err}");
        };
        assert!(
            reason.ends_with(r#"the agent said "vm-agent: fatal: image root root: mount: EINVAL""#),
            "{reason}"
        );
        assert_eq!(agent_fatal_line("no agent here\n"), None);
        let flood = format!("vm-agent: fatal: {}\n", "x".repeat(100_000));
        assert_eq!(
            agent_fatal_line(&flood).map(str::len),
            Some(crate::process::QUOTE_MAX)
        );
    }
}
