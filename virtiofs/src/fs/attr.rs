//! A host `stat` as the guest sees it: the host's size, mode bits, owner and times, as
//! `docker run -v …:ro` shows them.

use nix::sys::stat::FileStat;

use crate::abi::Attr;

/// `blksize` reported for the made-up root of a single-file share.
const BLOCK: u32 = 4096;

fn time(secs: i64) -> u64 {
    // Times before 1970 are shown as 1970 (FUSE carries unsigned seconds).
    u64::try_from(secs).unwrap_or(0)
}

fn nsec(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(0).min(999_999_999)
}

/// The kernel's 32-bit device encoding (`new_encode_dev`) of a host `dev_t`.
fn encode_dev(dev: u64) -> u32 {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// The attributes of a host inode.
pub fn from_stat(st: &FileStat) -> Attr {
    Attr {
        ino: st.st_ino,
        size: u64::try_from(st.st_size).unwrap_or(0),
        blocks: u64::try_from(st.st_blocks).unwrap_or(0),
        atime: time(st.st_atime),
        mtime: time(st.st_mtime),
        ctime: time(st.st_ctime),
        atimensec: nsec(st.st_atime_nsec),
        mtimensec: nsec(st.st_mtime_nsec),
        ctimensec: nsec(st.st_ctime_nsec),
        mode: st.st_mode,
        nlink: u32::try_from(st.st_nlink).unwrap_or(u32::MAX),
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: encode_dev(st.st_rdev),
        blksize: u32::try_from(st.st_blksize).unwrap_or(BLOCK),
    }
}

/// The made-up directory that holds a single-file share's file (`st` is the file's).
pub fn single_file_root(st: &FileStat) -> Attr {
    Attr {
        ino: 1,
        size: u64::from(BLOCK),
        blocks: 8,
        mode: libc::S_IFDIR | 0o555,
        nlink: 2,
        rdev: 0,
        blksize: BLOCK,
        ..from_stat(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_use_the_kernel_encoding() {
        assert_eq!(encode_dev(libc::makedev(8, 1)), 0x801);
        assert_eq!(
            encode_dev(libc::makedev(259, 300)),
            (300 & 0xff) | (259 << 8) | (256 << 12)
        );
    }
}
