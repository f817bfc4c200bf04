//! Boot steps shared by the real backends: checking a plan, the run directory, the agent's
//! configuration and per-boot token (with the initrd that carries it), and waiting for the
//! agent to answer.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use guest_agent::AGENT_PORT;
use guest_agent::client::AgentClient;
use guest_agent::config::{AgentConfig, DiskMount, RootDisk};
use guest_agent::token::AgentToken;

use crate::machine::VmHandle;
use crate::{BootPlan, DriverError};

/// The guest's vsock context id.
pub(crate) const GUEST_CID: u64 = 3;

/// The hybrid-vsock socket the agent client connects to, inside the run dir (kvm; the tcg
/// driver pads this name, see [`unreachable_peer_socket_name`]).
pub(crate) const VSOCK_SOCKET: &str = "vsock.sock";

/// The per-boot agent token (hex, mode 0600), beside [`VSOCK_SOCKET`]: how a later `vm`
/// process attaches to a named VM ([`attach_client`]).
pub(crate) const AGENT_TOKEN: &str = "agent.token";

/// The per-boot initrd: the image's initramfs with the token archive appended (mode 0600).
pub(crate) const BOOT_INITRD: &str = "initrd.cpio";

/// The run-dir files every real backend creates besides its sockets.
pub(crate) const RUN_FILES: [&str; 2] = [AGENT_TOKEN, BOOT_INITRD];

/// Longest Unix socket path (sun_path is 108 bytes including the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The virtio-blk serial (agent disk id) of disk `index`.
pub(crate) fn disk_id(index: usize) -> String {
    format!("disk{index}")
}

fn invalid(reason: String) -> DriverError {
    DriverError::InvalidPlan { reason }
}

/// The hybrid-vsock socket name for a backend whose vsock device connects a guest connection
/// to host port P to `<socket>_P` (vhost-device-vsock does): `vsock.sock` padded so the socket
/// path in `run_dir` is exactly [`MAX_SOCKET_PATH`] bytes. Every `<socket>_P` is then longer
/// than any Unix socket path, so no host listener can ever be reached from the guest, whatever
/// is created in the directory. `None` when `run_dir` is already too long.
pub(crate) fn unreachable_peer_socket_name(run_dir: &Path) -> Option<String> {
    let base = run_dir.as_os_str().len() + 1 + VSOCK_SOCKET.len();
    let pad = MAX_SOCKET_PATH.checked_sub(base)?;
    Some(format!("vsock{}.sock", "-".repeat(pad)))
}

/// Checks that `path` is an existing regular file.
pub(crate) fn require_file(field: &str, path: &Path) -> Result<(), DriverError> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(invalid(format!(
            "{field}: {} is not a regular file",
            path.display()
        ))),
        Err(e) => Err(invalid(format!("{field}: {}: {e}", path.display()))),
    }
}

/// Checks the parts of a plan every backend depends on.
pub(crate) fn check_plan(plan: &BootPlan) -> Result<(), DriverError> {
    if plan.vcpus == 0 || plan.vcpus > 255 {
        return Err(invalid(format!("vcpus: {} is not in 1..=255", plan.vcpus)));
    }
    if plan.mem_mib < 64 {
        return Err(invalid(format!("mem_mib: {} is below 64", plan.mem_mib)));
    }
    require_file("images.initramfs", &plan.images.initramfs)?;
    for (i, d) in plan.disks.iter().enumerate() {
        require_file(&format!("disks[{i}].host_path"), &d.host_path)?;
    }
    if let Some(r) = &plan.rootfs {
        require_file("rootfs.host_path", &r.host_path)?;
    }
    let sock = plan.run_dir.join(VSOCK_SOCKET);
    if sock.as_os_str().len() > MAX_SOCKET_PATH - 8 {
        return Err(invalid(format!(
            "run_dir: {} is too long for a Unix socket path",
            plan.run_dir.display()
        )));
    }
    Ok(())
}

