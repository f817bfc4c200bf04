//! A read-only bind is not recursive: a writable `tmpfs` the host has mounted beneath its
//! source stays writable in the container, as with runc (critest's "non-recursive readonly
//! mounts"). The bind becomes a read-only disk of the source's files; each such host tmpfs
//! becomes a guest tmpfs at the same place beneath it, as an `emptyDir` does (its contents
//! stay the guest's: the host's tmpfs is never written). Read from the host's
//! `/proc/self/mountinfo` (the kernel's, bounded).

use std::io::Read;
use std::path::Path;

use vm_spec::Mount;

use super::kubelet::{GuestTmpfs, TMPFS_BYTES};

/// Most host tmpfs mounts beneath the read-only binds of one container turned into guest
/// tmpfs; more are left read-only (the disk's copy).
pub const MAX_SUBMOUNTS: usize = 16;
/// Most of `/proc/self/mountinfo` read.
const MAX_MOUNTINFO: u64 = 4 << 20;

/// The guest tmpfs for the writable host tmpfs beneath `disks`' sources, from this
/// process's mount table (none when it cannot be read).
pub fn writable_beneath(disks: &[Mount]) -> Vec<GuestTmpfs> {
    let mut info = String::new();
    let read = std::fs::File::open("/proc/self/mountinfo")
        .and_then(|f| f.take(MAX_MOUNTINFO).read_to_string(&mut info));
    if let Err(e) = read {
        tracing::warn!(error = %e, "reading /proc/self/mountinfo");
        return Vec::new();
    }
    tmpfs_beneath(disks, &info)
}

/// [`writable_beneath`] from the text of a `mountinfo`.
pub fn tmpfs_beneath(disks: &[Mount], mountinfo: &str) -> Vec<GuestTmpfs> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((mine, theirs)) = line.split_once(" - ") else {
            continue;
        };
        let f: Vec<&str> = mine.split(' ').collect();
        let (Some(point), Some(opts)) = (f.get(4), f.get(5)) else {
            continue;
        };
        if theirs.split(' ').next() != Some("tmpfs") || !opts.split(',').any(|o| o == "rw") {
            continue;
        }
        let point = unescape(point);
        for d in disks {
            let Ok(rel) = Path::new(&point).strip_prefix(&d.host_path) else {
                continue;
            };
            let rel = rel.to_string_lossy();
            if rel.is_empty() || out.len() >= MAX_SUBMOUNTS {
                continue;
            }
            out.push(GuestTmpfs {
                dest: format!("{}/{rel}", d.guest_path.trim_end_matches('/')),
                size_bytes: TMPFS_BYTES,
                shared_as: None,
            });
        }
    }
    out
}

/// A `mountinfo` path with its octal escapes (`\040` for a space, …) decoded.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / / rw,relatime - ext4 /dev/vda rw
30 22 0:30 / /tmp/test\\040pod rw,relatime - ext4 /dev/vdb rw
31 30 0:31 / /tmp/test\\040pod/tmpfs rw,relatime - tmpfs none rw
32 30 0:32 / /tmp/test\\040pod/ro-tmpfs ro,relatime - tmpfs none rw
33 30 0:33 / /tmp/test\\040pod/disk rw,relatime - ext4 /dev/vdc rw
34 22 0:34 / /tmp/test\\040podx/tmpfs rw,relatime - tmpfs none rw
35 22 0:35 / /tmp/other rw,relatime - tmpfs none rw
";

    #[test]
    fn a_writable_host_tmpfs_beneath_a_read_only_bind_is_a_guest_tmpfs() {
        let disks = [Mount {
            host_path: "/tmp/test pod".into(),
            guest_path: "/mnt/".into(),
            read_only: true,
            via: Default::default(),
        }];
        let got = tmpfs_beneath(&disks, INFO);
        // Only the writable tmpfs strictly beneath the source: not a read-only one, not
        // another file system, not a sibling whose name shares the prefix, not the source.
        assert_eq!(
            got,
            [GuestTmpfs {
                dest: "/mnt/tmpfs".into(),
                size_bytes: TMPFS_BYTES,
                shared_as: None,
            }]
        );
    }

    #[test]
    fn a_mount_table_of_many_tmpfs_gives_at_most_the_bound() {
        let disks = [Mount {
            host_path: "/v".into(),
            guest_path: "/mnt".into(),
            read_only: true,
            via: Default::default(),
        }];
        let info: String = (0..100)
            .map(|i| format!("{i} 1 0:{i} / /v/t{i} rw - tmpfs none rw\n"))
            .collect();
        assert_eq!(tmpfs_beneath(&disks, &info).len(), MAX_SUBMOUNTS);
        assert_eq!(unescape("a\\134b\\0"), "a\\b\\0");
    }
}
