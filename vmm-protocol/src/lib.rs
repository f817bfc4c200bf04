//! One VM per host process: the protocol the `vm-vmm` binary and its launcher speak.
//!
//! A crate of its own so a launcher (`vm-drivers`' kvm driver) links the interface and not
//! the VMM: no KVM, vhost-user or device code in the processes that only start VMs.
//!
//! A launcher (the kvm driver in `vm-drivers`, the slow tests of `vmm`) starts `vm-vmm` with
//! [`command`], which gives it three pipes and an empty environment, and nothing on its command
//! line:
//!
//! - **stdin, the control channel (launcher → VMM).** The first line is the [`ProcessConfig`] as
//!   one JSON object ([`write_config`]; at most [`MAX_CONFIG_BYTES`]). Every later line is a
//!   command: [`STOP`], [`METRICS`] (the device counters, answered on stderr), or
//!   [`SNAPSHOT`] / [`SNAPSHOT_STOP`] (a snapshot into the configured
//!   [`ProcessConfig::snapshot_dir`], answered on stderr: [`snapshot`]). End of file
//!   (the launcher closed it, or died) also stops the VM, so a VMM never outlives the process
//!   that talks to it.
//! - **stdout: the guest console**, streamed as the guest writes it (flushed per line). The
//!   launcher keeps the bounded tail, so the console survives the VMM process, crash included.
//! - **stderr: the log** (`vmm::logger`: one line per event — setup errors, guest faults,
//!   rate-limited device warnings, how the VM ended — and the replies to [`METRICS`], lines
//!   that start with [`metrics::METRICS_PREFIX`], and to [`SNAPSHOT`], lines that start
//!   with [`snapshot::SNAPSHOT_PREFIX`]). The kvm driver keeps it apart from
//!   the console, in the run directory's `vmm.log`. A log that cannot be written (a closed
//!   pipe, a file under the jail's `RLIMIT_FSIZE` of 0) loses lines, never the VM.
//! - **The exit status** says how the VM ended ([`ProcessExit::from_status`]): a code from
//!   [`ExitKind`], or the signal that killed the process (`SIGSYS` when a seccomp filter did).
//!
//! Parent death ends the VM three ways: the launcher arms `PR_SET_PDEATHSIG(SIGKILL)` before
//! `exec`, `vm-vmm` re-arms it itself and checks at start that its parent is still the pid named
//! in the configuration (it may have died before the signal was armed), and end of file on the
//! control channel stops the VM.
//!
//! Where a launcher finds the binary is its business (the kvm driver: `$VM_VMM_BIN`, else next
//! to the running executable, else one directory up, which is where cargo puts binaries for
//! test executables in `target/<profile>/deps`).

pub mod config;
pub mod layout;
pub mod metrics;
pub mod process;
pub mod snapshot;

pub use config::{CpuProfile, DeviceConfig, KernelFormat, VmConfig};
pub use metrics::{DeviceSnapshot, MetricsReport};
pub use process::{
    BINARY, ExitKind, JailConfig, MAX_CONFIG_BYTES, METRICS, ProcessConfig, ProcessExit, SNAPSHOT,
    SNAPSHOT_STOP, STOP, command, send_metrics_query, send_snapshot, send_stop, write_config,
};
pub use snapshot::{AfterSnapshot, SnapshotReply};