/// A hostname the agent accepts, derived from the plan name.
pub(crate) fn hostname(name: &str) -> String {
    let h: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if h.is_empty() { "vm".into() } else { h }
}

/// The agent configuration for a plan, rendered as kernel command-line words.
pub(crate) fn agent_cmdline(plan: &BootPlan) -> Result<String, DriverError> {
    let cfg = AgentConfig {
        hostname: hostname(&plan.name),
        pids_max: (plan.pids_max > 0).then_some(plan.pids_max),
        disks: plan
            .disks
            .iter()
            .enumerate()
            .map(|(i, d)| DiskMount {
                id: disk_id(i),
                guest_path: d.guest_path.clone(),
                fs: d.fs,
            })
            .collect(),
        root: plan.rootfs.as_ref().map(|r| RootDisk {
            id: crate::ROOT_DISK_SERIAL.into(),
            fs: r.fs,
        }),
        port: AGENT_PORT,
        ..AgentConfig::default()
    };
    cfg.to_cmdline()
        .map_err(|e| invalid(format!("agent configuration: {e}")))
}

/// Make this boot's agent token: write it to [`AGENT_TOKEN`] and write [`BOOT_INITRD`] (the
/// plan's initramfs, zero-padded to 4 bytes, then [`AgentToken::initrd_archive`]); the kernel
/// unpacks both archives, and the agent takes the token from its rootfs before it listens.
/// Returns the token and the initrd path the backend boots with.
pub(crate) fn boot_secret(
    plan: &BootPlan,
    run: &RunDir,
) -> Result<(AgentToken, PathBuf), DriverError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let token = AgentToken::generate().map_err(DriverError::Token)?;
    token
        .write_file(&run.path(AGENT_TOKEN))
        .map_err(DriverError::Token)?;
    let path = run.path(BOOT_INITRD);
    let io_err = |what, p: &Path| {
        let p = p.to_path_buf();
        move |source| DriverError::Io {
            what,
            path: p,
            source,
        }
    };
    let mut base = fs::File::open(&plan.images.initramfs)
        .map_err(io_err("opening initramfs", &plan.images.initramfs))?;
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(io_err("creating boot initrd", &path))?;
    let n = io::copy(&mut base, &mut out).map_err(io_err("writing boot initrd", &path))?;
    let pad = [0u8; 4];
    out.write_all(&pad[..((4 - n % 4) % 4) as usize])
        .and_then(|()| out.write_all(&token.initrd_archive()))
        .map_err(io_err("writing boot initrd", &path))?;
    Ok((token, path))
}

/// The agent client for a VM whose hybrid-vsock socket is `agent_socket`, presenting the token
/// its boot left beside it. For a process other than the one that booted it (`vm exec NAME`).
pub fn attach_client(agent_socket: &Path) -> Result<AgentClient, DriverError> {
    let token = AgentToken::read_file(&agent_socket.with_file_name(AGENT_TOKEN))
        .map_err(DriverError::Token)?;
    Ok(AgentClient::hybrid_vsock(agent_socket, AGENT_PORT).with_token(token))
}

