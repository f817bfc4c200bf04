//! `vm-spec`: what a sandbox is allowed to be.
//!
//! This crate is pure policy and data. It holds
//! - the trust scale ([`Trust`]) and the ordered containment scale ([`Containment`]), with
//!   the admission gate [`admit`]/[`select`]: a tier weaker than [`required`] for the
//!   work's trust is refused with a `Forbidden` error naming the gap. The only relaxation
//!   is an explicit [`Policy`] field (`allow_emulation` lets untrusted work run on a
//!   user-kernel tier such as QEMU TCG), and refusals print the flag that would allow it.
//!   There is no silent downgrade.
//! - the request types ([`Spec`], [`Image`], [`Guarantees`], [`Mount`], [`Limits`]), serde
//!   both ways so the CLI can print them;
//! - [`Spec::validate`], which refuses a weakened posture before anything is created
//!   (egress open, memory uncapped, a writable or unsafe mount, a path that would break
//!   the kernel command line or shadow a protected guest path, a malformed or
//!   secret-looking environment, an image that does not match its pinned sha256) and
//!   returns a [`ValidSpec`] with normalized values. Every [`SpecError`] message starts
//!   with the field path and names the value.
//!
//! The validation rules are the untrusted posture and apply to every spec, whatever the
//! trust level: a microVM guest always runs with egress denied, capped memory, read-only
//! mounts and an explicit environment. A secret-looking variable passes only when its name
//! is listed in `Guarantees.env_allow`, so the exception is visible in the spec itself
//! (and in `--dry-run --json`).
//!
//! The only I/O here is resolving mount sources (for the home/root rules), checking that
//! image files exist and streaming them through sha256 when a digest is pinned. The rules
//! for protected guest paths are documented in [`paths`]; the environment rules in
//! [`mod@env`]. The one default the runtime offers, a guest `PATH`
//! ([`DEFAULT_GUEST_PATH`]), is applied only by writing it into the spec with
//! [`Guarantees::with_default_env`], so the environment is always exactly what the spec says.
//!
//! ```
//! use vm_spec::{Containment, Policy, Trust, admit_level};
//! assert!(admit_level("kvm", Containment::MicroVm, Trust::Untrusted, &Policy::default()).is_ok());
//! let err = admit_level("tcg", Containment::UserKernel, Trust::Untrusted, &Policy::default());
//! assert!(err.unwrap_err().to_string().contains("--allow-emulation"));
//! ```

pub mod digest;
pub mod env;
mod error;
pub mod imageconfig;
mod limits;
mod model;
pub mod paths;
pub mod secrets;
mod trust;
pub mod units;
mod validate;

pub use env::{DEFAULT_GUEST_PATH, default_guest_env};
pub use error::SpecError;
pub use imageconfig::ImageConfig;
pub use limits::{
    DEFAULT_PIDS, Limits, MAX_MEM_MIB, MAX_PIDS, MAX_VCPUS, MIN_MEM_MIB, ValidLimits,
};
pub use model::{
    DEFAULT_ROOT, Guarantees, Image, ImageDigests, ImageSource, Mount, MountVia, Spec,
};
pub use trust::{
    ALLOW_EMULATION_FLAG, AdmitError, Containment, Policy, Tier, Trust, admit, admit_level,
    required, select,
};
pub use validate::{MAX_MOUNTS, RootfsFormat, ValidImage, ValidMount, ValidSpec, ValidateContext};
