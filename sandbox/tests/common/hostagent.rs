//! A test driver that "boots" by starting the real `vm-agent` on the host over a Unix
//! socket (`vm-agent --unix SOCK --root /`), so the MicroVm API can be exercised against
//! the real agent protocol without a guest. It is a test double: it claims MicroVm
//! containment only so the gate admits it.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vm_agent_client::AgentClient;
use vm_drivers::{
    Availability, BootPlan, Containment, Driver, DriverError, Machine, MachineInfo, VmHandle,
};
use vm_sync::Lock;

/// The vm-agent binary: `$VM_AGENT_BIN`, else next to this test's `deps` directory.
pub fn agent_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VM_AGENT_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("vm-agent");
    p.is_file().then_some(p)
}

pub struct HostAgentDriver {
    pub bin: PathBuf,
    /// What the booted machine reports (a lying driver reports less than it claims).
    pub machine_containment: Containment,
}

impl Driver for HostAgentDriver {
    fn name(&self) -> &'static str {
        "host-agent"
    }
    fn containment(&self) -> Containment {
        Containment::MicroVm
    }
    fn detect(&self) -> Availability {
        Availability {
            ok: true,
            detail: "test double".into(),
        }
    }
    fn boot(&self, plan: BootPlan) -> Result<Machine, DriverError> {
        let sock = plan.run_dir.join("agent.sock");
        let mut child = Command::new(&self.bin)
            .args([
                "--unix".as_ref(),
                sock.as_os_str(),
                "--root".as_ref(),
                "/".as_ref(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| DriverError::Spawn {
                program: "vm-agent".into(),
                source,
            })?;
        // Wait for the ready line.
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        if !line.contains("ready") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(DriverError::InvalidPlan {
                reason: format!("agent said {line:?}"),
            });
        }
        let info = MachineInfo {
            name: plan.name.clone(),
            driver: "host-agent",
            containment: self.machine_containment,
            wall: plan.wall,
            agent_socket: sock.clone(),
        };
        let handle = ChildHandle {
            child: Mutex::new(child),
            sock: sock.clone(),
        };
        Machine::new(info, Box::new(handle), AgentClient::unix(sock))
    }
}

struct ChildHandle {
    child: Mutex<Child>,
    sock: PathBuf,
}

impl VmHandle for ChildHandle {
    fn is_running(&self) -> bool {
        matches!(self.child.locked().try_wait(), Ok(None))
    }
    fn kill(&self) {
        let mut c = self.child.locked();
        let _ = c.kill();
        let _ = c.wait();
        let _ = std::fs::remove_file(&self.sock);
    }
    fn wait(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if !self.is_running() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        !self.is_running()
    }
    fn console_tail(&self) -> String {
        String::new()
    }
    fn host_pids(&self) -> Vec<u32> {
        vec![self.child.locked().id()]
    }
}
