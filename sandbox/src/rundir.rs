//! Run directories that outlive a killed owner only until the next sweep.
//!
//! Every [`crate::MicroVm`] run directory (`vm-XXXXXX`, holding the VM's sockets, its agent token
//! and its boot initrd) gets an [`OWNER_FILE`] naming the process that created it: pid *and*
//! start time (field 22 of `/proc/<pid>/stat`), so a recycled pid never passes for the owner.
//! Normal teardown removes the directory; a `SIGKILL`ed owner cannot, so [`sweep`] removes every
//! run directory under a parent whose owner is gone. The VM's own processes die with their
//! owner (`PR_SET_PDEATHSIG`, see vm-drivers), so only files are left to sweep.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The owner record inside a run directory: `<pid> <start ticks>\n`.
pub const OWNER_FILE: &str = "owner";

/// Prefix of run directory names; [`sweep`] considers nothing else.
pub const RUN_DIR_PREFIX: &str = "vm-";

/// A process identity that a recycled pid cannot fake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcIdentity {
    /// Process id.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot).
    pub start_ticks: u64,
}

/// (state char, start ticks) of `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces or ')': split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // After ')' the fields start at #3 (state); starttime is #22 → index 19 after state.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

impl ProcIdentity {
    /// The identity of a live process, if it exists.
    pub fn of(pid: u32) -> Option<ProcIdentity> {
        proc_stat(pid).map(|(_, start_ticks)| ProcIdentity { pid, start_ticks })
    }

    /// This process.
    pub fn current() -> Option<ProcIdentity> {
        ProcIdentity::of(std::process::id())
    }

    /// True while that same process exists and is not a zombie.
    pub fn alive(&self) -> bool {
        matches!(proc_stat(self.pid), Some((s, t)) if t == self.start_ticks && s != 'Z' && s != 'X')
    }

    /// Waits (polling, at most `timeout`) for the process to be gone; true once it is. A
    /// `SIGKILL`ed process closes its files before it becomes a zombie, so whoever saw its
    /// sockets close can still find it [`alive`](Self::alive) for a moment.
    pub fn wait_gone(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while self.alive() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        true
    }

    fn parse(text: &str) -> Option<ProcIdentity> {
        let mut it = text.split_whitespace();
        let pid = it.next()?.parse().ok()?;
        let start_ticks = it.next()?.parse().ok()?;
        it.next()
            .is_none()
            .then_some(ProcIdentity { pid, start_ticks })
    }
}

/// Record this process as the owner of run directory `dir`.
pub fn claim(dir: &Path) -> io::Result<()> {
    let me = ProcIdentity::current()
        .ok_or_else(|| io::Error::other("cannot read this process's /proc/self/stat"))?;
    fs::write(
        dir.join(OWNER_FILE),
        format!("{} {}\n", me.pid, me.start_ticks),
    )
}

/// Remove every run directory directly under `parent` whose owner is gone; returns what was
/// removed. A directory without a readable owner file is left alone (it may be being created,
/// or not ours), and so is one whose owner is alive.
pub fn sweep(parent: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || !name.to_string_lossy().starts_with(RUN_DIR_PREFIX) {
            continue;
        }
        let dir = e.path();
        let owner = fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|t| ProcIdentity::parse(&t));
        match owner {
            Some(o) if !o.alive() => match fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), pid = o.pid, "removed the run dir of a dead vm");
                    removed.push(dir);
                }
                Err(err) => {
                    tracing::warn!(dir = %dir.display(), error = %err, "cannot remove a dead vm's run dir")
                }
            },
            _ => {}
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_gone_sees_a_process_end_and_bounds_a_live_one() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.3")
            .spawn()
            .unwrap();
        let id = ProcIdentity::of(child.id()).unwrap();
        let reaper = std::thread::spawn(move || child.wait());
        assert!(id.wait_gone(std::time::Duration::from_secs(10)));
        reaper.join().unwrap().unwrap();
        let me = ProcIdentity::current().unwrap();
        let t = std::time::Instant::now();
        assert!(!me.wait_gone(std::time::Duration::from_millis(100)));
        assert!(t.elapsed() >= std::time::Duration::from_millis(100));
    }

    #[test]
    fn sweep_removes_only_dirs_of_dead_owners() {
        let parent = tempfile::tempdir().unwrap();
        let mk = |name: &str, owner: Option<String>| {
            let d = parent.path().join(name);
            fs::create_dir(&d).unwrap();
            fs::write(d.join("vsock.sock"), b"").unwrap();
            if let Some(o) = owner {
                fs::write(d.join(OWNER_FILE), o).unwrap();
            }
            d
        };
        // A child that has exited and been reaped: its identity is dead.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = ProcIdentity::of(child.id()).unwrap();
        child.wait().unwrap();
        assert!(!dead.alive());
        let me = ProcIdentity::current().unwrap();
        assert!(me.alive());
        let gone = mk(
            "vm-dead",
            Some(format!("{} {}\n", dead.pid, dead.start_ticks)),
        );
        // Our pid with another start time: a recycled pid is not the owner.
        let recycled = mk(
            "vm-recycled",
            Some(format!("{} {}\n", me.pid, me.start_ticks + 1)),
        );
        let live = parent.path().join("vm-live");
        fs::create_dir(&live).unwrap();
        claim(&live).unwrap();
        let unowned = mk("vm-unowned", None);
        let garbled = mk("vm-garbled", Some("12 x\n".into()));
        let foreign = mk(
            "other-dir",
            Some(format!("{} {}\n", dead.pid, dead.start_ticks)),
        );
        let mut removed = sweep(parent.path());
        removed.sort();
        assert_eq!(removed, vec![gone.clone(), recycled.clone()]);
        assert!(!gone.exists() && !recycled.exists());
        for kept in [&live, &unowned, &garbled, &foreign] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
    }
}
