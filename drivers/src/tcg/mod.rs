//! `tcg`: QEMU with software CPU emulation (`-accel tcg`), plus `vm-vsock`, our vsock device
//! as a vhost-user backend (`vmm::virtio::vsock::vhost_user`: the same muxer, credit and
//! `CONNECT` code as the kvm VMM's in-process device), for the hybrid-vsock channel to the
//! guest agent.
//!
//! Containment is `UserKernel`: the guest has its own kernel, but the CPU is emulated by a
//! host user-space process; there is no hardware virtualization boundary, so the admission
//! gate accepts it for untrusted work only with an explicit policy flag.
//!
//! Boot order: `vm-vsock` first (the driver waits for its vhost-user socket), then QEMU; the
//! agent socket is first contacted only once the agent's ready line is on the console
//! (`boot::wait_for_agent_after_console`). That wait was added for the previous backend
//! (vhost-device-vsock 0.3.0 lost its vring worker to a connection made while the guest was
//! still setting up the device); ours serves no queue before QEMU enabled it and holds such a
//! connection until it is, so the wait is no longer needed. It stays because it is harmless
//! and cheaper: the agent cannot answer before that line, and polling the console costs
//! nothing, while each early `CONNECT` would hold a connection until the guest's listener
//! exists or its deadline passes.
//! Both children are owned by the machine's handle: own process groups, parent-death
//! `SIGKILL`, killed and reaped on close, on wall expiry and on drop, and their socket files
//! removed. Thread caveat: Linux sends the parent-death signal when the *thread* that forked
//! the child exits, so every child is forked by one long-lived spawner thread that lives as
//! long as the process (a child forked from, say, a tokio blocking thread would otherwise die
//! when that idle thread is retired). The serial
//! console is QEMU's stdout, read into a bounded ring.

pub mod args;
mod clock;
pub mod jail;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vm_agent_client::AgentClient;
use vm_agent_protocol::AGENT_PORT;
use vm_spec::Containment;
use vm_sync::Lock;

use crate::boot::{self, GUEST_CID, RunDir};
use crate::machine::{MachineInfo, VmHandle};
use crate::process::{Supervised, spawn_jailed};
use crate::{Availability, BootPlan, Driver, DriverError, Machine};
pub use args::{QemuConfig, qemu_args, virtiofs_args, vsock_args};

/// The QEMU binary name.
pub const QEMU: &str = "qemu-system-x86_64";
/// Our vhost-user vsock backend (`vmm/src/bin/vm-vsock.rs`).
pub const VM_VSOCK: &str = "vm-vsock";
/// Our vhost-user read-only file server, one per host mount (`vmm/src/bin/vm-virtiofs.rs`).
pub const VM_VIRTIOFS: &str = "vm-virtiofs";
/// The inode cap of each share's server (its `RLIMIT_NOFILE` follows).
pub const MAX_INODES: usize = vm_virtiofs::fs::DEFAULT_MAX_INODES;
/// The vhost-user control socket, inside the run dir.
const VHOST_SOCKET: &str = "vhu.sock";
/// Console bytes kept.
const CONSOLE_RING_BYTES: usize = 256 * 1024;
/// How long vm-vsock gets to create its vhost-user socket.
const VHOST_READY: Duration = Duration::from_secs(5);

/// The QEMU TCG driver.
#[derive(Debug, Clone, Default)]
pub struct TcgDriver {
    /// Explicit binaries (tests); `None` finds QEMU on `PATH` (then `~/.cargo/bin`) and
    /// `vm-vsock` as the kvm driver finds `vm-vmm` (`$VM_VSOCK_BIN`, next to the running
    /// executable, one directory up), then on `PATH`.
    binaries: Option<(PathBuf, PathBuf)>,
}

/// Finds `program` on `PATH`, then in `$HOME/.cargo/bin`.
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let cargo_bin = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"));
    std::env::split_paths(&path)
        .chain(cargo_bin)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

