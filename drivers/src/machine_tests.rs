//! Machine lifecycle tests with a fake backend handle (no VM needed).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use vm_agent_client::{AgentClient, ClientLimits};
use vm_agent_protocol::protocol::ExecRequest;
use vm_spec::Containment;

use super::*;
use crate::snapshot::{BackendSnapshot, SnapshotError};

#[derive(Default)]
struct FakeState {
    killed: AtomicBool,
    kills: AtomicUsize,
    metrics_queries: AtomicUsize,
    /// What `snapshot` answers: `true` writes (and ends the VM), `false` refuses.
    snapshot_ok: AtomicBool,
}

struct FakeHandle(Arc<FakeState>);

impl VmHandle for FakeHandle {
    fn is_running(&self) -> bool {
        !self.0.killed.load(Ordering::SeqCst)
    }
    fn kill(&self) {
        self.0.killed.store(true, Ordering::SeqCst);
        self.0.kills.fetch_add(1, Ordering::SeqCst);
    }
    fn wait(&self, _timeout: Duration) -> bool {
        !self.is_running()
    }
    fn console_tail(&self) -> String {
        "fake console".into()
    }
    fn host_pids(&self) -> Vec<u32> {
        vec![4242]
    }
    fn reports(&self) -> Reports {
        Reports {
            vmm_log: false,
            device_metrics: true,
        }
    }
    fn device_metrics(&self) -> Option<vm_vmm_protocol::MetricsReport> {
        self.0.metrics_queries.fetch_add(1, Ordering::SeqCst);
        Some(vm_vmm_protocol::MetricsReport::default())
    }
    fn snapshot(&self, _timeout: Duration) -> Result<BackendSnapshot, SnapshotError> {
        if !self.0.snapshot_ok.load(Ordering::SeqCst) {
            return Err(SnapshotError::Refused("no room".into()));
        }
        self.0.killed.store(true, Ordering::SeqCst);
        Ok(BackendSnapshot {
            state_bytes: 1,
            memory_bytes: 2,
            memory_written: 3,
            pause: Duration::from_micros(4),
            took: Duration::from_micros(5),
        })
    }
}

fn machine(wall: Option<Duration>, agent: AgentClient) -> (Machine, Arc<FakeState>) {
    let state = Arc::new(FakeState::default());
    let info = MachineInfo {
        name: "t".into(),
        driver: "fake",
        containment: Containment::MicroVm,
        wall,
        agent_socket: "/run/t/vsock.sock".into(),
    };
    let m = Machine::new(info, Box::new(FakeHandle(state.clone())), agent).unwrap();
    (m, state)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn nowhere() -> AgentClient {
    AgentClient::unix("/nonexistent/agent.sock")
}

#[test]
fn wall_expiry_tears_down_and_later_calls_fail() {
    let (m, state) = machine(Some(Duration::from_millis(150)), nowhere());
    assert!(m.is_running());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !state.killed.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        state.killed.load(Ordering::SeqCst),
        "watchdog did not kill the vm"
    );
    assert!(m.wall_expired());
    assert!(!m.is_running());
    let err = rt()
        .block_on(m.call(|c| c.exec(ExecRequest::shell("true"))))
        .unwrap_err();
    assert!(matches!(err, MachineError::WallExpired { .. }), "{err:?}");
    assert!(err.to_string().contains("wall expired"), "{err}");
}

/// An agent that accepts connections and never answers: a call in flight at expiry must end
/// at expiry, not at the client's (10 s) step timeout.
#[test]
fn wall_expiry_interrupts_a_call_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let accepted = std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().take(1).collect();
        std::thread::sleep(Duration::from_millis(1500));
        drop(held);
    });
    let (m, _) = machine(Some(Duration::from_millis(300)), AgentClient::unix(&sock));
    let start = Instant::now();
    let err = rt()
        .block_on(m.call(|c| c.exec(ExecRequest::shell("sleep 100"))))
        .unwrap_err();
    assert!(matches!(err, MachineError::WallExpired { .. }), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    accepted.join().unwrap();
}

#[test]
fn device_metrics_are_asked_only_while_the_machine_runs() {
    let (m, state) = machine(None, nowhere());
    assert!(m.device_metrics().is_some());
    assert_eq!(state.metrics_queries.load(Ordering::SeqCst), 1);
    assert_eq!(m.vmm_log_tail(), None, "the fake has no VMM log");
    let says = Reports {
        vmm_log: false,
        device_metrics: true,
    };
    assert_eq!(
        m.reports(),
        says,
        "the machine passes on its handle's reports"
    );
    m.close_now();
    assert_eq!(m.device_metrics(), None);
    assert_eq!(state.metrics_queries.load(Ordering::SeqCst), 1);
}

#[test]
fn close_is_idempotent_and_calls_fail_after() {
    let limits = ClientLimits {
        connect_timeout: Duration::from_millis(200),
        ..ClientLimits::default()
    };
    let (m, state) = machine(None, nowhere().with_limits(limits));
    let rt = rt();
    let start = Instant::now();
    rt.block_on(m.close());
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "close took {:?}",
        start.elapsed()
    );
    assert!(state.killed.load(Ordering::SeqCst));
    rt.block_on(m.close());
    m.close_now();
    assert!(!m.is_running());
    assert!(!m.wall_expired());
    let err = rt.block_on(m.call(|c| c.read_file("/", "x"))).unwrap_err();
    assert!(matches!(err, MachineError::Closed { .. }), "{err:?}");
}

