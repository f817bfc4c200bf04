//! Process control on the host side: signals, process groups and sessions, their CPU and
//! memory, the descriptor limit, and the exit status of a child not yet reaped; every
//! `unsafe` block of that work is here, each behind a function whose doc states its contract.
//! The drivers, the API, the CLI and the shim all call it here.
//!
//! Pids are `u32` as `std::process` gives them. A pid of 0 or one above `i32::MAX` is
//! refused with `EINVAL` before any call: `kill(0, …)` and `kill(-1, …)` would signal our
//! own process group or every process we may signal, never what a caller means.

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;
use std::process::ExitStatus;

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (as the Go runtime does at
/// start) and returns the soft limit in force: a process that forwards hundreds of
/// connections holds two descriptors for each, past the usual soft default of 1024.
pub fn raise_nofile() -> io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
        return Ok(hard);
    }
    Ok(soft)
}

/// The signals the host side sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `SIGINT`: what Ctrl-C sends.
    Interrupt,
    /// `SIGTERM`: a polite stop.
    Terminate,
    /// `SIGKILL`.
    Kill,
    /// `SIGSTOP`: freezes every thread (pausing a VM).
    Stop,
    /// `SIGCONT`: lets stopped threads run again.
    Continue,
    /// `SIGUSR1` (a `vm run -d` supervisor pauses its VM).
    User1,
    /// `SIGUSR2` (a `vm run -d` supervisor resumes its VM).
    User2,
}

impl Signal {
    fn number(self) -> libc::c_int {
        match self {
            Signal::Interrupt => libc::SIGINT,
            Signal::Terminate => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Stop => libc::SIGSTOP,
            Signal::Continue => libc::SIGCONT,
            Signal::User1 => libc::SIGUSR1,
            Signal::User2 => libc::SIGUSR2,
        }
    }
}

fn pid_t(pid: u32) -> io::Result<libc::pid_t> {
    match libc::pid_t::try_from(pid) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

fn kill(target: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill(2) takes two integers and touches no memory of ours; `target` is never
    // 0 or -1 (see `pid_t`), so it names one process or one process group.
    if unsafe { libc::kill(target, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends `sig` to the process `pid`. The caller makes sure `pid` still names the process it
/// means (its own unreaped child, or a pid checked with its start time just before).
pub fn signal(pid: u32, sig: Signal) -> io::Result<()> {
    kill(pid_t(pid)?, sig.number())
}

/// Sends `sig` to every process of the process group `pgid` (a group leader's pid), with
/// the same care about `pgid` as [`signal`].
pub fn signal_group(pgid: u32, sig: Signal) -> io::Result<()> {
    kill(-pid_t(pgid)?, sig.number())
}

/// True while any process of group `pgid` exists (zombies included) and we may signal it.
pub fn group_exists(pgid: u32) -> bool {
    pid_t(pgid).is_ok_and(|p| kill(-p, 0).is_ok())
}

/// True when a process `pid` exists (a zombie included) and we may signal it.
pub fn pid_exists(pid: u32) -> bool {
    pid_t(pid).is_ok_and(|p| kill(p, 0).is_ok())
}

/// Every process of the process groups `groups`, with its `/proc/PID/stat` line, reading
/// `/proc` once (a process that exits meanwhile is left out).
pub fn group_members(groups: &[u32]) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let pgrp = stat_field(&stat, 4)?.parse::<u32>().ok()?;
            groups.contains(&pgrp).then_some((pid, stat))
        })
        .collect()
}

/// Whether every thread of every process in group `pgid` is stopped (`T` in
/// `/proc/PID/task/TID/stat`), reading `/proc`; false when the group has no process.
pub fn group_stopped(pgid: u32) -> bool {
    let members = group_members(&[pgid]);
    !members.is_empty()
        && members.iter().all(|(pid, _)| {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return false;
            };
            tasks.flatten().all(|t| {
                let st = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                matches!(stat_field(&st, 2), Some("T" | "t"))
            })
        })
}

/// What the processes of some process groups use on the host, from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Processes.
    pub processes: u64,
    /// CPU time in user mode, nanoseconds (since each process started).
    pub user_ns: u64,
    /// CPU time in the kernel, nanoseconds.
    pub system_ns: u64,
    /// Resident memory, bytes.
    pub rss_bytes: u64,
}

/// The summed [`Usage`] of every process in the groups `groups`.
pub fn group_usage(groups: &[u32]) -> Usage {
    use nix::unistd::{SysconfVar, sysconf};
    let tick_ns = match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => 1_000_000_000 / hz as u64,
        _ => 10_000_000,
    };
    let page = match sysconf(SysconfVar::PAGE_SIZE) {
        Ok(Some(p)) if p > 0 => p as u64,
        _ => 4096,
    };
    let field = |stat: &str, n| {
        stat_field(stat, n)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    group_members(groups)
        .iter()
        .fold(Usage::default(), |u, (_, stat)| Usage {
            processes: u.processes + 1,
            user_ns: u.user_ns + field(stat, 13) * tick_ns,
            system_ns: u.system_ns + field(stat, 14) * tick_ns,
            rss_bytes: u.rss_bytes + field(stat, 23) * page,
        })
}

/// Field `n` (0-based; proc(5) numbers from 1: 2 is the state, 4 the process group, 13/14
/// utime/stime, 23 rss) of a `/proc/…/stat` line; the command name (field 1) may hold
/// spaces and parentheses.
fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(n.checked_sub(2)?)
}

