//! `Resume`: the first request to a VM restored from a snapshot. Every VM restored from one
//! snapshot starts with the same memory: the same agent token, the same clock, the same
//! kernel random pool and CRNG key, the same state in every process that seeded a generator
//! before the snapshot. As PID 1 the agent steps the guest's wall clock to the host's (it
//! stood still while the snapshot lay on disk), mixes the host's entropy into the kernel's
//! pool and forces a CRNG reseed (`sys::random`), then writes the VM's generation to
//! [`GENERATION_FILE`] (replaced whole: a process that seeded anything before the snapshot
//! watches it and seeds again, from a kernel that is reseeded by then), and last takes the
//! new token (the snapshot's own is refused from then on, so two VMs restored from one
//! snapshot share no secret).

use std::io::Write;
use std::path::Path;

use super::{Agent, sys};
use vm_agent_protocol::protocol::{ErrorKind, RESUME_ENTROPY_LEN};
use vm_agent_protocol::token::{AgentToken, TOKEN_LEN};

/// The earliest wall-clock time a resume accepts (2020-01-01T00:00:00Z): a host clock
/// before it is broken, and stepping the guest there would only break it too.
pub const MIN_UNIX_NANOS: u64 = 1_577_836_800 * 1_000_000_000;

/// Where PID 1 keeps the VM's generation.
pub const GENERATION_DIR: &str = "/run/vm";
/// The generation's file in [`GENERATION_DIR`]: absent in a booted VM, then the decimal
/// generation and a newline after each restore (1 for a VM restored from a snapshot of a
/// booted one).
pub const GENERATION_FILE: &str = "generation";

/// Why a resume failed (the token is replaced only when the whole request succeeds).
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("the host's time {0} ns after the epoch is before 2020: refused")]
    ClockTooEarly(u64),
    #[error("the new token is all zeros: refused")]
    ZeroToken,
    #[error("the host's entropy is all zeros: refused")]
    ZeroEntropy,
    #[error("generation 0: a restored VM's generation is at least 1")]
    ZeroGeneration,
    #[error("cannot step the guest clock")]
    SetClock(#[source] std::io::Error),
    #[error("cannot add the host's entropy to the kernel's pool (RNDADDENTROPY)")]
    AddEntropy(#[source] std::io::Error),
    #[error("cannot reseed the kernel's CRNG (RNDRESEEDCRNG)")]
    Reseed(#[source] std::io::Error),
    #[error("cannot write the generation to {0}")]
    Generation(std::path::PathBuf, #[source] std::io::Error),
}

impl ResumeError {
    /// The wire error kind of this failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ResumeError::ClockTooEarly(_)
            | ResumeError::ZeroToken
            | ResumeError::ZeroEntropy
            | ResumeError::ZeroGeneration => ErrorKind::BadRequest,
            _ => ErrorKind::Io,
        }
    }
}

/// What a `Resume` request carries.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resume {
    pub token: [u8; TOKEN_LEN],
    pub unix_nanos: u64,
    pub entropy: [u8; RESUME_ENTROPY_LEN],
    pub generation: u64,
}

/// Checks the request, then (PID 1) steps the clock, adds the entropy and reseeds, writes the
/// generation, and replaces the token.
pub(super) fn resume(agent: &Agent, r: Resume) -> Result<(), ResumeError> {
    if r.unix_nanos < MIN_UNIX_NANOS {
        return Err(ResumeError::ClockTooEarly(r.unix_nanos));
    }
    if r.token == [0; TOKEN_LEN] {
        return Err(ResumeError::ZeroToken);
    }
    if r.entropy == [0; RESUME_ENTROPY_LEN] {
        return Err(ResumeError::ZeroEntropy);
    }
    if r.generation == 0 {
        return Err(ResumeError::ZeroGeneration);
    }
    let pid1 = agent.is_pid1();
    if pid1 {
        sys::proc::set_realtime(r.unix_nanos).map_err(ResumeError::SetClock)?;
        sys::random::add_entropy(&r.entropy).map_err(ResumeError::AddEntropy)?;
        sys::random::reseed_crng().map_err(ResumeError::Reseed)?;
    }
    if let Some(dir) = agent.generation_dir() {
        write_generation(dir, r.generation)?;
    }
    agent.set_token(AgentToken::from_bytes(r.token));
    tracing::info!(
        clock_stepped = pid1,
        crng_reseeded = pid1,
        generation = r.generation,
        "resumed from a snapshot: host entropy added, CRNG reseeded, new token"
    );
    Ok(())
}

/// Replaces `dir/generation` with `generation` (a temporary file renamed over it, so a reader
/// sees the old file or the new one, and a watcher one `IN_MOVED_TO`); `dir` is made (0755)
/// when missing.
fn write_generation(dir: &Path, generation: u64) -> Result<(), ResumeError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = dir.join(GENERATION_FILE);
    let fail = |e| ResumeError::Generation(path.clone(), e);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(fail)?;
    let tmp = dir.join(".generation.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&tmp)
        .and_then(|mut f| f.write_all(format!("{generation}\n").as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(fail)
}
