//! Snapshots of a running VM and restores from them, driver-neutral.
//!
//! A VM booted with [`BootPlan::snapshot_dir`](crate::BootPlan::snapshot_dir) can be
//! snapshotted once: [`Machine::snapshot`](crate::Machine::snapshot) pauses it, has its backend
//! write the snapshot into that directory and ends it (a snapshot of a VM that then runs on
//! would leave two VMs with one agent token). [`Driver::restore`](crate::Driver::restore)
//! starts a new VM from such a directory with a new run directory and sockets; the restored
//! agent still holds the snapshot's token, so the first request presents that one and hands
//! the agent a fresh token, the host's clock, 32 bytes of the host's entropy (the guest
//! kernel adds them and reseeds its CRNG) and the VM's generation (`Request::Resume`);
//! every later connection,
//! `vm exec NAME`'s included, presents the new token, which is also written to the new run
//! directory. Two VMs restored from one snapshot thus share no token, no socket and no
//! writable state (the guest memory is mapped copy-on-write, the disks are read-only).
//!
//! Which drivers can: `kvm` (our VMM: `vmm::snapshot`); `tcg` cannot (see
//! [`crate::tcg::SNAPSHOTS_UNSUPPORTED`]).

use std::path::PathBuf;
use std::time::Duration;

use vm_agent_protocol::token::AgentToken;

use crate::MachineError;

/// How long a snapshot may take, from the request to the VM process having exited (the
/// guest memory is written to disk: seconds for a few GiB).
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(120);

/// What a backend reports of a snapshot it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshotted {
    /// Bytes of the state file.
    pub state_bytes: u64,
    /// Bytes of guest RAM (the memory file's length).
    pub memory_bytes: u64,
    /// Bytes of RAM actually written (the rest is holes).
    pub memory_written: u64,
    /// From the request until every vCPU was paused.
    pub pause: Duration,
    /// From the request until both files were written.
    pub took: Duration,
    /// The agent token the snapshot's guest holds: a restore presents it once, to re-key.
    pub token: AgentToken,
}

/// A snapshot to restore from.
#[derive(Debug, Clone)]
pub struct RestoreFrom {
    /// The directory a [`crate::Machine::snapshot`] wrote (absolute).
    pub dir: PathBuf,
    /// [`Snapshotted::token`] of that snapshot.
    pub token: AgentToken,
    /// The restored VM's generation (the snapshotted VM's plus one): the restored agent
    /// publishes it to the guest (`/run/vm/generation`) as it reseeds its kernel's CRNG.
    pub generation: u64,
}

/// What a backend wrote (the [`Snapshotted`] figures, without the token the machine adds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSnapshot {
    pub state_bytes: u64,
    pub memory_bytes: u64,
    pub memory_written: u64,
    pub pause: Duration,
    pub took: Duration,
}

impl BackendSnapshot {
    pub(crate) fn with_token(self, token: AgentToken) -> Snapshotted {
        Snapshotted {
            state_bytes: self.state_bytes,
            memory_bytes: self.memory_bytes,
            memory_written: self.memory_written,
            pause: self.pause,
            took: self.took,
            token,
        }
    }
}

/// Why a snapshot was not taken. Unless the variant says the VM ended, it runs on.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The backend cannot snapshot (tcg).
    #[error("{driver}: no snapshots: {reason}")]
    Unsupported {
        driver: &'static str,
        reason: String,
    },
    /// The VM was booted without a snapshot directory.
    #[error("machine {name} was not booted for snapshots (BootPlan::snapshot_dir)")]
    NotConfigured { name: String },
    /// The machine is not running (closed, expired, stopped, paused).
    #[error("cannot snapshot")]
    Machine(#[source] MachineError),
    /// The machine holds no agent token to record.
    #[error("machine {name} has no agent token")]
    NoToken { name: String },
    /// The control command could not be sent.
    #[error("cannot send the snapshot command to the VM process")]
    Control(#[source] std::io::Error),
    /// The VMM refused or failed (its error chain); the VM runs on.
    #[error("the VM process did not write the snapshot: {0}")]
    Refused(String),
    /// No reply in time; the VM was torn down (a half-written snapshot is the caller's to remove).
    #[error("no snapshot reply within {0:?}; the VM was torn down")]
    Timeout(Duration),
    /// The snapshot's files could not be given back to this process's user (the VM ended).
    #[error("the VM's snapshot files")]
    HandBack(#[source] vm_vmm_protocol::snapshot::HandBackError),
}
