//! The control channel, the configuration line and the exit status of `vm-vmm` (see the
//! crate docs).

use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use serde::{Deserialize, Serialize};

use crate::config::VmConfig;
use crate::snapshot::AfterSnapshot;

pub use vm_jail::JailConfig;

/// The control-channel line that asks the VMM to stop the VM.
pub const STOP: &str = "stop";

/// The control-channel line that asks for the device counters: the VMM answers with one
/// [`crate::metrics::metrics_line`] on stderr.
pub const METRICS: &str = "metrics";

/// The control-channel line that snapshots the VM into the configured directory and lets it
/// run on (the reply comes on stderr: [`crate::snapshot::SnapshotReply`]).
pub const SNAPSHOT: &str = "snapshot";

/// The control-channel line that snapshots the VM and then stops it (the process exits with
/// [`ExitKind::Ended`] once the snapshot is written; on an error the VM runs on).
pub const SNAPSHOT_STOP: &str = "snapshot-stop";

/// A control-channel line that makes the control thread call `getppid`, which its seccomp
/// filter does not allow (builds with the `test-hooks` feature only: the tests' way to prove a
/// forbidden system call kills the VM process).
#[cfg(feature = "test-hooks")]
pub const TEST_FORBIDDEN_SYSCALL: &str = "test-forbidden-syscall";

/// A control-channel line that makes the control thread allocate and touch more than
/// [`vm_jail::VMM_OVERHEAD_MIB`] (builds with the `test-hooks` feature only: the tests' way to
/// prove the memory cap ends a leaking VMM).
#[cfg(feature = "test-hooks")]
pub const TEST_LEAK: &str = "test-leak";

/// A control-channel line that runs the snapshot path without checking the VMM is configured
/// for snapshots (builds with the `test-hooks` feature only: the tests' way to prove the
/// filters of a VMM without a snapshot directory still kill on the snapshot's system calls).
#[cfg(feature = "test-hooks")]
pub const TEST_SNAPSHOT_UNCHECKED: &str = "test-snapshot-unchecked";

/// Upper bound of the configuration line (a handful of paths and a command line).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The name of the binary.
pub const BINARY: &str = "vm-vmm";

/// Everything `vm-vmm` needs to run one VM: the [`VmConfig`] itself (its console is the
/// process's stdout) and what the process needs besides.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProcessConfig {
    /// The VM.
    pub vm: VmConfig,
    /// The launcher's pid: `vm-vmm` refuses to start when its parent is not this process.
    pub parent_pid: u32,
    /// The jail to build around the VM ([`vm_jail`]); `None` runs it bare (benchmarks, tests of
    /// the bare path, hosts where the caller accepted a weaker jail).
    pub jail: Option<JailConfig>,
    /// Install the seccomp filters of [`vm_jail::seccomp`] on every thread.
    pub seccomp: bool,
    /// Where [`SNAPSHOT`] writes (absolute; an existing directory of mode `0700` without
    /// snapshot files, made by the launcher). Only a VMM given one accepts the command, gets
    /// the snapshot system calls in its filters and may write files in its jail, where the
    /// directory is bound read-write at its own path. `None`: no snapshots.
    #[serde(default)]
    pub snapshot_dir: Option<PathBuf>,
    /// Restore the snapshot in this directory (absolute) instead of booting `vm.kernel`: the
    /// VM config must match the snapshot's, or the process exits with
    /// [`ExitKind::RestoreFailed`]. Its files are opened (and checked: the process's own,
    /// writable by nobody else) before the jail's root exists, so it is not bound inside; the
    /// state is decoded after `confine`, on the restore thread under its filter.
    #[serde(default)]
    pub restore: Option<PathBuf>,
    /// The restore thread makes a system call its filter does not allow, right after
    /// installing it (builds with the `test-hooks` feature only: the tests' way to prove the
    /// state is decoded under that filter).
    #[cfg(feature = "test-hooks")]
    #[serde(default)]
    pub test_forbidden_syscall_in_restore: bool,
}

impl ProcessConfig {
    /// A configuration for `vm`, launched by this process, bare and unfiltered.
    pub fn new(vm: VmConfig) -> ProcessConfig {
        ProcessConfig {
            vm,
            parent_pid: std::process::id(),
            jail: None,
            seccomp: false,
            snapshot_dir: None,
            restore: None,
            #[cfg(feature = "test-hooks")]
            test_forbidden_syscall_in_restore: false,
        }
    }
}

/// The command that starts `vm-vmm` at `bin`: piped stdin/stdout/stderr, an empty environment
/// (nothing of the launcher's, secrets included, reaches the VMM), no arguments.
pub fn command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Writes `cfg` as the first control-channel line.
pub fn write_config(control: &mut impl Write, cfg: &ProcessConfig) -> io::Result<()> {
    let mut line = serde_json::to_vec(cfg).map_err(io::Error::other)?;
    line.push(b'\n');
    control.write_all(&line)?;
    control.flush()
}

/// Asks the VMM to stop the VM (it then exits with [`ExitKind::Ended`]).
pub fn send_stop(control: &mut impl Write) -> io::Result<()> {
    control.write_all(format!("{STOP}\n").as_bytes())?;
    control.flush()
}

/// Asks the VMM to snapshot the VM into its snapshot directory, then run on or stop.
pub fn send_snapshot(control: &mut impl Write, then: AfterSnapshot) -> io::Result<()> {
    let line = match then {
        AfterSnapshot::Resume => SNAPSHOT,
        AfterSnapshot::Stop => SNAPSHOT_STOP,
    };
    control.write_all(format!("{line}\n").as_bytes())?;
    control.flush()
}

