//! The one error type for spec validation. Every message starts with the field path
//! (`guarantees.mounts[0].host_path`) and names the offending value.

use std::path::PathBuf;

use thiserror::Error;

/// Why a spec was refused before anything was created.
#[derive(Debug, Error)]
pub enum SpecError {
    #[error("guarantees.egress_denied: false refused; untrusted work must run with egress denied")]
    EgressAllowed,
    #[error("guarantees.limits.mem_mib: {value} refused; memory must be capped at >= {min} MiB")]
    MemoryUncapped { value: i64, min: i64 },
    #[error("guarantees.limits.{field}: {value} refused; the minimum is {min}")]
    LimitTooLow {
        field: &'static str,
        value: i64,
        min: i64,
    },
    #[error("guarantees.limits.wall_ms: 0 refused; give a positive lifetime, or none")]
    ZeroWall,
    #[error("guarantees.limits.{field}: {value} exceeds the maximum {max}")]
    LimitTooHigh {
        field: &'static str,
        value: i64,
        max: i64,
    },
    #[error("guarantees.mounts[{index}].read_only: writable mount {} refused for untrusted work", .host_path.display())]
    WritableMount { index: usize, host_path: PathBuf },
    #[error("{field}: relative path {path:?} refused; must be absolute")]
    RelativePath { field: String, path: String },
    #[error("{field}: {path:?} contains forbidden character {ch:?}")]
    ForbiddenChar {
        field: String,
        path: String,
        ch: char,
    },
    #[error("{field}: {path:?} is not valid UTF-8")]
    NonUtf8Path { field: String, path: String },
    #[error("{field}: {path:?} has a '.' or '..' component or an empty one")]
    GuestPathNotNormal { field: String, path: String },
    #[error("{field}: {path} would shadow protected guest path {protected}")]
    ProtectedGuestPath {
        field: String,
        path: String,
        protected: String,
    },
    #[error("{field}: {path} overlaps {other_field} ({other})")]
    OverlappingGuestPath {
        field: String,
        path: String,
        other_field: String,
        other: String,
    },
    #[error("{field}: cannot resolve {}", .path.display())]
    Unresolvable {
        field: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{field}: {} refused: {reason}", .path.display())]
    UnsafeHostPath {
        field: String,
        path: PathBuf,
        reason: String,
    },
    #[error(
        "{field}: {} exposes {} ({what}); name it with --allow-mount-secret (guarantees.mount_secret_allow) to mount it anyway", .path.display(), .credential.display()
    )]
    SecretMount {
        field: String,
        path: PathBuf,
        credential: PathBuf,
        what: &'static str,
    },
    #[error("guarantees.mounts: {count} mounts exceed the maximum {max}")]
    TooManyMounts { count: usize, max: usize },
    #[error("{field}: {path:?} is longer than {max} bytes")]
    PathTooLong {
        field: String,
        path: String,
        max: usize,
    },
    #[error("guarantees.env: {bytes} bytes exceed the maximum {max}")]
    EnvTooLarge { bytes: usize, max: usize },
    #[error("guarantees.env[{index}]: name {name:?} refused: {reason}")]
    EnvName {
        index: usize,
        name: String,
        reason: &'static str,
    },
    #[error("guarantees.env_allow[{index}]: {name:?} refused: {reason}")]
    EnvAllowName {
        index: usize,
        name: String,
        reason: &'static str,
    },
    #[error("guarantees.env[{index}]: value of {name} contains NUL")]
    EnvValue { index: usize, name: String },
    #[error("guarantees.env[{index}]: {name} is set twice")]
    DuplicateEnv { index: usize, name: String },
    #[error(
        "guarantees.env[{index}]: {name} looks like a secret ({why}); list it in guarantees.env_allow to pass it anyway"
    )]
    SecretEnv {
        index: usize,
        name: String,
        why: &'static str,
    },
    #[error("{field}: cannot read {}", .path.display())]
    ImageUnreadable {
        field: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{field}: digest {value:?} is not 64 lowercase hex characters")]
    DigestMalformed { field: String, value: String },
    #[error("{field}: sha256 of {} is {actual}, pinned {expected}", .path.display())]
    DigestMismatch {
        field: String,
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("{field}: {value:?} refused: {reason}")]
    ImageConfig {
        field: String,
        value: String,
        reason: &'static str,
    },
    #[error("image.rootfs: {} is neither an erofs nor an ext4 image", .path.display())]
    RootfsFormat { path: PathBuf },
    #[error("image.digests.{field}: digest pinned for a file the image does not name")]
    DigestWithoutFile { field: &'static str },
}
