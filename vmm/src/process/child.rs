//! The `vm-vmm` process itself: read the configuration from the control channel, make sure the
//! launcher is alive (and arm the parent-death signal), create the VM (or restore it from the
//! configured snapshot), run it with the console on stdout, stop it on [`STOP`](super::STOP)
//! or end of file, answer [`METRICS`](super::METRICS) and the snapshot commands
//! ([`super::snapshot`]) on the log stream, and exit with an [`ExitKind`]. Everything it says goes through the log
//! ([`crate::logger`], installed by the binary's `main`), never a std print macro.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::prctl;
use nix::sys::signal::Signal;
use vm_sync::Lock;

use super::snapshot::{self as snap, DirError};
use super::{ExitKind, MAX_CONFIG_BYTES, METRICS, ProcessConfig, STOP};
use crate::config::ConsoleConfig;
use crate::control::GuestFault;
use crate::exit::VmExit;
use crate::snapshot::{AfterSnapshot, FailedRestore, PendingRestore, SnapshotError, SnapshotFiles};
use crate::vm::{RunningVm, Vm, VmmError};
use vm_jail as jail;
use vm_jail::seccomp::{self, ThreadKind};

/// The longest control line read at once; longer ones are unknown commands.
const MAX_CONTROL_LINE: u64 = 256;

/// The VMM's own console ring (the launcher keeps the tail it reads from stdout).
const CHILD_RING_BYTES: usize = 4096;