/// The files a driver creates in the run dir; removed (and the dir, if we created it) on drop.
#[derive(Debug)]
pub(crate) struct RunDir {
    dir: PathBuf,
    created_dir: bool,
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl RunDir {
    /// Creates `dir` if needed and claims `names` inside it. Refuses if any of them already
    /// exists (it may belong to another VM).
    pub(crate) fn prepare(dir: &Path, names: &[&str]) -> Result<RunDir, DriverError> {
        // Absolute, so the paths still name the same files for a process whose working
        // directory differs (a jailed VMM's is its own root).
        let dir = &std::path::absolute(dir).map_err(|source| DriverError::Io {
            what: "resolving run dir",
            path: dir.to_path_buf(),
            source,
        })?;
        let created_dir = !dir.exists();
        fs::create_dir_all(dir).map_err(|source| DriverError::Io {
            what: "creating run dir",
            path: dir.to_path_buf(),
            source,
        })?;
        let mut run = RunDir {
            dir: dir.to_path_buf(),
            created_dir,
            files: Vec::new(),
            dirs: Vec::new(),
        };
        for name in names {
            let p = dir.join(name);
            if fs::symlink_metadata(&p).is_ok() {
                return Err(invalid(format!("run_dir: {} already exists", p.display())));
            }
            run.files.push(p);
        }
        Ok(run)
    }

    /// Creates the empty directory `name` inside (refused if it exists); removed on cleanup.
    pub(crate) fn make_dir(&mut self, name: &str) -> Result<PathBuf, DriverError> {
        let p = self.dir.join(name);
        fs::create_dir(&p).map_err(|source| DriverError::Io {
            what: "creating",
            path: p.clone(),
            source,
        })?;
        self.dirs.push(p.clone());
        Ok(p)
    }

    /// The run directory (absolute).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Removes the claimed files (and `<vsock.sock>_<port>` listeners a guest connection may
    /// have looked for are never created by us, so they are left alone), then the directory if
    /// this boot created it and it is empty.
    pub(crate) fn cleanup(&mut self) {
        for f in self.files.drain(..) {
            match fs::remove_file(&f) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(path = %f.display(), error = %e, "cannot remove run file"),
            }
        }
        for d in self.dirs.drain(..) {
            if let Err(e) = fs::remove_dir(&d) {
                tracing::warn!(path = %d.display(), error = %e, "cannot remove run dir entry");
            }
        }
        if self.created_dir {
            self.created_dir = false;
            let _ = fs::remove_dir(&self.dir);
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// What the guest agent prints on the console once its vsock listener is bound
/// (`vm-agent: ready port=<port> proto=<n>`, guest-agent `run.rs`).
pub(crate) const AGENT_READY_MARKER: &str = "vm-agent: ready port=";

/// How often the console is checked for [`AGENT_READY_MARKER`].
const CONSOLE_POLL: Duration = Duration::from_millis(20);

/// Like [`wait_for_agent`], but sends nothing to the agent socket before `marker` has appeared
/// on the console (both waits share `timeout`).
///
/// For backends whose vsock device must not see a host connection while the guest is still
/// starting it: `vhost-device-vsock` 0.3.0 handles a host `CONNECT` that arrives between the
/// guest's memory table and its TX vring being set up by returning `QueueNotReady` from its
/// vring worker, which ends that thread for good: the process stays up, but no later
/// connection is ever answered (observed as a whole boot timeout with the agent's ready line on
/// the console). The guest starts its vsock device long before the agent can print the marker,
/// so connecting only afterwards never hits that window. The marker is only a hint of when to
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

/// "the vm stopped before the agent answered", with the backend's account of how.
fn stopped_reason(handle: &dyn VmHandle) -> String {
    let detail = handle.stop_detail();
    let why = "the vm stopped before the agent answered";
    if detail.is_empty() {
        why.to_string()
    } else {
        format!("{why}: {detail}")
    }
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

    use guest_agent::frame::encode_frame;
    use guest_agent::protocol::{AgentFrame, AgentInfo, MAX_FRAME};

    use super::*;
    use crate::test_support::dummy_plan;
    use crate::{DiskFs, DiskPlan};

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
            self.console.lock().unwrap().clone()
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
            version: guest_agent::PROTOCOL_VERSION,
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
            vm.console.lock().unwrap().push_str(
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
        vm.console.lock().unwrap().push_str("Linux version 6.12\n");
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

    #[test]
    fn hostname_is_sanitized() {
        assert_eq!(hostname("my box/1"), "my-box-1");
        assert_eq!(hostname(""), "vm");
        assert_eq!(hostname(&"x".repeat(100)).len(), 64);
    }

    #[test]
    fn agent_cmdline_carries_disks_and_pids() {
        let mut plan = dummy_plan();
        plan.pids_max = 64;
        plan.disks = vec![DiskPlan {
            host_path: "/x".into(),
            guest_path: "/data".into(),
            fs: DiskFs::Erofs,
        }];
        let words = agent_cmdline(&plan).unwrap();
        assert!(words.contains("vm.pids=64"), "{words}");
        assert!(words.contains("vm.disk=disk0:/data:erofs"), "{words}");
        assert!(words.contains(&format!("vm.port={AGENT_PORT}")), "{words}");
        let (parsed, _) = AgentConfig::from_cmdline(&words).unwrap();
        assert_eq!(parsed.disks[0].id, "disk0");
    }

    #[test]
    fn bad_guest_path_is_an_invalid_plan() {
        let mut plan = dummy_plan();
        plan.disks = vec![DiskPlan {
            host_path: "/x".into(),
            guest_path: "relative".into(),
            fs: DiskFs::Raw,
        }];
        assert!(matches!(
            agent_cmdline(&plan),
            Err(DriverError::InvalidPlan { .. })
        ));
    }

    #[test]
    fn check_plan_names_the_missing_file() {
        let err = check_plan(&dummy_plan()).unwrap_err().to_string();
        assert!(err.contains("images.initramfs"), "{err}");
    }

    #[test]
    fn run_dir_refuses_existing_files_and_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let mut run = RunDir::prepare(&dir, &["a.sock"]).unwrap();
        fs::write(run.path("a.sock"), b"").unwrap();
        assert!(RunDir::prepare(&dir, &["a.sock"]).is_err());
        let sub = run.make_dir("root").unwrap();
        assert!(sub.is_dir());
        assert!(run.make_dir("root").is_err());
        run.cleanup();
        assert!(!dir.exists(), "created run dir was not removed");
        // A pre-existing dir is kept.
        fs::create_dir(&dir).unwrap();
        drop(RunDir::prepare(&dir, &["a.sock"]).unwrap());
        assert!(dir.exists());
    }

    #[test]
    fn padded_socket_leaves_no_reachable_peer_path() {
        let tmp = tempfile::tempdir().unwrap();
        let name = unreachable_peer_socket_name(tmp.path()).unwrap();
        let sock = tmp.path().join(&name);
        assert_eq!(sock.as_os_str().len(), MAX_SOCKET_PATH);
        // The agent socket itself binds and connects ...
        let l = UnixListener::bind(&sock).unwrap();
        UnixStream::connect(&sock).unwrap();
        drop(l);
        // ... but nothing can ever listen where a guest connection to a host port would go.
        for port in [0u32, 1, 5555, u32::MAX] {
            let peer = format!("{}_{port}", sock.display());
            assert!(UnixListener::bind(&peer).is_err(), "{peer} bindable");
            assert!(UnixStream::connect(&peer).is_err(), "{peer} connectable");
        }
        let long = PathBuf::from(format!("/{}", "d".repeat(100)));
        assert_eq!(unreachable_peer_socket_name(&long), None);
    }

    #[test]
    fn boot_secret_writes_a_private_token_and_an_initrd_that_ends_with_it() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let mut plan = dummy_plan();
        plan.images.initramfs = tmp.path().join("base.cpio");
        fs::write(&plan.images.initramfs, b"0707010base").unwrap(); // 11 bytes: padded to 12
        let run = RunDir::prepare(&tmp.path().join("run"), &RUN_FILES).unwrap();
        let (token, initrd) = boot_secret(&plan, &run).unwrap();
        let bytes = fs::read(&initrd).unwrap();
        assert!(bytes.starts_with(b"0707010base\0"));
        assert_eq!(&bytes[12..], &token.initrd_archive()[..]);
        for p in [&initrd, &run.path(AGENT_TOKEN)] {
            let mode = fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", p.display());
        }
        let sock = run.path(VSOCK_SOCKET);
        let client = attach_client(&sock).unwrap();
        drop(client);
        // A second boot in the same run dir refuses to reuse the files.
        assert!(boot_secret(&plan, &run).is_err());
    }
}
