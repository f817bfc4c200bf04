//! Runs a VM in its own `vm-vmm` process, as the kvm driver does: jailed (its root a tmpfs in a
//! private temporary directory, the directories of its vsock sockets bound inside) with seccomp
//! filters on, the configuration on the control channel, the console (and diagnostics)
//! collected from its pipes into a bounded buffer, `stop` on the control channel, the exit
//! status classified.

#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, ChildStdin};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_sync::Lock;
use vmm::VmConfig;
use vmm::process::{JailConfig, ProcessConfig, ProcessExit};
use vmm::virtio::DeviceConfig;

/// The newest bytes kept from the console.
const KEEP: usize = 1 << 20;

/// One `vm-vmm` process.
pub struct VmProc {
    child: Child,
    control: Option<ChildStdin>,
    console: Arc<Mutex<Vec<u8>>>,
    exit: Option<ProcessExit>,
    /// The threads reading stdout and stderr (they end at end of file).
    readers: Vec<std::thread::JoinHandle<()>>,
    _jail_dir: Option<tempfile::TempDir>,
}

fn collect(
    mut src: impl Read + Send + 'static,
    into: Arc<Mutex<Vec<u8>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = src.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut c = into.locked();
            c.extend_from_slice(&buf[..n]);
            let extra = c.len().saturating_sub(KEEP);
            c.drain(..extra);
        }
    })
}

impl VmProc {
    /// Starts `vm-vmm` for `cfg` (its console settings are ignored: the console is the pipe).
    pub fn start(cfg: VmConfig) -> VmProc {
        let dir = tempfile::tempdir().expect("jail dir");
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("jail root");
        let mut binds: Vec<_> = cfg
            .devices
            .iter()
            .filter_map(|d| match d {
                DeviceConfig::Vsock { uds_path, .. } => uds_path.parent().map(|p| p.to_path_buf()),
                _ => None,
            })
            .collect();
        binds.dedup();
        let mut pc = ProcessConfig::new(cfg);
        pc.jail = Some(JailConfig {
            root,
            binds,
            ..JailConfig::default()
        });
        pc.seccomp = true;
        let mut vm = Self::start_process(&pc);
        vm._jail_dir = Some(dir);
        vm
    }

    /// Sends a raw control line.
    pub fn send_line(&mut self, line: &str) {
        use std::io::Write;
        if let Some(c) = self.control.as_mut() {
            let _ = writeln!(c, "{line}").and_then(|_| c.flush());
        }
    }

    /// Starts `vm-vmm` for `cfg`.
    pub fn start_process(cfg: &ProcessConfig) -> VmProc {
        let bin = env!("CARGO_BIN_EXE_vm-vmm");
        let mut child = vmm::process::command(bin.as_ref())
            .spawn()
            .expect("spawn vm-vmm");
        let mut control = child.stdin.take().expect("piped stdin");
        vmm::process::write_config(&mut control, cfg).expect("send the configuration");
        let console = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(child.stdout.take().expect("piped stdout"), console.clone()),
            collect(child.stderr.take().expect("piped stderr"), console.clone()),
        ];
        VmProc {
            child,
            control: Some(control),
            console,
            exit: None,
            readers,
            _jail_dir: None,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The console so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&self.console.locked()).into_owned()
    }

    /// Everything the process wrote, once it has exited: waits for the readers to reach end
    /// of file (the last lines may trail the exit status).
    pub fn final_output(&mut self) -> String {
        assert!(
            self.try_exit().is_some(),
            "final_output of a running process"
        );
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        self.console()
    }

    /// Asks the VMM to stop the VM.
    pub fn stop(&mut self) {
        if let Some(c) = self.control.as_mut() {
            let _ = vmm::process::send_stop(c);
        }
    }

    /// How the process ended, once it has (reaps it).
    pub fn try_exit(&mut self) -> Option<ProcessExit> {
        if self.exit.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exit = Some(ProcessExit::from_status(status));
        }
        self.exit
    }

    /// Waits up to `timeout` for the process to end.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ProcessExit> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_exit() {
                return Some(e);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until the console holds every string of `what` (false on timeout or exit).
    pub fn wait_console(&mut self, timeout: Duration, what: &[&str]) -> bool {
        let end = Instant::now() + timeout;
        loop {
            let c = self.console();
            if what.iter().all(|w| c.contains(w)) {
                return true;
            }
            if Instant::now() >= end || self.try_exit().is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The VM's processes: `vm-vmm` and (when jailed) its child, PID 1 of the VM's namespace.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.pid()];
        let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid()));
        pids.extend(
            kids.unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
        pids
    }

    /// The names of the threads of every VM process (empty once they are gone).
    pub fn thread_names(&self) -> Vec<String> {
        self.pids()
            .into_iter()
            .filter_map(|pid| std::fs::read_dir(format!("/proc/{pid}/task")).ok())
            .flat_map(|dir| dir.flatten())
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|c| c.trim().to_string())
            .collect()
    }
}

impl Drop for VmProc {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
