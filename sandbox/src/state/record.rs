//! One named VM's record (`record.json`): its lifecycle state, the processes that make it
//! up (pid + start time, so a recycled pid is not mistaken for ours), its driver, agent socket
//! and labels. Written by `vm run -d` and its supervisor, read by every later command and by
//! the Python SDK (`vm_sandbox.ps()`, `Sandbox.attach`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::rundir::ProcIdentity;

/// Label keys stamped on every VM record (the record is the state store: a fact not
/// recorded here is one no later command can recover).
pub mod labels {
    /// Always present: marks a record as written by this CLI.
    pub const CLI: &str = "vm.cli";
    /// The VM's name.
    pub const NAME: &str = "vm.name";
    /// The driver that booted it (`kvm`, `tcg`, …).
    pub const DRIVER: &str = "vm.driver";
    /// The containment that driver provides (`microvm`, `user-kernel`, …).
    pub const CONTAINMENT: &str = "vm.containment";
    /// The trust level the work was admitted at.
    pub const TRUST: &str = "vm.trust";
    /// Set when the VM runs under emulation because `--allow-emulation` was given.
    pub const EMULATED: &str = "vm.emulated";
    /// A `vm serve` VM: its published URLs, space-separated (its logs are the server's).
    pub const SERVE: &str = "vm.serve";
    /// `true`: the record goes with its VM (an unnamed `vm serve`), also when its holder
    /// was killed (the next `vm` command's sweep removes it).
    pub const EPHEMERAL: &str = "vm.ephemeral";
}

/// The exit reason a holder records when the VM's wall lifetime expired.
pub const WALL_EXPIRED: &str = "wall lifetime expired";

/// Lifecycle state stored in a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// `vm run` created the record; the supervisor is booting the VM.
    Starting,
    /// The VM's agent answered; commands can run in it.
    Running,
    /// `vm pause`: every VM process is stopped until `vm unpause`.
    Paused,
    /// A stop was requested; the supervisor is tearing the VM down.
    Stopping,
    /// The VM is gone (stopped, wall lifetime reached, crashed, or supervisor lost).
    Exited,
}

impl VmState {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            VmState::Starting => "starting",
            VmState::Running => "running",
            VmState::Paused => "paused",
            VmState::Stopping => "stopping",
            VmState::Exited => "exited",
        }
    }
}

/// A process identity: pid plus its start time (clock ticks since boot), so a pid that
/// was recycled by an unrelated process is not mistaken for ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcId {
    /// Process id.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`.
    pub start_ticks: u64,
}

impl ProcId {
    /// The identity of a live process, if it exists.
    pub fn of(pid: u32) -> Option<ProcId> {
        ProcIdentity::of(pid).map(|p| ProcId {
            pid,
            start_ticks: p.start_ticks,
        })
    }

    /// The identity of this process.
    pub fn current() -> Option<ProcId> {
        ProcId::of(std::process::id())
    }

    /// True while that same process exists and is not a zombie.
    pub fn alive(&self) -> bool {
        ProcIdentity {
            pid: self.pid,
            start_ticks: self.start_ticks,
        }
        .alive()
    }
}

/// One VM's record (`record.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Format version.
    pub version: u32,
    /// VM name.
    pub name: String,
    /// Stored lifecycle state (see [`Record::effective_state`]).
    pub state: VmState,
    /// The detached supervisor holding the VM.
    pub supervisor: Option<ProcId>,
    /// Driver name, once chosen.
    pub driver: Option<String>,
    /// The driver's containment, once chosen.
    pub containment: Option<String>,
    /// Unix seconds when `vm run` created the record.
    pub created_unix: u64,
    /// Unix seconds when the agent answered.
    pub started_unix: Option<u64>,
    /// Unix seconds when the VM exited.
    pub exited_unix: Option<u64>,
    /// Why it exited (or why it failed to start).
    pub exit_reason: Option<String>,
    /// When it failed to start: the exit code `vm run` reports (see `exit`).
    #[serde(default)]
    pub error_code: Option<u8>,
    /// Host Unix socket of the VM's hybrid vsock (`CONNECT <port>` handshake).
    pub agent_socket: Option<PathBuf>,
    /// Host processes that make up the VM (driver-reported), killed if left behind.
    pub host_pids: Vec<ProcId>,
    /// Guest memory, MiB.
    pub mem_mib: i64,
    /// vCPUs.
    pub vcpus: i64,
    /// The request the VM was started from (re-resolved by the supervisor).
    pub request: serde_json::Value,
    /// Labels (see [`labels`]).
    pub labels: BTreeMap<String, String>,
    /// The holder pauses the VM on `SIGUSR1` and resumes it on `SIGUSR2` (a `vm run -d`
    /// supervisor; a `vm serve` once its server is ready).
    #[serde(default)]
    pub pausable: bool,
    /// The VM's backend keeps a VMM log of ours (`vm logs --vmm`), from its handle's
    /// `Reports` once running.
    #[serde(default)]
    pub vmm_log: bool,
    /// The VM's backend has per-device counters (`vm stats --json`'s `vmm_devices`).
    #[serde(default)]
    pub device_metrics: bool,
}

impl Record {
    /// A new record in state `starting` for a VM `name` booted from `request` (stored for
    /// the supervisor and `vm exec NAME`), with the base labels (cli version, name, trust).
    pub fn starting(
        name: &str,
        limits: &vm_spec::Limits,
        trust: vm_spec::Trust,
        request: serde_json::Value,
    ) -> Record {
        let mut base = BTreeMap::new();
        base.insert(
            labels::CLI.to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        );
        base.insert(labels::NAME.to_string(), name.to_string());
        base.insert(labels::TRUST.to_string(), trust.to_string());
        Record {
            version: 1,
            name: name.to_string(),
            state: VmState::Starting,
            supervisor: None,
            driver: None,
            containment: None,
            created_unix: now_unix(),
            started_unix: None,
            exited_unix: None,
            exit_reason: None,
            error_code: None,
            agent_socket: None,
            host_pids: Vec::new(),
            mem_mib: limits.mem_mib,
            vcpus: limits.vcpus,
            request,
            labels: base,
            pausable: false,
            vmm_log: false,
            device_metrics: false,
        }
    }

    /// The state to show: a record that says starting/running/stopping whose supervisor is
    /// gone is `Exited` (stale).
    pub fn effective_state(&self) -> VmState {
        match self.state {
            VmState::Exited => VmState::Exited,
            s if self.supervisor.is_some_and(|p| p.alive()) => s,
            VmState::Starting if self.supervisor.is_none() => VmState::Starting,
            _ => VmState::Exited,
        }
    }

    /// How long the VM has run (until it exited), once its agent answered.
    pub fn uptime(&self, state: VmState) -> Option<Duration> {
        let start = self.started_unix?;
        let end = if state == VmState::Exited {
            self.exited_unix?
        } else {
            now_unix()
        };
        Some(Duration::from_secs(end.saturating_sub(start)))
    }

    /// The recorded VM processes that are still those processes.
    pub fn live_pids(&self) -> Vec<u32> {
        self.host_pids
            .iter()
            .filter(|p| p.alive())
            .map(|p| p.pid)
            .collect()
    }

    /// True when the VM exited because its wall lifetime expired.
    pub fn wall_expired(&self) -> bool {
        self.state == VmState::Exited && self.exit_reason.as_deref() == Some(WALL_EXPIRED)
    }

    /// True when the stored state says the VM is up but its supervisor is gone.
    pub fn is_stale(&self) -> bool {
        self.state != VmState::Exited && self.effective_state() == VmState::Exited
    }
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}
