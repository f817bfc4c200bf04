//! Supervision of the host child processes a driver owns (QEMU, vm-vsock).
//!
//! Every child is started:
//! - in its own process group (`setpgid(0, 0)`), so teardown can signal the whole group;
//! - with `PR_SET_PDEATHSIG(SIGKILL)`, so it dies if this process dies without running `Drop`;
//! - from one long-lived *spawner thread* owned by this module.
//!
//! Thread caveat: Linux delivers the parent-death signal when the *thread* that forked the child
//! exits, not when the process exits. A child forked from a short-lived thread (for example a tokio
//! `spawn_blocking` worker, which exits after being idle) would be killed under the VM's feet. All
//! spawns are therefore funnelled through a single thread that is never joined and lives as long
//! as the process, so the signal fires exactly when the process goes away.
//!
//! Teardown ([`Supervised::kill_and_reap`]) sends `SIGKILL` to the process group and then reaps
//! the leader. Liveness checks use `waitid(WNOWAIT)`, which never reaps: the leader stays a zombie
//! until teardown, so its pid (which is the group id) cannot be reused before the group is killed.

use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use vm_sync::Lock;

use crate::ring::SharedRing;
use vm_sys::control::{self, Signal};

/// A request to the spawner thread: the command and where to send the result.
type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// The sender side of the process-wide spawner thread (started on first use, never stopped).
static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();

fn spawner() -> io::Result<mpsc::Sender<SpawnJob>> {
    if let Some(tx) = SPAWNER.get() {
        return Ok(tx.locked().clone());
    }
    let (tx, rx) = mpsc::channel::<SpawnJob>();
    // The thread only exits if every sender is dropped, which cannot happen: one lives in SPAWNER.
    thread::Builder::new()
        .name("vm-drivers-spawner".into())
        .spawn(move || {
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
        })?;
    // If another thread won the race, its spawner is used and ours idles harmlessly.
    let stored = SPAWNER.get_or_init(|| Mutex::new(tx));
    Ok(stored.locked().clone())
}

/// Arms `cmd` with its own process group and a parent-death `SIGKILL`.
pub(crate) fn arm(cmd: &mut Command) {
    let parent = std::process::id();
    cmd.process_group(0);
    control::kill_with_parent(cmd, parent);
}

/// Spawns `cmd` (armed with [`arm`]) from the long-lived spawner thread.
/// Stdout and stderr, when piped, are copied into one ring of `ring_bytes`.
pub(crate) fn spawn_supervised(
    program: &str,
    cmd: Command,
    ring_bytes: usize,
) -> io::Result<Supervised> {
    spawn_jailed(program, cmd, ring_bytes, None)
}

/// [`spawn_supervised`] inside `jail` (installed after [`arm`], so the reaper the jail forks
/// carries the parent-death signal too).
pub(crate) fn spawn_jailed(
    program: &str,
    mut cmd: Command,
    ring_bytes: usize,
    jail: Option<vm_jail::exec::ExecJail>,
) -> io::Result<Supervised> {
    arm(&mut cmd);
    if let Some(j) = jail {
        j.install(&mut cmd);
    }
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner()?
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    let mut child = reply_rx
        .recv()
        .map_err(|_| io::Error::other("spawner thread is gone"))??;
    let output = SharedRing::new(ring_bytes);
    if let Some(out) = child.stdout.take() {
        pump(format!("{program}-stdout"), out, output.clone());
    }
    if let Some(err) = child.stderr.take() {
        pump(format!("{program}-stderr"), err, output.clone());
    }
    let stdin = Mutex::new(child.stdin.take());
    Ok(Supervised {
        program: program.to_string(),
        pid: child.id(),
        stdin,
        state: Mutex::new(ChildState {
            child,
            status: None,
        }),
        output,
    })
}

/// How long the tail of an exited child waits for its output readers to reach EOF.
const OUTPUT_SETTLE: Duration = Duration::from_secs(1);
/// Lines of output [`Supervised::ended_detail`] quotes.
const ENDED_LINES: usize = 3;
/// Most bytes of guest-written text one error message quotes (a console line can be as long
/// as the whole ring).
pub(crate) const QUOTE_MAX: usize = 512;

