//! Kernel modules of a distribution kernel. The tuned kernel (`images/kernel/`) has every driver
//! built in and no module support; a distribution kernel (Debian's, used until the tuned one is
//! built: `images/build.sh --kernel debian`) has the virtio, vsock and file-system drivers as
//! modules, which the image build puts in the initramfs under [`MODULE_DIR`] with the list
//! [`ORDER_FILE`] (one file name a line, dependencies first). PID 1 loads them before it looks
//! for a device and then turns module loading off for the rest of the boot
//! (`kernel.modules_disabled`), so guest code, root included, can load no module: the same as on
//! the tuned kernel.

use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::sys;

pub use vm_agent_protocol::initramfs::{MODULE_DIR, ORDER_FILE};
/// Bounds on the list (the image build writes about a dozen short names).
pub const MAX_ORDER_BYTES: u64 = 4096;
pub const MAX_MODULES: usize = 64;

/// Module-loading errors.
#[derive(Debug, thiserror::Error)]
pub enum KmodError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is over {MAX_ORDER_BYTES} bytes")]
    TooLong { path: PathBuf },
    #[error("{path} lists over {MAX_MODULES} modules")]
    TooMany { path: PathBuf },
    #[error("bad module file name {0:?} (a plain `NAME.ko`)")]
    BadName(String),
    #[error("cannot load module {name}")]
    Load {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot turn module loading off")]
    Disable(#[source] std::io::Error),
}

/// The module file names in an order list: one a line, blank lines and `#` comments skipped;
/// each a plain `NAME.ko` (no directory, no dot file).
pub fn parse_order(text: &str, path: &Path) -> Result<Vec<String>, KmodError> {
    let mut names = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let plain = line
            .strip_suffix(".ko")
            .is_some_and(|stem| !stem.is_empty() && !stem.starts_with('.'))
            && line
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
        if !plain {
            return Err(KmodError::BadName(line.into()));
        }
        if names.len() == MAX_MODULES {
            return Err(KmodError::TooMany { path: path.into() });
        }
        names.push(line.to_string());
    }
    Ok(names)
}

/// Loads the modules listed in `dir`/[`ORDER_FILE`] in order (one already loaded counts as
/// loaded) and then turns module loading off. Without the list (the tuned kernel) nothing
/// happens. Returns how many modules were listed.
pub fn load_listed(dir: &Path) -> Result<usize, KmodError> {
    let path = dir.join(ORDER_FILE);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => return Err(KmodError::Read { path, source }),
    };
    let mut text = String::new();
    let read = file.take(MAX_ORDER_BYTES + 1).read_to_string(&mut text);
    read.map_err(|source| KmodError::Read {
        path: path.clone(),
        source,
    })?;
    if text.len() as u64 > MAX_ORDER_BYTES {
        return Err(KmodError::TooLong { path });
    }
    let names = parse_order(&text, &path)?;
    for name in &names {
        let load = |source| KmodError::Load {
            name: name.clone(),
            source,
        };
        let module = std::fs::File::open(dir.join(name)).map_err(load)?;
        match sys::proc::finit_module(module.as_fd()) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            r => r.map_err(load)?,
        }
    }
    std::fs::write("/proc/sys/kernel/modules_disabled", "1").map_err(KmodError::Disable)?;
    Ok(names.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<String>, KmodError> {
        parse_order(text, Path::new("order"))
    }

    #[test]
    fn order_lists_plain_module_files_in_order() {
        let names = parse("# deps first\nvirtio.ko\n\n virtio_ring.ko \nvirtio-rng.ko\n").unwrap();
        assert_eq!(names, ["virtio.ko", "virtio_ring.ko", "virtio-rng.ko"]);
    }

    #[test]
    fn order_refuses_paths_and_other_files() {
        for bad in [
            "../x.ko",
            "/lib/x.ko",
            "sub/x.ko",
            ".ko",
            ".x.ko",
            "x.ko.xz",
            "x",
            "x .ko",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(
                matches!(err, KmodError::BadName(ref n) if n == bad.trim()),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn order_is_bounded() {
        let many = (0..=MAX_MODULES)
            .map(|i| format!("m{i}.ko\n"))
            .collect::<String>();
        assert!(matches!(parse(&many), Err(KmodError::TooMany { .. })));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(ORDER_FILE),
            "#".repeat(MAX_ORDER_BYTES as usize + 1),
        )
        .unwrap();
        let err = load_listed(dir.path()).unwrap_err();
        assert!(matches!(err, KmodError::TooLong { .. }), "{err}");
    }

    #[test]
    fn no_list_loads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_listed(dir.path()).unwrap(), 0);
    }
}