/// `vm-vsock`: where the kvm driver looks for `vm-vmm`, then on `PATH`.
pub fn find_vsock_backend() -> Option<PathBuf> {
    find_backend(VM_VSOCK, crate::kvm::VSOCK_BIN_ENV)
}

/// `vm-virtiofs`: where `vm-vsock` is looked for (`$VM_VIRTIOFS_BIN` first).
pub fn find_virtiofs_backend() -> Option<PathBuf> {
    find_backend(VM_VIRTIOFS, crate::kvm::VIRTIOFS_BIN_ENV)
}

fn find_backend(name: &'static str, env: &str) -> Option<PathBuf> {
    crate::kvm::locate::workspace_binary(name, env)
        .ok()
        .filter(|p| is_executable(p))
        .or_else(|| find_program(name))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

impl TcgDriver {
    /// The driver, locating its binaries at detect/boot time.
    pub fn new() -> TcgDriver {
        TcgDriver { binaries: None }
    }

    /// The driver with explicit `qemu-system-x86_64` and `vm-vsock` paths.
    pub fn with_binaries(qemu: PathBuf, vsock: PathBuf) -> TcgDriver {
        TcgDriver {
            binaries: Some((qemu, vsock)),
        }
    }

    fn locate(&self) -> Result<(PathBuf, PathBuf), String> {
        let (qemu, vhost) = match &self.binaries {
            Some((q, v)) => (
                is_executable(q).then(|| q.clone()),
                is_executable(v).then(|| v.clone()),
            ),
            None => (find_program(QEMU), find_vsock_backend()),
        };
        match (qemu, vhost) {
            (Some(q), Some(v)) => Ok((q, v)),
            (q, v) => {
                let mut missing = Vec::new();
                if q.is_none() {
                    missing.push(format!("{QEMU} (apt-get install qemu-system-x86)"));
                }
                if v.is_none() {
                    missing.push(format!(
                        "{VM_VSOCK} (cargo build -p vmm --bin {VM_VSOCK}; or set ${})",
                        crate::kvm::VSOCK_BIN_ENV
                    ));
                }
                Err(format!(
                    "not found (next to this program, on PATH or in ~/.cargo/bin): {}",
                    missing.join(", ")
                ))
            }
        }
    }
}

/// Why a DAX window cannot be had on tcg.
pub const NO_DAX: &str = "tcg has no DAX window (QEMU 7.2's vhost-user-fs device has no shared-memory region); leave it unset or 0: the guest reads host mounts into its own page cache";

/// Why the tcg road has no snapshots (shown by `vm drivers`, the error of every restore).
/// QEMU's migration stream would carry the CPU, RAM and emulated devices, but QEMU 7.2 marks a
/// `vhost-user-vsock` device unmigratable and refuses to save a VM that has one; the
/// connection state lives in our `vm-vsock` backend besides. A restore without the vsock
/// device would leave no way to reach the agent, and a newer QEMU (bookworm-backports' 10.0)
/// was not adopted for this alone: refused, rather than faked with a pool of warm VMs.
pub const SNAPSHOTS_UNSUPPORTED: &str = "QEMU 7.2 refuses to migrate a vhost-user-vsock device (the agent's only channel), so a tcg VM cannot be saved; snapshots need the kvm driver";

impl Driver for TcgDriver {
    fn name(&self) -> &'static str {
        "tcg"
    }

    fn containment(&self) -> Containment {
        Containment::UserKernel
    }

    fn detect(&self) -> Availability {
        match self.locate() {
            Ok((q, v)) => Availability::yes(format!(
                "QEMU TCG is emulated (software CPU, no hardware virtualization boundary): {} with our vsock backend {}",
                q.display(),
                v.display()
            )),
            Err(why) => Availability::no(format!("QEMU TCG unavailable: {why}")),
        }
    }

    fn jail(&self) -> Option<crate::JailReport> {
        Some(crate::jail::tcg_report())
    }

    /// QEMU's `microvm` machine has 8 virtio-mmio transports (without its second IOAPIC,
    /// which a guest without ACPI cannot find); the vsock takes one, and each disk and share
    /// one more.
    fn max_disks(&self) -> usize {
        7
    }

    fn dax_window_mib(&self, asked: Option<u32>, _mem_mib: u32) -> Result<u32, DriverError> {
        crate::no_dax_window("tcg", asked, NO_DAX)
    }

    fn snapshots(&self) -> Availability {
        Availability::no(SNAPSHOTS_UNSUPPORTED)
    }

    fn boot(&self, plan: BootPlan) -> Result<Machine, DriverError> {
        let (qemu_bin, vhost_bin) = self.locate().map_err(|reason| DriverError::Unsupported {
            driver: "tcg",
            reason,
        })?;
        boot::check_plan(&plan)?;
        self.dax_window_mib(plan.dax_window_mib, plan.mem_mib)?;
        boot::require_file("images.bz_image", &plan.images.bz_image)?;
        let kernel_kind = boot::kernel_kind(&plan)?;
        boot::check_device_count(&plan, self.max_disks())?;
        let virtiofs_bin = match plan.shares.is_empty() {
            true => None,
            false => Some(find_virtiofs_backend().ok_or_else(|| DriverError::Unsupported {
                driver: "tcg",
                reason: format!(
                    "{VM_VIRTIOFS} not found (cargo build -p vmm --bin {VM_VIRTIOFS}; or set ${}): every host mount is served by it",
                    crate::kvm::VIRTIOFS_BIN_ENV
                ),
            })?),
        };
        let cmdline = boot::agent_cmdline(&plan, false)?;
        // Our backend never connects a guest request anywhere; the socket path stays padded so
        // that no `<uds>_<port>` path (where other hybrid-vsock backends connect them) can
        // exist either (see boot::unreachable_peer_socket_name).
        let vsock_name = boot::unreachable_peer_socket_name(&plan.run_dir).ok_or_else(|| {
            DriverError::InvalidPlan {
                reason: format!("run_dir: {} is too long", plan.run_dir.display()),
            }
        })?;
        let jailed = crate::jail::tcg_report()
            .decide(plan.allow_weaker_jail)
            .map_err(|reason| DriverError::JailUnavailable {
                driver: "tcg",
                reason,
            })?;
        let share_names: Vec<String> = (0..plan.shares.len())
            .map(|i| format!("{}.sock", boot::share_tag(i)))
            .collect();
        let mut files = vec![VHOST_SOCKET, vsock_name.as_str()];
        files.extend(share_names.iter().map(String::as_str));
        files.extend(boot::RUN_FILES);
        let mut run = RunDir::prepare(&plan.run_dir, &files)?;
        let vhost_sock = run.path(VHOST_SOCKET);
        let uds = run.path(&vsock_name);
        let (token, initrd) = boot::boot_secret(&plan, &run)?;
        let roots = if jailed {
            Some(jail::roots(&mut run)?)
        } else {
            None
        };

        let vhost_jail = match &roots {
            Some((root, _)) => Some(jail::vhost(
                &vhost_bin,
                run.dir(),
                root.clone(),
                plan.mem_mib,
            )?),
            None => None,
        };
        let vhost = start_vsock(&vhost_bin, &vhost_sock, &uds, vhost_jail)?;
        let mut share_sockets = Vec::new();
        let mut shares = Vec::new();
        for (i, share) in plan.shares.iter().enumerate() {
            let sock = run.path(&share_names[i]);
            let bin = virtiofs_bin.as_deref().unwrap_or(Path::new(VM_VIRTIOFS));
            let jail = match jailed {
                true => {
                    let root = jail::share_root(&mut run, i)?;
                    Some(jail::virtiofs(
                        bin,
                        run.dir(),
                        root,
                        &share.host_path,
                        plan.mem_mib,
                        vhost.pid(),
                    )?)
                }
                false => None,
            };
            let args = virtiofs_args(&sock, &share.host_path, MAX_INODES);
            shares.push(start_backend(VM_VIRTIOFS, bin, args, &sock, jail)?);
            share_sockets.push(sock);
        }
        let disks = plan.block_devices();
        let disk_files = if jailed {
            jail::open_disks(&disks)?
        } else {
            Vec::new()
        };
        let qemu_jail = match &roots {
            Some((_, root)) => Some(jail::qemu(jail::QemuJail {
                bin: &qemu_bin,
                run_dir: run.dir(),
                jail_root: root.clone(),
                kernel: &plan.images.bz_image,
                initrd: &initrd,
                mem_mib: plan.mem_mib,
                vhost_pid: vhost.pid(),
                disks: &disk_files,
            })?),
            None => None,
        };
        let qcfg = QemuConfig {
            mem_mib: plan.mem_mib,
            vcpus: plan.vcpus,
            kernel: plan.images.bz_image.clone(),
            initramfs: initrd,
            extra_cmdline: cmdline,
            vhost_socket: vhost_sock,
            disks,
            disk_fds: disk_files
                .iter()
                .map(std::os::fd::AsRawFd::as_raw_fd)
                .collect(),
            share_sockets,
            kernel_kind,
            tsc_khz: match kernel_kind {
                boot::KernelKind::Distribution => clock::host_tsc_khz(),
                boot::KernelKind::Tuned => None,
            },
        };
        let mut cmd = Command::new(&qemu_bin);
        cmd.args(qemu_args(&qcfg))
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let qemu = spawn_jailed(QEMU, cmd, CONSOLE_RING_BYTES, qemu_jail)
            .map_err(|source| spawn_error(QEMU, source))?;
        // QEMU has its own copies of the disk descriptors now.
        drop(disk_files);
        tracing::info!(name = %plan.name, qemu = qemu.pid(), vhost = vhost.pid(), shares = shares.len(), "tcg vm started");

        let handle = TcgHandle {
            qemu,
            vhost,
            shares,
            run: Mutex::new(run),
        };
        let client = AgentClient::hybrid_vsock(uds.clone(), AGENT_PORT).with_token(token);
        let ready = boot::wait_for_agent_after_console(
            &handle,
            &client,
            boot::AGENT_READY_MARKER,
            plan.boot_timeout,
        );
        if let Err(e) = ready {
            let killed = handle.seccomp_killed();
            handle.kill();
            return Err(match killed {
                Some((program, output)) => DriverError::SeccompKilled {
                    program: program.into(),
                    console_tail: format!("{}{output}", handle.console_tail()),
                },
                None => e,
            });
        }
        let info = MachineInfo {
            name: plan.name,
            driver: "tcg",
            containment: Containment::UserKernel,
            wall: plan.wall,
            agent_socket: uds,
        };
        Machine::new(info, Box::new(handle), client)
    }
}

