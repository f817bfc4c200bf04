//! Streamed file transfer of a [`Guest`]: files of any size up to a cap, in bounded chunks.
//!
//! Every call takes its cap (`max`, [`DEFAULT_COPY_CAP`] for `vm cp`). A host source must be a
//! regular file (a FIFO, device or directory is refused before it is read: `/dev/zero` never
//! streams) no larger than the cap when opened, and is refused mid-stream if it grows past it;
//! the guest side applies the same rules to what it reads. Destinations are never left half
//! written: the agent writes a temporary file and renames it, and [`Guest::copy_out`] does the
//! same on the host. Both sides keep all-zero blocks as holes, so a sparse file stays sparse.

use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use tokio::io::AsyncRead;
use vm_agent_client::ClientError;
use vm_agent_protocol::sparse::{ChunkSink, SparseWriter};
use vm_drivers::MachineError;

use super::Guest;
use crate::confine;
use crate::error::SandboxError;

/// The default cap of one file transfer: 1 GiB.
pub const DEFAULT_COPY_CAP: u64 = vm_agent_protocol::protocol::DEFAULT_FILE_CAP;

/// Why a host file could not be copied (the guest side's refusals come from the agent).
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{path}: not a regular file ({kind}); only regular files are copied")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}: {size} bytes is over the copy cap of {max} bytes")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("{path} grew past the copy cap of {max} bytes while being copied")]
    Grew { path: PathBuf, max: u64 },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CopyError + '_ {
    move |source| CopyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a non-regular file is, for the refusal.
fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a plain file"
    }
}

/// Opens `path` for reading without blocking on a FIFO or taking a terminal, and checks it is
/// a regular file of at most `max` bytes.
fn open_source(path: &Path, max: u64) -> Result<std::fs::File, CopyError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io(path))?;
    let meta = f.metadata().map_err(io(path))?;
    if !meta.is_file() {
        return Err(CopyError::NotRegular {
            path: path.into(),
            kind: kind_of(meta.file_type()),
        });
    }
    if meta.len() > max {
        return Err(CopyError::TooLarge {
            path: path.into(),
            size: meta.len(),
            max,
        });
    }
    Ok(f)
}

/// A temporary file beside a host destination, removed unless renamed over it.
struct HostPart {
    tmp: PathBuf,
    done: bool,
}

impl HostPart {
    fn create(dst: &Path) -> Result<(HostPart, std::fs::File), CopyError> {
        let name = dst
            .file_name()
            .ok_or_else(|| CopyError::NotRegular {
                path: dst.into(),
                kind: "not a file name",
            })?
            .to_string_lossy();
        let dir = dst.parent().filter(|p| !p.as_os_str().is_empty());
        let dir = dir.unwrap_or(Path::new("."));
        let mut tries = 0;
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let tmp = dir.join(format!(".{name}.vm-cp-{}-{nanos:x}", std::process::id()));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
            {
                Ok(f) => return Ok((HostPart { tmp, done: false }, f)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => {
                    tries += 1;
                }
                Err(e) => return Err(io(dst)(e)),
            }
        }
    }

    fn commit(mut self, dst: &Path) -> Result<(), CopyError> {
        std::fs::rename(&self.tmp, dst).map_err(io(dst))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for HostPart {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl Guest {
    /// Streams the file at `path` (relative to the root) into `out`; at most `max` bytes.
    pub async fn read_file_to<S: ChunkSink>(
        &self,
        path: &str,
        max: u64,
        out: &mut S,
    ) -> Result<u64, SandboxError> {
        let rel = confine::relative(path, false)?;
        self.ensure_root().await?;
        let root = self.root().to_string();
        self.link
            .call(|c| c.read_file_to(&root, &rel, max, out))
            .await
            .map_err(SandboxError::machine("read file"))
    }

    /// Streams `src` to its end into the file at `path` (relative to the root; parents are
    /// created), replacing it only once complete; at most `max` bytes.
    pub async fn write_file_from<R: AsyncRead + Unpin>(
        &self,
        path: &str,
        max: u64,
        src: &mut R,
    ) -> Result<u64, SandboxError> {
        let rel = confine::relative(path, false)?;
        self.ensure_root().await?;
        let root = self.root().to_string();
        self.link
            .call(|c| c.write_file_from(&root, &rel, max, src))
            .await
            .map_err(SandboxError::machine("write file"))
    }

    /// Copies the host file `src` to the absolute guest path `dst` (like `docker cp`); returns
    /// the bytes copied. See the module docs for the rules.
    pub async fn copy_in(&self, src: &Path, dst: &str, max: u64) -> Result<u64, SandboxError> {
        let rel = confine::absolute(dst)?;
        let mut f = tokio::fs::File::from_std(open_source(src, max)?);
        match self
            .link
            .call(|c| c.write_file_from("/", &rel, max, &mut f))
            .await
        {
            Ok(n) => Ok(n),
            Err(MachineError::Agent(ClientError::TooLarge { .. })) => Err(CopyError::Grew {
                path: src.into(),
                max,
            }
            .into()),
            Err(source) => Err(SandboxError::Machine {
                op: "copy in",
                source,
            }),
        }
    }

    /// Streams the file at the absolute guest path `src` into `out`; at most `max` bytes.
    pub async fn copy_out_to<S: ChunkSink>(
        &self,
        src: &str,
        max: u64,
        out: &mut S,
    ) -> Result<u64, SandboxError> {
        let rel = confine::absolute(src)?;
        self.link
            .call(|c| c.read_file_to("/", &rel, max, out))
            .await
            .map_err(SandboxError::machine("copy out"))
    }

    /// Copies the file at the absolute guest path `src` to the host file `dst`, through a
    /// temporary file beside it that replaces `dst` only once complete (holes kept; a
    /// replaced file's permissions kept).
    pub async fn copy_out(&self, src: &str, dst: &Path, max: u64) -> Result<u64, SandboxError> {
        confine::absolute(src)?;
        if let Ok(m) = std::fs::metadata(dst)
            && !m.is_file()
        {
            let kind = kind_of(m.file_type());
            return Err(CopyError::NotRegular {
                path: dst.into(),
                kind,
            }
            .into());
        }
        let (part, f) = HostPart::create(dst)?;
        if let Ok(m) = std::fs::metadata(dst) {
            // A replaced file keeps its permissions.
            f.set_permissions(m.permissions()).map_err(io(dst))?;
        }
        let mut w = SparseWriter::new(tokio::fs::File::from_std(f));
        let n = self.copy_out_to(src, max, &mut w).await?;
        drop(w.finish().await.map_err(io(dst))?);
        part.commit(dst)?;
        Ok(n)
    }
}
