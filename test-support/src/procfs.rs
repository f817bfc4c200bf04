//! What a test reads about a host process through `/proc`: status fields, children, threads,
//! namespaces and the entries of its root. Used by the jail tests of both drivers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The value of `key` in a `/proc/.../status` file (trimmed; empty when absent).
pub fn status_field(status: &Path, key: &str) -> String {
    let s = std::fs::read_to_string(status).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// `VmRSS` of a `/proc/.../status` file, in KiB (0 when absent).
pub fn rss_kib(status: &Path) -> u64 {
    status_field(status, "VmRSS")
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The children of `pid` (of its main thread).
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The `status` files of every thread of `pid`.
pub fn thread_status_files(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.flatten().map(|t| t.path().join("status")).collect())
        .unwrap_or_default()
}

/// The state letter of every thread of `pid` (`R`, `S`, `T` for stopped, …), from
/// `/proc/PID/task/*/stat`; empty when the process is gone.
pub fn thread_states(pid: u32) -> Vec<char> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
                .filter_map(|st| st.rsplit_once(") ").and_then(|(_, r)| r.chars().next()))
                .collect()
        })
        .unwrap_or_default()
}

/// The namespace `kind` (`mnt`, `pid`, …) of `pid`, as `kind:[inode]`; `self` for this process.
/// Panics when it cannot be read (a process that is gone must not compare as "different").
pub fn namespace(pid: &str, kind: &str) -> String {
    match std::fs::read_link(format!("/proc/{pid}/ns/{kind}")) {
        Ok(p) => p.display().to_string(),
        Err(e) => panic!("/proc/{pid}/ns/{kind}: {e}"),
    }
}

/// The names directly under `/proc/PID/root/<sub>`.
pub fn root_entries(pid: u32, sub: &str) -> BTreeSet<String> {
    let dir = PathBuf::from(format!("/proc/{pid}/root")).join(sub.trim_start_matches('/'));
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