/// A spawn failure: the jail step that failed, when the jail's hook reported one.
fn spawn_error(program: &str, source: std::io::Error) -> DriverError {
    match vm_jail::exec::spawn_error(&source) {
        Some(step) => DriverError::Jail {
            program: program.into(),
            source: step.into(),
        },
        None => DriverError::Spawn {
            program: program.into(),
            source,
        },
    }
}

/// Starts vm-vsock (in `jail`, if any) and waits until its vhost-user socket exists.
fn start_vsock(
    bin: &Path,
    vhost_sock: &Path,
    uds: &Path,
    jail: Option<vm_jail::exec::ExecJail>,
) -> Result<Supervised, DriverError> {
    let args = vsock_args(GUEST_CID, vhost_sock, uds);
    start_backend(VM_VSOCK, bin, args, vhost_sock, jail)
}

/// Starts the vhost-user backend `program` at `bin` with `args` (in `jail`, if any) and waits
/// until its socket `sock` exists.
fn start_backend(
    program: &'static str,
    bin: &Path,
    args: Vec<std::ffi::OsString>,
    sock: &Path,
    jail: Option<vm_jail::exec::ExecJail>,
) -> Result<Supervised, DriverError> {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = spawn_jailed(program, cmd, 16 * 1024, jail)
        .map_err(|source| spawn_error(program, source))?;
    let deadline = Instant::now() + VHOST_READY;
    while !sock.exists() {
        let fail = |reason: &str| DriverError::Helper {
            program: program.into(),
            reason: reason.into(),
            output: child.output_tail(),
        };
        if !child.is_running() {
            return Err(fail("exited before creating its socket"));
        }
        if Instant::now() >= deadline {
            return Err(fail("did not create its socket within 5s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(child)
}

/// The child processes of one TCG VM (QEMU, the vsock backend, one file server per share),
/// and its run-dir files.
struct TcgHandle {
    qemu: Supervised,
    vhost: Supervised,
    shares: Vec<Supervised>,
    run: Mutex<RunDir>,
}

impl TcgHandle {
    /// The child a seccomp filter killed (it, or its reaper mirroring it, ended by `SIGSYS`),
    /// with its output.
    fn seccomp_killed(&self) -> Option<(&'static str, String)> {
        use std::os::unix::process::ExitStatusExt;
        [(QEMU, &self.qemu), (VM_VSOCK, &self.vhost)]
            .into_iter()
            .chain(self.shares.iter().map(|c| (VM_VIRTIOFS, c)))
            .find(|(_, c)| {
                c.exit_status()
                    .is_some_and(|s| s.signal() == Some(libc::SIGSYS))
            })
            .map(|(p, c)| (p, c.output_tail()))
    }
}

impl VmHandle for TcgHandle {
    fn is_running(&self) -> bool {
        self.qemu.is_running()
            && self.vhost.is_running()
            && self.shares.iter().all(|s| s.is_running())
    }

    fn kill(&self) {
        self.qemu.kill_and_reap();
        self.vhost.kill_and_reap();
        for s in &self.shares {
            s.kill_and_reap();
        }
        self.run.locked().cleanup();
    }

    fn wait(&self, timeout: Duration) -> bool {
        self.qemu.wait_exit(timeout)
    }

    fn console_tail(&self) -> String {
        self.qemu.output_tail()
    }

    fn host_pids(&self) -> Vec<u32> {
        let mut pids = vec![self.qemu.pid(), self.vhost.pid()];
        pids.extend(self.shares.iter().map(Supervised::pid));
        pids
    }

    fn stop_detail(&self) -> String {
        let mut parts = Vec::new();
        parts.extend(self.qemu.ended_detail(QEMU, |st| st.to_string()));
        let backends = [(VM_VSOCK, &self.vhost)]
            .into_iter()
            .chain(self.shares.iter().map(|s| (VM_VIRTIOFS, s)));
        for (program, child) in backends {
            if let Some(st) = child.exit_status() {
                let out = child.output_tail();
                parts.push(format!(
                    "{program} ended ({st}); its output: {:?}",
                    out.trim()
                ));
            }
        }
        parts.join("; ")
    }
}

impl Drop for TcgHandle {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_on_this_host_is_ok_and_says_emulated() {
        let a = TcgDriver::new().detect();
        if find_program(QEMU).is_none() || find_vsock_backend().is_none() {
            crate::test_support::skip(&format!(
                "SKIP detect_on_this_host_is_ok_and_says_emulated: {}",
                a.detail
            ));
            return;
        }
        assert!(a.ok, "{}", a.detail);
        assert!(a.detail.contains("emulated"), "{}", a.detail);
        assert!(
            a.detail.contains("no hardware virtualization boundary"),
            "{}",
            a.detail
        );
    }

    #[test]
    fn missing_binaries_are_named() {
        let d = TcgDriver::with_binaries("/nonexistent/qemu".into(), "/nonexistent/vhost".into());
        let a = d.detect();
        assert!(!a.ok);
        assert!(
            a.detail.contains(QEMU) && a.detail.contains(VM_VSOCK),
            "{}",
            a.detail
        );
        assert!(matches!(
            d.boot(crate::test_support::dummy_plan()),
            Err(DriverError::Unsupported { driver: "tcg", .. })
        ));
    }

    #[test]
    fn containment_is_user_kernel() {
        assert_eq!(TcgDriver::new().containment(), Containment::UserKernel);
    }
}
