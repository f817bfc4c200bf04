//! Boot steps shared by the real backends: checking a plan, the run directory, the agent's
//! configuration, and waiting for the agent to answer.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use guest_agent::AGENT_PORT;
use guest_agent::client::AgentClient;
use guest_agent::config::{AgentConfig, DiskMount};

use crate::machine::VmHandle;
use crate::{BootPlan, DriverError};

/// The guest's vsock context id.
pub(crate) const GUEST_CID: u64 = 3;

/// The hybrid-vsock socket the agent client connects to, inside the run dir.
pub(crate) const VSOCK_SOCKET: &str = "vsock.sock";

/// Longest Unix socket path (sun_path is 108 bytes including the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The virtio-blk serial (agent disk id) of disk `index`.
pub(crate) fn disk_id(index: usize) -> String {
    format!("disk{index}")
}

fn invalid(reason: String) -> DriverError {
    DriverError::InvalidPlan { reason }
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
        port: AGENT_PORT,
        ..AgentConfig::default()
    };
    cfg.to_cmdline()
        .map_err(|e| invalid(format!("agent configuration: {e}")))
}

/// The files a driver creates in the run dir; removed (and the dir, if we created it) on drop.
#[derive(Debug)]
pub(crate) struct RunDir {
    dir: PathBuf,
    created_dir: bool,
    files: Vec<PathBuf>,
}

impl RunDir {
    /// Creates `dir` if needed and claims `names` inside it. Refuses if any of them already
    /// exists (it may belong to another VM).
    pub(crate) fn prepare(dir: &Path, names: &[&str]) -> Result<RunDir, DriverError> {
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
                    () = stopped => Err(("the vm stopped before the agent answered".to_string(), None, None)),
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
    use super::*;
    use crate::test_support::dummy_plan;
    use crate::{DiskFs, DiskPlan};

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
        run.cleanup();
        assert!(!dir.exists(), "created run dir was not removed");
        // A pre-existing dir is kept.
        fs::create_dir(&dir).unwrap();
        drop(RunDir::prepare(&dir, &["a.sock"]).unwrap());
        assert!(dir.exists());
    }
}