/// `text` cut to at most [`QUOTE_MAX`] bytes, on a character boundary.
pub(crate) fn clip(text: &str) -> &str {
    let mut end = text.len().min(QUOTE_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Copies a child's pipe into a bounded ring until EOF (the child exiting closes it), as one
/// counted writer of the ring.
pub(crate) fn pump(name: String, mut src: impl Read + Send + 'static, ring: SharedRing) {
    let ring = ring.writer();
    let spawned = thread::Builder::new().name(name).spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match src.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => ring.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start an output reader thread; output is dropped");
    }
}

/// What a non-reaping look at the child found.
enum Peek {
    Running,
    Exited(ExitStatus),
    /// waitid failed (the child was reaped elsewhere): treated as not running.
    Unknown,
}

struct ChildState {
    child: Child,
    /// Set once the leader has been reaped; afterwards its pid may be reused, so no more signals.
    status: Option<ExitStatus>,
}

/// One supervised child process (the leader of its own process group).
pub(crate) struct Supervised {
    program: String,
    pid: u32,
    /// The child's stdin when it was piped (dropping it closes the pipe).
    stdin: Mutex<Option<ChildStdin>>,
    state: Mutex<ChildState>,
    output: SharedRing,
}

impl Supervised {
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The tail of the child's captured stdout and stderr. Once the child has exited, first
    /// waits (at most [`OUTPUT_SETTLE`]) for its output readers to reach EOF, so the last
    /// bytes it wrote — a guest's last console lines — are in the tail, not still in a pipe.
    pub(crate) fn output_tail(&self) -> String {
        if !self.is_running() {
            self.output.wait_writers_done(OUTPUT_SETTLE);
        }
        self.output.tail_string()
    }

    /// Once the child has exited: `PROGRAM ended (HOW); its last lines: "a | b | c"`, the last
    /// [`ENDED_LINES`] lines of its output (for a VM process, the guest's last console lines:
    /// an agent's fatal error is among them). `how` describes the exit status. The one wording
    /// every driver's [`VmHandle::stop_detail`](crate::machine::VmHandle::stop_detail) uses.
    pub(crate) fn ended_detail(
        &self,
        program: &str,
        how: impl FnOnce(ExitStatus) -> String,
    ) -> Option<String> {
        let status = self.exit_status()?;
        let out = self.output_tail();
        let mut last: Vec<&str> = out.trim_end().lines().rev().take(ENDED_LINES).collect();
        last.reverse();
        Some(format!(
            "{program} ended ({}); its last lines: {:?}",
            how(status),
            clip(&last.join(" | "))
        ))
    }

    /// Runs `f` on the child's stdin; `None` when it was not piped or has been closed.
    pub(crate) fn with_stdin<T>(&self, f: impl FnOnce(&mut ChildStdin) -> T) -> Option<T> {
        self.stdin.locked().as_mut().map(f)
    }

    /// True while the child has not exited. Never reaps (see the module docs).
    pub(crate) fn is_running(&self) -> bool {
        matches!(self.peek(), Peek::Running)
    }

    /// How the child ended, once it has; `None` while it runs or when that cannot be known.
    /// Never reaps (see the module docs).
    pub(crate) fn exit_status(&self) -> Option<ExitStatus> {
        match self.peek() {
            Peek::Exited(s) => Some(s),
            Peek::Running | Peek::Unknown => None,
        }
    }

    fn peek(&self) -> Peek {
        let st = self.state.locked();
        if let Some(status) = st.status {
            return Peek::Exited(status);
        }
        // Not running once it exited, and when it is not our unreaped child any more.
        match control::exited_unreaped(self.pid) {
            Ok(None) => Peek::Running,
            Ok(Some(status)) => Peek::Exited(status),
            Err(_) => Peek::Unknown,
        }
    }

    /// Waits up to `timeout` for the child to exit on its own; true if it did.
    pub(crate) fn wait_exit(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.is_running() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            thread::sleep((deadline - now).min(Duration::from_millis(20)));
        }
    }

    /// Kills the whole process group with SIGKILL and reaps the leader. Idempotent.
    pub(crate) fn kill_and_reap(&self) -> Option<ExitStatus> {
        self.stdin.locked().take();
        let mut st = self.state.locked();
        if let Some(status) = st.status {
            return Some(status);
        }
        // The leader is not reaped yet, so its pid (== pgid) still names our group.
        if let Err(e) = control::signal_group(self.pid, Signal::Kill)
            && e.raw_os_error() != Some(libc::ESRCH)
        {
            tracing::warn!(program = %self.program, error = %e, "killing the process group failed");
        }
        match st.child.wait() {
            Ok(status) => {
                st.status = Some(status);
                self.await_group_gone();
                Some(status)
            }
            Err(e) => {
                tracing::warn!(program = %self.program, error = %e, "reaping the child failed");
                None
            }
        }
    }
}