/// Asks the VMM for its device counters (the reply comes on its stderr).
pub fn send_metrics_query(control: &mut impl Write) -> io::Result<()> {
    control.write_all(format!("{METRICS}\n").as_bytes())?;
    control.flush()
}

/// The exit codes of `vm-vmm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// The guest reset or powered off, or the launcher stopped it.
    Ended,
    /// The configuration or the VM setup failed (the reason is on stderr).
    SetupFailed,
    /// A vCPU triple-faulted.
    TripleFault,
    /// A vCPU halted with interrupts off.
    Halted,
    /// A vCPU stopped on another exit it cannot continue from (on stderr).
    GuestFault,
    /// The parent died before the VMM could arm its parent-death signal.
    ParentGone,
    /// The jail could not be built (the step is on stderr); the guest never ran.
    JailFailed,
    /// The snapshot to restore was refused (unreadable, invalid, or its VM differs from the
    /// config: the field is on stderr); no guest ran.
    RestoreFailed,
}

impl ExitKind {
    const ALL: [ExitKind; 8] = [
        ExitKind::Ended,
        ExitKind::SetupFailed,
        ExitKind::TripleFault,
        ExitKind::Halted,
        ExitKind::GuestFault,
        ExitKind::ParentGone,
        ExitKind::JailFailed,
        ExitKind::RestoreFailed,
    ];

    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            ExitKind::Ended => 0,
            ExitKind::SetupFailed => 1,
            ExitKind::TripleFault => 2,
            ExitKind::Halted => 3,
            ExitKind::GuestFault => 4,
            ExitKind::ParentGone => 5,
            ExitKind::JailFailed => 6,
            ExitKind::RestoreFailed => 7,
        }
    }

    fn from_code(code: i32) -> Option<ExitKind> {
        Self::ALL.into_iter().find(|k| i32::from(k.code()) == code)
    }
}

/// How a `vm-vmm` process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProcessExit {
    /// It exited with one of its own codes.
    #[error("vm process exited: {0:?}")]
    Exited(ExitKind),
    /// It exited with a code it never uses.
    #[error("vm process exited with unknown code {0}")]
    UnknownCode(i32),
    /// A seccomp filter killed it: some thread made a system call outside its allowlist.
    #[error("vm process killed by SIGSYS: a system call outside its seccomp allowlist")]
    Seccomp,
    /// Another signal killed it (9 = SIGKILL: the launcher tore it down, or the memory cap).
    #[error("vm process killed by signal {0}")]
    Signaled(i32),
}

impl ProcessExit {
    /// Classifies a wait status.
    pub fn from_status(status: ExitStatus) -> ProcessExit {
        match (status.code(), status.signal()) {
            (Some(c), _) => {
                ExitKind::from_code(c).map_or(ProcessExit::UnknownCode(c), ProcessExit::Exited)
            }
            (None, Some(libc::SIGSYS)) => ProcessExit::Seccomp,
            (None, Some(s)) => ProcessExit::Signaled(s),
            (None, None) => ProcessExit::UnknownCode(-1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CpuProfile, DeviceConfig};

    #[test]
    fn config_round_trips_through_one_json_line() {
        let devices = vec![
            DeviceConfig::Block {
                path: "/d".into(),
                read_only: true,
                id: "disk0".into(),
            },
            DeviceConfig::Vsock {
                guest_cid: 3,
                uds_path: "/run/v.sock".into(),
            },
            DeviceConfig::Rng,
        ];
        let vm = VmConfig {
            mem_mib: 256,
            vcpus: 2,
            kernel: "/k".into(),
            initrd: Some("/i".into()),
            cmdline: "vm.hostname=x".into(),
            cpu_profile: CpuProfile::Baseline,
            devices: devices.clone(),
            ..VmConfig::default()
        };
        let cfg = ProcessConfig::new(vm);
        let mut line = Vec::new();
        write_config(&mut line, &cfg).unwrap();
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(line.last(), Some(&b'\n'));
        let back: ProcessConfig = serde_json::from_slice(&line).unwrap();
        assert_eq!(serde_json::to_vec(&back).unwrap(), line[..line.len() - 1]);
        assert_eq!(back.parent_pid, std::process::id());
        assert_eq!(back.vm.devices, devices);
        assert_eq!(back.vm, cfg.vm);
    }

    #[test]
    fn exit_statuses_are_classified() {
        let exited = |c: i32| ExitStatus::from_raw(c << 8);
        assert_eq!(
            ProcessExit::from_status(exited(0)),
            ProcessExit::Exited(ExitKind::Ended)
        );
        assert_eq!(
            ProcessExit::from_status(exited(2)),
            ProcessExit::Exited(ExitKind::TripleFault)
        );
        assert_eq!(
            ProcessExit::from_status(exited(77)),
            ProcessExit::UnknownCode(77)
        );
        assert_eq!(
            ProcessExit::from_status(ExitStatus::from_raw(libc::SIGSYS)),
            ProcessExit::Seccomp
        );
        assert_eq!(
            ProcessExit::from_status(ExitStatus::from_raw(libc::SIGKILL)),
            ProcessExit::Signaled(9)
        );
        for k in ExitKind::ALL {
            assert_eq!(ExitKind::from_code(i32::from(k.code())), Some(k));
        }
    }
}