/// Why `vm-vmm` could not run its VM.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// Reading the configuration line failed.
    #[error("reading the configuration from stdin")]
    ReadConfig(#[source] io::Error),
    /// The configuration line is not a valid [`ProcessConfig`].
    #[error("invalid configuration")]
    ParseConfig(#[source] serde_json::Error),
    /// The launcher closed the channel before sending a configuration.
    #[error("no configuration: stdin ended after {0} bytes")]
    NoConfig(usize),
    /// Arming the parent-death signal failed.
    #[error("PR_SET_PDEATHSIG")]
    DeathSignal(#[source] nix::Error),
    /// The parent is not the launcher named in the configuration (it died before the signal was
    /// armed, and this process was adopted).
    #[error("launcher {expected} is gone (parent is now {actual})")]
    ParentGone {
        /// The launcher's pid from the configuration.
        expected: u32,
        /// The current parent.
        actual: u32,
    },
    /// Building or starting the VM failed.
    #[error("vm setup")]
    Vmm(#[source] VmmError),
    /// The configured snapshot or restore directory is refused.
    #[error("{what} directory")]
    Dir {
        /// `snapshot` or `restore`.
        what: &'static str,
        /// Why.
        #[source]
        source: DirError,
    },
    /// The snapshot could not be restored (or does not match the VM config).
    #[error("restoring the snapshot in {0}")]
    Restore(PathBuf, #[source] SnapshotError),
    /// The jail could not be built.
    #[error("jail")]
    Jail(#[source] jail::JailError),
    /// A seccomp filter could not be installed.
    #[error("seccomp")]
    Seccomp(#[source] seccomp::SeccompError),
    /// The control or restore thread could not be started.
    #[error("starting a thread")]
    Thread(#[source] io::Error),
    /// The restore thread panicked.
    #[error("the restore thread panicked")]
    RestorePanicked,
}

impl ChildError {
    fn exit_kind(&self) -> ExitKind {
        match self {
            ChildError::ParentGone { .. } => ExitKind::ParentGone,
            ChildError::Jail(_) => ExitKind::JailFailed,
            ChildError::Restore(..) | ChildError::RestorePanicked => ExitKind::RestoreFailed,
            _ => ExitKind::SetupFailed,
        }
    }
}

/// Runs `vm-vmm`: returns the exit code (the caller exits with it).
pub fn main() -> u8 {
    let kind = match run() {
        Ok(kind) => kind,
        Err(e) => {
            tracing::error!("{}", vm_error_chain::error_chain(&e));
            e.exit_kind()
        }
    };
    let _ = io::stdout().flush();
    tracing::info!("exit {kind:?}");
    kind.code()
}

/// Reads the first line of `control`: the configuration.
pub fn read_config(control: &mut impl BufRead) -> Result<ProcessConfig, ChildError> {
    let mut line = Vec::new();
    control
        .take(MAX_CONFIG_BYTES)
        .read_until(b'\n', &mut line)
        .map_err(ChildError::ReadConfig)?;
    if line.last() != Some(&b'\n') {
        return Err(ChildError::NoConfig(line.len()));
    }
    serde_json::from_slice(&line).map_err(ChildError::ParseConfig)
}

/// Arms `SIGKILL` on parent death, then checks the parent is still the launcher.
fn guard_parent(launcher: u32) -> Result<(), ChildError> {
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(ChildError::DeathSignal)?;
    let actual = nix::unistd::getppid().as_raw() as u32;
    if actual != launcher {
        return Err(ChildError::ParentGone {
            expected: launcher,
            actual,
        });
    }
    Ok(())
}

fn run() -> Result<ExitKind, ChildError> {
    let mut control = BufReader::new(io::stdin());
    let read = read_config(&mut control);
    jail::close_inherited_fds(read.as_ref().ok().and_then(|c| c.jail.as_ref()?.netns_fd));
    let mut cfg = read?;
    guard_parent(cfg.parent_pid)?;
    let snapshot_dir = cfg.snapshot_dir.take();
    if let Some(dir) = &snapshot_dir {
        snap::check_snapshot_dir(dir).map_err(|source| ChildError::Dir {
            what: "snapshot",
            source,
        })?;
    }
    let restore = cfg.restore.take();
    if let Some(dir) = &restore {
        snap::check_restore_dir(dir).map_err(|source| ChildError::Dir {
            what: "restore",
            source,
        })?;
    }
    if cfg.seccomp {
        seccomp::enable();
        if snapshot_dir.is_some() {
            seccomp::snapshot::enable_snapshots();
        }
    }
    let mut jail_cfg = cfg.jail.take();
    if let (Some(j), Some(dir)) = (jail_cfg.as_mut(), &snapshot_dir) {
        // The one place inside the jail the VMM may write, at its own path.
        j.binds.push(dir.clone());
    }
    if let Some(j) = &jail_cfg {
        // Still one thread here: the reaper side of the fork never returns.
        jail::enter(j).map_err(ChildError::Jail)?;
    }
    let console = ConsoleConfig {
        ring_bytes: CHILD_RING_BYTES,
        sink: Some(Box::new(io::stdout())),
    };
    let guest_mib = cfg.vm.mem_mib;
    let hooks = RestoreHooks::of(&cfg);
    let vm_cfg = cfg.vm;
    // Everything that opens a file or needs a privilege, before `confine`; no byte of a
    // snapshot's state is decoded yet.
    let built = match restore {
        Some(dir) => {
            let files = SnapshotFiles::open(&dir).map_err(|e| ChildError::Restore(dir.clone(), e));
            let pending = files.and_then(|files| {
                Vm::prepare_restore(vm_cfg, console, files)
                    .map_err(|e| ChildError::Restore(dir.clone(), e))
            })?;
            Built::Restoring(dir, pending)
        }
        None => Built::Ready(Vm::create_with_console(vm_cfg, console).map_err(ChildError::Vmm)?),
    };
    if let Some(j) = &jail_cfg {
        let writable = snapshot_dir.as_deref().map(|dir| jail::Writable {
            dir,
            max_file_bytes: snap::max_file_bytes(guest_mib),
        });
        jail::confine(j, guest_mib, writable).map_err(ChildError::Jail)?;
    }
    let vm = match built {
        Built::Ready(vm) => vm,
        Built::Restoring(dir, pending) => finish_restore(pending, dir, hooks)?,
    };
    let running = Arc::new(vm.start().map_err(ChildError::Vmm)?);
    let for_control = running.clone();
    // Held by the control thread while it runs a snapshot command and replies: a snapshot
    // that stops the VM ends the wait below, and the process must not exit before the reply.
    let replying = Arc::new(Mutex::new(()));
    let for_reply = replying.clone();
    std::thread::Builder::new()
        .name("vmm-control".into())
        .spawn(move || {
            obey(control, &for_control, snapshot_dir.as_deref(), &for_reply);
            // Never the last owner of the VM: its teardown closes fds, which this thread's
            // filter kills the process for (seen when end of file on stdin came after the
            // main thread had let go of its own reference). The main thread or the process's
            // exit releases the VM.
            std::mem::forget(for_control);
        })
        .map_err(ChildError::Thread)?;
    seccomp::apply(ThreadKind::Main).map_err(ChildError::Seccomp)?;
    let outcome = loop {
        if let Some(o) = running.wait_timeout(Duration::from_secs(1)) {
            break o;
        }
    };
    drop(replying.locked());
    Ok(classify(outcome))
}

/// The VM before `confine`: created, or built for a restore whose state waits to be decoded.
enum Built {
    Ready(Vm),
    Restoring(PathBuf, PendingRestore),
}

/// Step 2 of a restore (`PendingRestore::apply`: the state decoded and set) on a thread of
/// its own under the restore filter, after `confine`; the main thread waits for it. The
/// thread starts none, so no other thread inherits that filter, and the main thread's own
/// filter comes later, once the VM runs. A refused state hands the VM back, and it is
/// dropped here (closing its descriptors and its vsock socket, which the restore filter
/// does not allow).
fn finish_restore(
    pending: PendingRestore,
    dir: PathBuf,
    hooks: RestoreHooks,
) -> Result<Vm, ChildError> {
    let applied = std::thread::Builder::new()
        .name("vmm-restore".into())
        .spawn(move || {
            seccomp::apply(ThreadKind::Restore).map_err(ChildError::Seccomp)?;
            hooks.run();
            Ok(pending.apply())
        })
        .map_err(ChildError::Thread)?
        .join()
        .unwrap_or(Err(ChildError::RestorePanicked))?;
    applied.map_err(|failed| {
        let FailedRestore { error, vm } = *failed;
        drop(vm);
        ChildError::Restore(dir, error)
    })
}

/// The restore thread's test hook (builds with the `test-hooks` feature only).
#[derive(Clone, Copy)]
struct RestoreHooks {
    #[cfg(feature = "test-hooks")]
    forbidden_syscall: bool,
}

impl RestoreHooks {
    #[cfg(feature = "test-hooks")]
    fn of(cfg: &ProcessConfig) -> RestoreHooks {
        RestoreHooks {
            forbidden_syscall: cfg.test_forbidden_syscall_in_restore,
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    fn of(_: &ProcessConfig) -> RestoreHooks {
        RestoreHooks {}
    }

    /// Under the restore filter: `getppid`, which it does not allow, when asked.
    fn run(self) {
        #[cfg(feature = "test-hooks")]
        if self.forbidden_syscall {
            let _ = nix::unistd::getppid();
        }
    }
}

/// Reads control lines until [`STOP`], a snapshot that stops the VM, or end of file, then
/// stops the VM.
fn obey(
    mut control: impl BufRead,
    vm: &RunningVm,
    snapshot_dir: Option<&Path>,
    replying: &Mutex<()>,
) {
    seccomp::apply_or_exit(ThreadKind::Control);
    let mut warned = false;
    loop {
        let mut line = Vec::new();
        match control
            .by_ref()
            .take(MAX_CONTROL_LINE)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let whole = line.last() == Some(&b'\n');
        let cmd = line.trim_ascii();
        if cmd == STOP.as_bytes() {
            break;
        } else if cmd == METRICS.as_bytes() {
            crate::logger::write_metrics(&vm.metrics());
        } else if let Some(then) = snap::parse_command(cmd).filter(|_| whole) {
            let _replying = replying.locked();
            let reply = snap::handle(vm, snapshot_dir, then);
            let stopped = reply.ok && then == AfterSnapshot::Stop;
            snap::write_reply(&reply);
            if stopped {
                break;
            }
        } else if cmd.starts_with(super::SNAPSHOT.as_bytes()) {
            snap::write_reply(&snap::SnapshotReply::unknown_command());
        } else if !test_hook(cmd, vm) && !warned {
            tracing::warn!("ignoring unknown control commands");
            warned = true;
        }
    }
    vm.stop();
}

/// The test hooks' commands (builds with the `test-hooks` feature only); true when `cmd` was
/// one.
#[cfg(feature = "test-hooks")]
fn test_hook(cmd: &[u8], vm: &RunningVm) -> bool {
    if cmd == super::TEST_FORBIDDEN_SYSCALL.as_bytes() {
        // The control thread's filter kills the process here.
        let _ = nix::unistd::getppid();
    } else if cmd == super::TEST_LEAK.as_bytes() {
        let leak = vec![1u8; ((jail::VMM_OVERHEAD_MIB + 16) << 20) as usize];
        std::hint::black_box(&leak);
    } else if cmd == super::TEST_SNAPSHOT_UNCHECKED.as_bytes() {
        // The snapshot path without the configuration check: in a VMM not configured for
        // snapshots, the control thread's filter kills the process at its first system call.
        let _ = vm.snapshot(Path::new("/"), AfterSnapshot::Resume);
    } else {
        return false;
    }
    true
}

#[cfg(not(feature = "test-hooks"))]
fn test_hook(_: &[u8], _: &RunningVm) -> bool {
    false
}

fn classify(outcome: Result<VmExit, GuestFault>) -> ExitKind {
    match outcome {
        Ok(VmExit::Reset | VmExit::PowerOff | VmExit::Stopped) => ExitKind::Ended,
        Ok(VmExit::TripleFault) => ExitKind::TripleFault,
        Ok(VmExit::Halted) => ExitKind::Halted,
        Err(fault) => {
            tracing::error!("{fault}");
            ExitKind::GuestFault
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::write_config;

    #[test]
    fn config_is_the_first_line_and_bounded() {
        let cfg = ProcessConfig::new(crate::VmConfig::default());
        let mut bytes = Vec::new();
        write_config(&mut bytes, &cfg).unwrap();
        let line = bytes.clone();
        bytes.extend_from_slice(b"stop\n");
        let mut r = io::Cursor::new(bytes);
        let back = read_config(&mut r).unwrap();
        let mut again = Vec::new();
        write_config(&mut again, &back).unwrap();
        assert_eq!(again, line);
        let mut rest = String::new();
        r.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "stop\n");

        assert!(matches!(
            read_config(&mut io::Cursor::new(b"{\"mem_mib\":1".to_vec())),
            Err(ChildError::NoConfig(12))
        ));
        assert!(matches!(
            read_config(&mut io::Cursor::new(b"{}\n".to_vec())),
            Err(ChildError::ParseConfig(_))
        ));
        let huge = vec![b' '; MAX_CONFIG_BYTES as usize + 10];
        assert!(matches!(
            read_config(&mut io::Cursor::new(huge)),
            Err(ChildError::NoConfig(n)) if n as u64 == MAX_CONFIG_BYTES
        ));
    }

    #[test]
    fn guard_parent_refuses_a_stranger() {
        let err = guard_parent(1).unwrap_err();
        assert!(matches!(err, ChildError::ParentGone { expected: 1, .. }));
        assert_eq!(err.exit_kind(), ExitKind::ParentGone);
    }
}