/// The process group of `pid`.
pub fn process_group(pid: u32) -> io::Result<u32> {
    let p = pid_t(pid)?;
    // SAFETY: getpgid(2) takes an integer and touches no memory of ours.
    let pgid = unsafe { libc::getpgid(p) };
    if pgid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pgid as u32)
}

/// The real user id of this process.
pub fn uid() -> u32 {
    // SAFETY: getuid(2) has no arguments and cannot fail.
    unsafe { libc::getuid() }
}

/// Makes the child `cmd` spawns lead a new session (and process group), detached from our
/// terminal: `setsid(2)` between fork and exec.
pub fn new_session(cmd: &mut Command) {
    let hook = || {
        // SAFETY: setsid(2) has no arguments and touches no memory of ours.
        if unsafe { libc::setsid() } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and only calls setsid(2),
    // which is async-signal-safe, and reads errno; it allocates nothing.
    unsafe { cmd.pre_exec(hook) };
}

/// Makes the child `cmd` spawns get `SIGKILL` when the thread that forked it exits
/// (`PR_SET_PDEATHSIG`); the child refuses to start (`ESRCH`) when this process, `parent`,
/// is already gone by then.
pub fn kill_with_parent(cmd: &mut Command, parent: u32) {
    let hook = move || {
        // SAFETY: prctl(2) with PR_SET_PDEATHSIG takes a signal number and unused zeros.
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // The parent may have died between fork and prctl: then nobody would kill us.
        // SAFETY: getppid(2) has no arguments and cannot fail.
        if unsafe { libc::getppid() } as u32 != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and only calls the
    // async-signal-safe functions prctl(2) and getppid(2); it allocates nothing.
    unsafe { cmd.pre_exec(hook) };
}

/// How our child `pid` ended, if it has, without reaping it (`waitid` with `WNOWAIT`: it
/// only looks): `Ok(None)` while it runs; an error when `pid` is not an unreaped child.
pub fn exited_unreaped(pid: u32) -> io::Result<Option<ExitStatus>> {
    let p = pid_t(pid)?;
    // SAFETY: siginfo_t is plain data; an all-zero value is valid and waitid fills it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid(2) on a pid with WNOWAIT only inspects it; `info` is a valid, owned
    // siginfo_t for the call to fill.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            p as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after a successful waitid, si_pid is initialised (0 when nothing changed).
    if unsafe { info.si_pid() } == 0 {
        return Ok(None);
    }
    // SAFETY: the child changed state, so si_status is initialised.
    let value = unsafe { info.si_status() };
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => ExitStatus::from_raw((value & 0xff) << 8),
        libc::CLD_DUMPED => ExitStatus::from_raw((value & 0x7f) | 0x80),
        _ => ExitStatus::from_raw(value & 0x7f),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_that_mean_more_than_one_process_are_refused() {
        for pid in [0, u32::MAX, i32::MAX as u32 + 1] {
            let e = signal(pid, Signal::Kill).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{pid}");
            assert!(signal_group(pid, Signal::Kill).is_err(), "{pid}");
            assert!(!pid_exists(pid));
        }
        assert!(pid_exists(std::process::id()));
    }

    #[test]
    fn signals_reach_a_child_and_its_group() {
        let mut cmd = Command::new("sleep");
        cmd.arg("300");
        new_session(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        let pid = child.id();
        assert_eq!(process_group(pid).unwrap(), pid);
        assert_ne!(process_group(std::process::id()).unwrap(), pid);
        assert!(exited_unreaped(pid).unwrap().is_none());
        signal_group(pid, Signal::Terminate).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while exited_unreaped(pid).unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(exited_unreaped(pid).unwrap().is_some());
        assert!(pid_exists(pid), "an unreaped child still exists");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
        assert!(!pid_exists(pid));
        assert!(exited_unreaped(pid).is_err(), "reaped: no longer our child");
    }

    #[test]
    fn a_stopped_group_reads_as_stopped_until_continued() {
        let mut cmd = Command::new("sleep");
        cmd.arg("300");
        new_session(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        let pid = child.id();
        // Right after the spawn the child may still be exec'ing (no memory mapped yet).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut u = group_usage(&[pid]);
        while u.rss_bytes == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            u = group_usage(&[pid]);
        }
        assert_eq!(u.processes, 1, "{u:?}");
        assert!(u.rss_bytes > 0, "{u:?}");
        let wait = |want: bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while group_stopped(pid) != want && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            group_stopped(pid) == want
        };
        assert!(!group_stopped(pid));
        signal_group(pid, Signal::Stop).unwrap();
        assert!(wait(true), "stopped");
        signal_group(pid, Signal::Continue).unwrap();
        assert!(wait(false), "running again");
        assert!(
            exited_unreaped(pid).unwrap().is_none(),
            "a stop does not end it"
        );
        signal_group(pid, Signal::Kill).unwrap();
        child.wait().unwrap();
        assert!(!group_stopped(pid), "no process: not stopped");
        assert_eq!(
            group_usage(&[pid]),
            Usage::default(),
            "no process: no usage"
        );
        assert_eq!(stat_field("1 (a) b) c) S 0 7", 4), Some("7"));
        assert_eq!(stat_field("1 (a) b) c) S 0 7", 2), Some("S"));
    }
}
