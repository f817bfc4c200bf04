//! What a VM's host processes cost, read from `/proc`: CPU time and resident memory of a
//! process and everything under it (a jailed VMM runs below its launcher's reaper, so the pid
//! a driver reports may be the parent of the process doing the work).

use std::collections::BTreeSet;
use std::time::Duration;

/// The unit of `/proc/<pid>/stat`'s times: Linux reports them in USER_HZ, 100 on x86-64
/// whatever the kernel's tick rate.
const USER_HZ: u64 = 100;

/// `(ppid, comm, utime + stime in clock ticks)` from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(u32, String, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`: comm may hold spaces or parentheses.
    let (open, close) = (text.find('(')?, text.rfind(')')?);
    let comm = text[open + 1..close].to_string();
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // After the comm: state(0) ppid(1) ... utime(11) stime(12).
    let ppid = rest.get(1)?.parse().ok()?;
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((ppid, comm, utime + stime))
}

/// Every live process in the trees rooted at `roots` (the roots included).
pub fn tree(roots: &[u32]) -> BTreeSet<u32> {
    let mut all: Vec<(u32, u32)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((ppid, _, _)) = stat(pid) {
                all.push((pid, ppid));
            }
        }
    }
    let mut found: BTreeSet<u32> = roots
        .iter()
        .copied()
        .filter(|p| stat(*p).is_some())
        .collect();
    loop {
        let before = found.len();
        for (pid, ppid) in &all {
            if found.contains(ppid) {
                found.insert(*pid);
            }
        }
        if found.len() == before {
            return found;
        }
    }
}

/// The first process in the trees under `roots` whose command name is `comm`.
pub fn find(roots: &[u32], comm: &str) -> Option<u32> {
    tree(roots)
        .into_iter()
        .find(|p| stat(*p).is_some_and(|(_, c, _)| c == comm))
}

/// CPU time (user + system) used so far by the processes in `pids`.
pub fn cpu_time(pids: &BTreeSet<u32>) -> Duration {
    let ticks: u64 = pids.iter().filter_map(|p| stat(*p)).map(|s| s.2).sum();
    Duration::from_millis(ticks * 1000 / USER_HZ)
}

/// CPU time of each process in `pids` so far, by pid, with its command name.
pub fn cpu_by_process(pids: &BTreeSet<u32>) -> Vec<(u32, String, Duration)> {
    pids.iter()
        .filter_map(|p| {
            stat(*p).map(|(_, comm, t)| (*p, comm, Duration::from_millis(t * 1000 / USER_HZ)))
        })
        .collect()
}

/// Resident memory of one process in KiB (`VmRSS`), if it is alive.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resident memory of `pid` in KiB, counting only its mappings smaller than `below_kib`
/// (`/proc/<pid>/smaps`): with `below_kib` half the guest's RAM this leaves out guest RAM,
/// which a VMM or a vhost-user backend maps whole and which the guest, not the device, fills.
pub fn rss_outside_kib(pid: u32, below_kib: u64) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let field = |line: &str, name: &str| -> Option<u64> {
        let rest = line.strip_prefix(name)?;
        rest.split_whitespace().next()?.parse().ok()
    };
    let (mut total, mut size) = (0u64, 0u64);
    for line in text.lines() {
        if let Some(s) = field(line, "Size:") {
            size = s;
        } else if let Some(r) = field(line, "Rss:")
            && size < below_kib
        {
            total += r;
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_in_its_own_tree_and_costs_cpu() {
        let me = std::process::id();
        let t = tree(&[me]);
        assert!(t.contains(&me));
        let mut x = 0u64;
        let t0 = cpu_time(&t);
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(cpu_time(&t) > t0, "300 ms of spinning cost no CPU time");
        assert!(rss_kib(me).is_some_and(|k| k > 0));
    }

    #[test]
    fn a_child_is_found_by_name_and_a_dead_root_has_no_tree() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id();
        assert_eq!(find(&[me], "sleep"), Some(child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(tree(&[child.id()]).is_empty());
    }
}
