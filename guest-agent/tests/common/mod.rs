//! Test fixture: the real `vm-agent` binary serving a Unix socket inside a temp root.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use vm_agent_client::AgentClient;
use vm_agent_protocol::AgentToken;

pub struct TestAgent {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub sock: PathBuf,
    /// The token the agent was started with (`--token-file`); [`TestAgent::client`] presents it.
    pub token: AgentToken,
    child: Child,
}

pub struct Opts<'a> {
    pub extra_args: &'a [&'a str],
    pub env: &'a [(&'a str, &'a str)],
}

impl TestAgent {
    pub fn start() -> TestAgent {
        Self::start_with(Opts {
            extra_args: &[],
            env: &[],
        })
    }

    pub fn start_with(o: Opts<'_>) -> TestAgent {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("mkdir root");
        let sock = dir.path().join("agent.sock");
        let token = AgentToken::generate().expect("token");
        let token_file = dir.path().join("agent.token");
        token.write_file(&token_file).expect("token file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vm-agent"));
        cmd.arg("--unix")
            .arg(&sock)
            .arg("--root")
            .arg(&root)
            .arg("--token-file")
            .arg(&token_file)
            .args(o.extra_args);
        for (k, v) in o.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn vm-agent");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("ready line");
        assert!(
            line.starts_with("vm-agent: ready unix="),
            "unexpected first line {line:?}"
        );
        TestAgent {
            dir,
            root,
            sock,
            token,
            child,
        }
    }

    pub fn client(&self) -> AgentClient {
        AgentClient::unix(&self.sock).with_token(self.token.clone())
    }

    /// The `Hello` this agent accepts.
    pub fn hello(&self) -> vm_agent_protocol::protocol::ClientFrame {
        vm_agent_protocol::protocol::ClientFrame::Hello {
            version: vm_agent_protocol::PROTOCOL_VERSION,
            token: *self.token.bytes(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The agent process is still alive.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        let end = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < end {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kill(pid, 0) fails with ESRCH: the process is gone (and reaped).
pub fn pid_gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid, 0) };
    r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Poll `pid_gone` for up to `ms` milliseconds.
pub async fn wait_gone(pid: i32, ms: u64) -> bool {
    for _ in 0..ms / 20 {
        if pid_gone(pid) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    pid_gone(pid)
}

#[allow(unused_imports)] // not every test binary that includes this module skips
pub use vm_test_support::skip;

/// Raises this test process's soft descriptor limit to its hard one: a test that fills the
/// agent's 640 forward slots holds two descriptors for each here.
pub fn raise_nofile() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed by pointer, which outlives the call.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) };
    if got == 0 && l.rlim_cur < l.rlim_max {
        l.rlim_cur = l.rlim_max;
        // SAFETY: setrlimit only reads the struct passed by pointer, which outlives the call.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) };
    }
}
