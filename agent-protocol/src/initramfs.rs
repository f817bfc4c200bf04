//! What the host and the guest agent agree on inside an initramfs (uncompressed newc cpio):
//! the entry format the host appends the token in ([`crate::token`]), and where a distribution
//! kernel's modules live ([`MODULE_DIR`], loaded by PID 1 in the order [`MODULE_ORDER`] gives).
//! [`has_entry`] reads an archive's entry names, bounded, without reading file data;
//! [`push_entry`] writes one entry.

use std::io::{Read, Seek, SeekFrom};

/// Where `images/build.sh --kernel debian` puts the kernel's driver modules in the initramfs.
pub const MODULE_DIR: &str = "/lib/modules/vm";
/// The file name of the load list in [`MODULE_DIR`].
pub const ORDER_FILE: &str = "order";
/// The list of [`MODULE_DIR`]'s modules in load order (one file name a line, dependencies
/// first). An initramfs with it carries a distribution kernel's drivers: that kernel finds
/// its virtio-mmio devices through ACPI only (the tuned kernel, built without modules, from its
/// command line).
pub const MODULE_ORDER: &str = "/lib/modules/vm/order";

/// The longest entry name [`has_entry`] reads (the kernel's own limit is `PATH_MAX`).
pub const MAX_NAME: usize = 4096;
/// The most entries [`has_entry`] reads before it gives up (the built-in image has ~450).
pub const MAX_ENTRIES: usize = 100_000;

/// Errors reading an archive.
#[derive(Debug, thiserror::Error)]
pub enum NewcError {
    #[error("reading the archive")]
    Io(#[from] std::io::Error),
    #[error("entry {0}: not a newc header")]
    BadHeader(usize),
    #[error("entry {0}: name over {MAX_NAME} bytes")]
    NameTooLong(usize),
    #[error("over {MAX_ENTRIES} entries")]
    TooManyEntries,
}

/// Whether the first archive in `r` (up to its `TRAILER!!!`) has an entry named `name` (an
/// absolute guest path; archive names have no leading `/`). Reads headers and names only.
pub fn has_entry<R: Read + Seek>(r: &mut R, name: &str) -> Result<bool, NewcError> {
    let want = name.trim_start_matches('/').as_bytes();
    for index in 0..MAX_ENTRIES {
        let mut header = [0u8; 110];
        // The end of the input between entries ends the archive; inside one it is an error.
        let mut got = 0;
        while got < header.len() {
            match r.read(&mut header[got..])? {
                0 if got == 0 => return Ok(false),
                0 => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
                n => got += n,
            }
        }
        if &header[..6] != b"070701" {
            return Err(NewcError::BadHeader(index));
        }
        let field = |i: usize| {
            let hex = std::str::from_utf8(&header[6 + 8 * i..14 + 8 * i]).ok();
            hex.and_then(|h| u32::from_str_radix(h, 16).ok())
        };
        let (Some(file_size), Some(name_size)) = (field(6), field(11)) else {
            return Err(NewcError::BadHeader(index));
        };
        let name_size = name_size as usize;
        if name_size == 0 {
            return Err(NewcError::BadHeader(index));
        }
        if name_size > MAX_NAME {
            return Err(NewcError::NameTooLong(index));
        }
        let mut entry_name = vec![0u8; name_size + pad(110 + name_size)];
        r.read_exact(&mut entry_name)?;
        let entry_name = &entry_name[..name_size - 1];
        if entry_name == b"TRAILER!!!" {
            return Ok(false);
        }
        if entry_name == want {
            return Ok(true);
        }
        let skip = u64::from(file_size) + pad(file_size as usize) as u64;
        r.seek(SeekFrom::Current(skip as i64))?;
    }
    Err(NewcError::TooManyEntries)
}

/// Bytes that pad `len` to a multiple of 4.
fn pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Appends one newc entry to `out`: the 110-byte ASCII header, the NUL-terminated name and the
/// data, each padded to 4 bytes.
pub fn push_entry(out: &mut Vec<u8>, name: &str, mode: u32, data: &[u8]) {
    let fields: [u32; 13] = [
        1,                       // ino
        mode,                    // mode
        0,                       // uid
        0,                       // gid
        1,                       // nlink
        0,                       // mtime
        data.len() as u32,       // filesize
        0,                       // devmajor
        0,                       // devminor
        0,                       // rdevmajor
        0,                       // rdevminor
        (name.len() + 1) as u32, // namesize (with the NUL)
        0,                       // check
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.resize(out.len() + pad(out.len()), 0);
    out.extend_from_slice(data);
    out.resize(out.len() + pad(out.len()), 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn archive(names: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for n in names {
            push_entry(&mut out, n, 0o100644, b"abcde");
        }
        push_entry(&mut out, "TRAILER!!!", 0, &[]);
        out
    }

    #[test]
    fn the_order_list_lives_in_the_module_dir() {
        assert_eq!(MODULE_ORDER, format!("{MODULE_DIR}/{ORDER_FILE}"));
    }

    #[test]
    fn finds_an_entry_by_guest_path_and_stops_at_the_trailer() {
        let mut a = archive(&["init", "lib/modules/vm/order"]);
        assert!(has_entry(&mut Cursor::new(&a), MODULE_ORDER).unwrap());
        assert!(!has_entry(&mut Cursor::new(&a), "/lib/modules/vm").unwrap());
        // A second archive after the trailer (the host's token) is not the image's.
        let mut b = archive(&["init"]);
        b.extend(archive(&["lib/modules/vm/order"]));
        assert!(!has_entry(&mut Cursor::new(&b), MODULE_ORDER).unwrap());
        a.truncate(50);
        assert!(has_entry(&mut Cursor::new(&a), MODULE_ORDER).is_err());
    }

    #[test]
    fn hostile_headers_are_refused_not_followed() {
        let mut a = archive(&["init"]);
        a[6 + 8 * 11..14 + 8 * 11].copy_from_slice(b"FFFFFFFF");
        assert!(matches!(
            has_entry(&mut Cursor::new(&a), "/x"),
            Err(NewcError::NameTooLong(0))
        ));
        let mut a = archive(&["init"]);
        a[0] = b'1';
        assert!(matches!(
            has_entry(&mut Cursor::new(&a), "/x"),
            Err(NewcError::BadHeader(0))
        ));
        let mut a = archive(&["init"]);
        a[6 + 8 * 6..14 + 8 * 6].copy_from_slice(b"zzzzzzzz");
        assert!(matches!(
            has_entry(&mut Cursor::new(&a), "/x"),
            Err(NewcError::BadHeader(0))
        ));
        // Empty input is an archive with nothing in it.
        assert!(!has_entry(&mut Cursor::new(Vec::new()), "/x").unwrap());
    }
}