#[test]
fn drop_kills_the_vm_and_stops_the_watchdog() {
    let (m, state) = machine(Some(Duration::from_secs(3600)), nowhere());
    // The handle (and with it `state`) is shared by the machine and its watchdog thread.
    assert!(Arc::strong_count(&state) > 1);
    drop(m);
    assert!(state.killed.load(Ordering::SeqCst));
    assert_eq!(state.kills.load(Ordering::SeqCst), 1);
    // The watchdog, an hour from its deadline, must end now and release the handle: only
    // this test's reference to the state is left once that thread is gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(&state) > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        Arc::strong_count(&state),
        1,
        "the wall watchdog thread still holds the VM after drop"
    );
    assert_eq!(
        state.kills.load(Ordering::SeqCst),
        1,
        "the watchdog killed a dropped VM again"
    );
}

#[test]
fn agent_errors_while_running_are_agent_errors() {
    let limits = ClientLimits {
        connect_timeout: Duration::from_millis(200),
        ..ClientLimits::default()
    };
    let (m, _) = machine(None, nowhere().with_limits(limits));
    let err = rt().block_on(m.call(|c| c.list("/", "."))).unwrap_err();
    assert!(matches!(err, MachineError::Agent(_)), "{err:?}");
}

#[test]
fn a_vm_that_stopped_by_itself_reports_stopped() {
    let limits = ClientLimits {
        connect_timeout: Duration::from_millis(200),
        ..ClientLimits::default()
    };
    let (m, state) = machine(None, nowhere().with_limits(limits));
    state.killed.store(true, Ordering::SeqCst);
    let err = rt().block_on(m.call(|c| c.list("/", "."))).unwrap_err();
    match err {
        MachineError::Stopped { console_tail, .. } => assert_eq!(console_tail, "fake console"),
        other => panic!("{other:?}"),
    }
}

/// A call in flight when the VM dies by itself ends promptly with `Stopped`.
#[test]
fn a_vm_dying_mid_call_ends_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let held = std::thread::spawn(move || {
        let conns: Vec<_> = listener.incoming().take(1).collect();
        std::thread::sleep(Duration::from_millis(1500));
        drop(conns);
    });
    let (m, state) = machine(None, AgentClient::unix(&sock));
    let killer = {
        let state = state.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            state.killed.store(true, Ordering::SeqCst);
        })
    };
    let start = Instant::now();
    let err = rt()
        .block_on(m.call(|c| c.exec(ExecRequest::shell("sleep 100"))))
        .unwrap_err();
    assert!(matches!(err, MachineError::Stopped { .. }), "{err:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    killer.join().unwrap();
    held.join().unwrap();
}

#[test]
fn machine_and_registry_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Machine>();
    assert_send_sync::<crate::Registry>();
}

#[test]
fn agent_socket_is_the_one_the_driver_recorded() {
    let (m, _state) = machine(None, nowhere());
    assert_eq!(m.agent_socket(), std::path::Path::new("/run/t/vsock.sock"));
    assert_eq!(m.info().agent_socket, m.agent_socket());
}

#[test]
fn a_snapshot_ends_the_machine_and_carries_its_token_a_refusal_does_not() {
    let token = vm_agent_protocol::token::AgentToken::from_bytes([9; 32]);
    let (m, state) = machine(None, nowhere().with_token(token.clone()));
    let e = m.snapshot().unwrap_err();
    assert!(
        matches!(&e, SnapshotError::Refused(r) if r == "no room"),
        "{e:?}"
    );
    assert!(m.is_running(), "a refused snapshot ended the VM");
    state.snapshot_ok.store(true, Ordering::SeqCst);
    let s = m.snapshot().unwrap();
    assert_eq!((s.state_bytes, s.memory_written, s.token), (1, 3, token));
    assert!(!m.is_running());
    assert!(state.kills.load(Ordering::SeqCst) >= 1, "not torn down");
    assert!(matches!(
        m.snapshot(),
        Err(SnapshotError::Machine(MachineError::Closed { .. }))
    ));
}

#[test]
fn drivers_without_snapshots_refuse_a_restore_with_their_reason() {
    use crate::{Driver, KvmDriver, RestoreFrom, TcgDriver};
    let from = RestoreFrom {
        dir: "/nonexistent/snap".into(),
        token: vm_agent_protocol::token::AgentToken::from_bytes([1; 32]),
        generation: 1,
    };
    let tcg = TcgDriver::new();
    assert!(!tcg.snapshots().ok);
    let e = tcg
        .restore(crate::test_support::dummy_plan(), &from)
        .unwrap_err();
    assert!(
        matches!(&e, DriverError::Unsupported { driver: "tcg", reason }
            if reason == crate::tcg::SNAPSHOTS_UNSUPPORTED),
        "{e:?}"
    );
    assert!(e.to_string().contains("vhost-user-vsock"), "{e}");
    assert!(KvmDriver::new().snapshots().ok);
    assert!(!crate::HvfDriver::new().snapshots().ok);
}