impl Supervised {
    /// After the leader is reaped, waits (bounded) until the rest of its group is gone too: a
    /// jailed program runs under a reaper (the leader), and the program itself, SIGKILLed with
    /// the group, may still be tearing down its memory when the reaper is reaped. Teardown
    /// returns only once no process of the VM is left. The leader's pid cannot be reused while
    /// its group has members, so the group id still names ours.
    fn await_group_gone(&self) {
        let deadline = Instant::now() + GROUP_EXIT_WAIT;
        while control::group_exists(self.pid) {
            if Instant::now() >= deadline {
                tracing::warn!(program = %self.program, "processes of the group outlived its leader");
                return;
            }
            thread::sleep(Duration::from_millis(2));
        }
    }
}

/// How long teardown waits for a killed group's last members to be gone.
const GROUP_EXIT_WAIT: Duration = Duration::from_secs(5);

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;

    fn alive(pid: u32) -> bool {
        control::pid_exists(pid)
    }

    fn sleeper() -> Command {
        let mut cmd = Command::new("sleep");
        cmd.arg("300")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    #[test]
    fn kill_and_reap_removes_the_child() {
        let child = spawn_supervised("sleep", sleeper(), 1024).expect("spawn sleep");
        let pid = child.pid();
        assert!(child.is_running());
        assert!(alive(pid));
        // is_running must not reap: the process still exists afterwards.
        assert!(child.is_running());
        let status = child.kill_and_reap().expect("reaped");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(!child.is_running());
        assert!(!alive(pid), "pid {pid} still exists after kill_and_reap");
        // Idempotent.
        assert!(child.kill_and_reap().is_some());
    }

    #[test]
    fn exit_status_is_seen_without_reaping() {
        for (script, code, signal) in [
            ("exit 3", Some(3), None),
            ("kill -SYS $$", None, Some(libc::SIGSYS)),
        ] {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", script]).stdin(Stdio::null());
            let child = spawn_supervised("sh", cmd, 1024).expect("spawn sh");
            assert!(child.wait_exit(Duration::from_secs(10)));
            let status = child.exit_status().expect("exited");
            assert_eq!((status.code(), status.signal()), (code, signal), "{script}");
            // Not reaped: the pid still names a zombie until teardown.
            assert!(std::fs::metadata(format!("/proc/{}", child.pid())).is_ok());
            assert_eq!(child.kill_and_reap(), Some(status));
        }
    }

    #[test]
    fn ended_detail_names_the_program_how_it_ended_and_its_last_lines() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "for l in one two three four; do echo $l; done; exit 3",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
        let child = spawn_supervised("sh", cmd, 1024).expect("spawn sh");
        assert!(child.wait_exit(Duration::from_secs(10)));
        let detail = child
            .ended_detail("a-program", |st| format!("code {:?}", st.code()))
            .expect("it ended");
        assert_eq!(
            detail,
            r#"a-program ended (code Some(3)); its last lines: "two | three | four""#
        );
        let running = spawn_supervised("sleep", sleeper(), 1024).expect("spawn sleep");
        assert_eq!(running.ended_detail("sleep", |_| String::new()), None);
        let long = "é".repeat(QUOTE_MAX);
        assert_eq!(clip(&long).len(), QUOTE_MAX);
        assert_eq!(clip("short"), "short");
    }

    #[test]
    fn stdin_is_the_childs_and_closes_on_teardown() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "read line; echo got $line"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let child = spawn_supervised("sh", cmd, 1024).expect("spawn sh");
        use std::io::Write;
        child
            .with_stdin(|w| w.write_all(b"hello\n"))
            .expect("piped")
            .unwrap();
        assert!(child.wait_exit(Duration::from_secs(10)));
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.output_tail() != "got hello\n" && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(child.output_tail(), "got hello\n");
        child.kill_and_reap();
        assert!(child.with_stdin(|_| ()).is_none());
    }

    #[test]
    fn drop_kills_the_child() {
        let child = spawn_supervised("sleep", sleeper(), 1024).expect("spawn sleep");
        let pid = child.pid();
        drop(child);
        assert!(!alive(pid));
    }

    #[test]
    fn child_is_leader_of_its_own_process_group() {
        let child = spawn_supervised("sleep", sleeper(), 1024).expect("spawn sleep");
        let pgid = control::process_group(child.pid()).unwrap();
        assert_eq!(pgid, child.pid());
        assert_ne!(control::process_group(std::process::id()).unwrap(), pgid);
    }

    /// The last bytes a child wrote before exiting are in the tail as soon as the exit is
    /// seen (a guest's last console lines: why its agent gave up). Without the wait for the
    /// reader's EOF, the bytes still in the pipe are missing when the exit is noticed at once.
    #[test]
    fn tail_right_after_exit_holds_the_last_bytes() {
        for round in 0..20 {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", "head -c 60000 /dev/zero | tr '\\0' a; echo END"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let child = spawn_supervised("sh", cmd, 4096).expect("spawn sh");
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.is_running() && Instant::now() < deadline {
                std::hint::spin_loop();
            }
            let tail = child.output_tail();
            assert!(
                tail.ends_with("END\n"),
                "round {round}: tail ends {:?}",
                &tail[tail.len().saturating_sub(20)..]
            );
        }
    }

    #[test]
    fn output_is_captured_bounded() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "head -c 100000 /dev/zero | tr '\\0' a; echo END"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = spawn_supervised("sh", cmd, 4096).expect("spawn sh");
        assert!(child.wait_exit(Duration::from_secs(10)));
        // Right after the exit, with no waiting of our own: the tail already holds the last
        // line (output_tail waits for the reader to drain the pipe).
        let tail = child.output_tail();
        assert!(
            tail.ends_with("END\n"),
            "tail: {:?}",
            &tail[tail.len().saturating_sub(20)..]
        );
        assert!(tail.len() <= 4096);
    }

    /// The caveat the spawner thread exists for: a child forked from a thread that then exits
    /// receives its parent-death signal even though the process lives on.
    #[test]
    fn pdeathsig_fires_when_the_forking_thread_exits() {
        let pid = thread::spawn(|| {
            let mut cmd = sleeper();
            arm(&mut cmd);
            let child = cmd.spawn().expect("spawn sleep");
            let pid = child.id();
            std::mem::forget(child);
            pid
        })
        .join()
        .expect("thread");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut reaped = false;
        while Instant::now() < deadline {
            let child = nix::unistd::Pid::from_raw(pid as libc::pid_t);
            match nix::sys::wait::waitpid(child, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
                Ok(nix::sys::wait::WaitStatus::Signaled(_, sig, _)) => {
                    assert_eq!(sig, nix::sys::signal::Signal::SIGKILL);
                    reaped = true;
                    break;
                }
                Ok(nix::sys::wait::WaitStatus::StillAlive) => {}
                other => panic!("waitpid: {other:?}"),
            }
            thread::sleep(Duration::from_millis(10));
        }
        assert!(
            reaped,
            "child of an exited thread was not killed by its parent-death signal"
        );
    }

    /// And the fix: spawning through the long-lived spawner thread from a short-lived thread
    /// keeps the child alive after that thread exits.
    #[test]
    fn spawner_thread_outlives_short_lived_callers() {
        let child =
            thread::spawn(|| spawn_supervised("sleep", sleeper(), 1024).expect("spawn sleep"))
                .join()
                .expect("thread");
        thread::sleep(Duration::from_millis(200));
        assert!(
            child.is_running(),
            "child died with the short-lived thread that requested it"
        );
        child.kill_and_reap();
        assert!(!alive(child.pid()));
    }

    /// Dead or a zombie (a killed orphan may wait briefly for its new parent to reap it).
    fn gone(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        }
    }

    /// The guarantee that matters: if this whole process dies without running any Drop
    /// (SIGKILL), its children die too. The test re-runs itself as a separate parent process
    /// (selected by an environment variable), which spawns a child, reports its pid and waits
    /// to be killed.
    #[test]
    fn children_die_with_the_process() {
        const ROLE: &str = "VM_DRIVERS_PDEATH_PARENT";
        if std::env::var_os(ROLE).is_some() {
            let child = spawn_supervised("sleep", sleeper(), 1024).expect("spawn sleep");
            println!("CHILD_PID {}", child.pid());
            std::mem::forget(child);
            thread::sleep(Duration::from_secs(60));
            return;
        }
        use std::io::BufRead;
        let exe = std::env::current_exe().expect("test binary path");
        let mut parent = Command::new(exe)
            .args([
                "--exact",
                "process::tests::children_die_with_the_process",
                "--nocapture",
            ])
            .env(ROLE, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("re-run the test binary");
        let stdout = parent.stdout.take().expect("piped stdout");
        let pid = io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| {
                l.strip_prefix("CHILD_PID ")
                    .and_then(|p| p.trim().parse::<u32>().ok())
            })
            .expect("the parent reported its child");
        assert!(!gone(pid), "child {pid} is not running");
        parent.kill().expect("kill the parent");
        parent.wait().expect("reap the parent");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(pid) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        assert!(
            gone(pid),
            "child {pid} outlived its SIGKILLed parent process"
        );
    }
}
