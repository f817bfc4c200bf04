//! The exception classes of `vm_sandbox._errors` and the one mapping from an error's class
//! to them ([`kind`]). Free of PyO3, so the shim's test of every class through every front
//! end compiles this file as it is (`shim/src/error.rs`).

use vm_sandbox::{Class, Classified};

/// The exception classes of `vm_sandbox._errors` this crate raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    VmError,
    SpecRefused,
    PathRefused,
    NoDriver,
    NoSuchVm,
    NotRunning,
    BootFailed,
    GuestError,
    WallExpired,
    Paused,
    ServeFailed,
    ImageError,
}

impl Kind {
    /// The exception's name in `vm_sandbox._errors`.
    pub fn class_name(self) -> &'static str {
        match self {
            Kind::VmError => "VmError",
            Kind::SpecRefused => "SpecRefused",
            Kind::PathRefused => "PathRefused",
            Kind::NoDriver => "NoDriver",
            Kind::NoSuchVm => "NoSuchVm",
            Kind::NotRunning => "NotRunning",
            Kind::BootFailed => "BootFailed",
            Kind::GuestError => "GuestError",
            Kind::WallExpired => "WallExpired",
            Kind::Paused => "Paused",
            Kind::ServeFailed => "ServeFailed",
            Kind::ImageError => "ImageError",
        }
    }
}

/// The exception of an error classified `c`. A refusal that names an argument the caller
/// can change (`SpecRefused.field`) is `SpecRefused`, a `ValueError`; one that names none
/// (a snapshot that cannot be restored here) is a plain `VmError`; no driver at all is
/// `NoDriver`, but one that a keyword would admit (`allow_emulation`) is that keyword's
/// refusal.
pub fn kind(c: &Classified) -> Kind {
    match (c.class, &c.field) {
        (Class::Refused, _) => Kind::SpecRefused,
        (Class::Usage | Class::Forbidden | Class::NoDriver, Some(_)) => Kind::SpecRefused,
        (Class::Usage | Class::Forbidden, None) => Kind::VmError,
        (Class::NoDriver, None) => Kind::NoDriver,
        (Class::Path, _) => Kind::PathRefused,
        (Class::NotFound, _) => Kind::NoSuchVm,
        (Class::NotRunning, _) => Kind::NotRunning,
        (Class::Paused, _) => Kind::Paused,
        (Class::BootFailed, _) => Kind::BootFailed,
        (Class::WallExpired, _) => Kind::WallExpired,
        (Class::GuestError | Class::CommandNotFound | Class::NotExecutable | Class::Busy, _) => {
            Kind::GuestError
        }
        (Class::ServeFailed, _) => Kind::ServeFailed,
        (Class::Image, _) => Kind::ImageError,
        (Class::Unsupported | Class::Internal, _) => Kind::VmError,
    }
}
