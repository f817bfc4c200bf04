//! Image defaults: what an image's config (OCI `Env`, `WorkingDir`, `User`, `Entrypoint`,
//! `Cmd`) supplies when the caller does not say otherwise.
//!
//! They are part of the spec ([`crate::Image::config`]) so `--dry-run` shows them, and each is
//! overridable: the environment merges *under* `Guarantees.env` (an explicit variable wins,
//! and the image's variables pass the same rules, the secret rule included, so nothing
//! reaches the guest that the spec does not show), `Spec.user` replaces `User`, a working
//! directory given with the command replaces `WorkingDir`, and a given command replaces
//! `Entrypoint` + `Cmd` (which run only when no command is given). A `--rootfs` file alone has
//! no config: every default is empty.

use serde::{Deserialize, Serialize};

use crate::env::{MAX_ENV_BYTES, looks_secret};
use crate::error::SpecError;
use crate::paths::normalize_guest_path;

/// Longest `User` string.
pub const MAX_USER_LEN: usize = 256;
/// Most words in `Entrypoint` + `Cmd`.
pub const MAX_COMMAND_WORDS: usize = 4096;

/// The defaults an image supplies (all empty for a bare root filesystem).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// Environment variables, in the image's order.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory of commands (absolute guest path).
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `NAME`, `UID`, `NAME:GROUP` or `UID:GID`, resolved in the image's `/etc/passwd` and
    /// `/etc/group` inside the guest.
    #[serde(default)]
    pub user: Option<String>,
    /// Run (followed by `cmd`) when no command is given.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
}

impl ImageConfig {
    /// `Entrypoint` followed by `Cmd`: the command run when none is given (may be empty).
    pub fn default_command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

fn refuse(field: String, value: &str, reason: &'static str) -> SpecError {
    SpecError::ImageConfig {
        field,
        value: value.chars().take(128).collect(),
        reason,
    }
}

/// Checks a user string (`NAME`, `UID`, `NAME:GROUP`, `UID:GID`); `field` names it.
pub fn check_user(field: &str, user: &str) -> Result<(), SpecError> {
    let part = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'$'))
    };
    let ok = user.len() <= MAX_USER_LEN
        && match user.split_once(':') {
            Some((u, g)) => part(u) && part(g),
            None => part(user),
        };
    if !ok {
        return Err(refuse(
            field.into(),
            user,
            "expected NAME, UID, NAME:GROUP or UID:GID ([A-Za-z0-9_.$-], at most 256 bytes)",
        ));
    }
    Ok(())
}

/// Checks the image defaults; `allow` is `Guarantees.env_allow`. Returns the normalized
/// working directory.
pub(crate) fn check(c: &ImageConfig, allow: &[String]) -> Result<Option<String>, SpecError> {
    for (i, (name, value)) in c.env.iter().enumerate() {
        let field = || format!("image.config.env[{i}]");
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(refuse(
                field(),
                name,
                "a name must be non-empty, without '=' or NUL",
            ));
        }
        if value.contains('\0') {
            return Err(refuse(field(), name, "the value contains NUL"));
        }
        if c.env[..i].iter().any(|(n, _)| n == name) {
            return Err(refuse(field(), name, "set twice"));
        }
        if looks_secret(name, value).is_some() && !allow.iter().any(|a| a == name) {
            return Err(refuse(
                field(),
                name,
                "looks like a secret; list it in guarantees.env_allow to pass it anyway",
            ));
        }
    }
    if let Some(u) = &c.user {
        check_user("image.config.user", u)?;
    }
    let words = c.entrypoint.len() + c.cmd.len();
    if words > MAX_COMMAND_WORDS {
        return Err(refuse(
            "image.config.cmd".into(),
            &words.to_string(),
            "too many words in entrypoint + cmd (max 4096)",
        ));
    }
    for (name, list) in [("entrypoint", &c.entrypoint), ("cmd", &c.cmd)] {
        if let Some(i) = list.iter().position(|w| w.contains('\0')) {
            return Err(refuse(
                format!("image.config.{name}[{i}]"),
                &list[i],
                "contains NUL",
            ));
        }
    }
    c.working_dir
        .as_deref()
        .map(|w| normalize_guest_path("image.config.working_dir", w))
        .transpose()
}

/// The image's variables that `explicit` does not set, followed by `explicit`: the complete
/// environment of every guest process.
pub fn merge_env(
    image: &[(String, String)],
    explicit: &[(String, String)],
) -> Vec<(String, String)> {
    image
        .iter()
        .filter(|(n, _)| !explicit.iter().any(|(e, _)| e == n))
        .chain(explicit)
        .cloned()
        .collect()
}

/// Checks an image source: a digest needs a root file, and has the form `sha256:<64 hex>`.
pub(crate) fn check_source(image: &crate::Image) -> Result<(), SpecError> {
    let Some(src) = &image.source else {
        return Ok(());
    };
    if image.rootfs.is_none() {
        return Err(refuse(
            "image.source".into(),
            &src.reference,
            "an image source needs the image.rootfs it was resolved to",
        ));
    }
    let hex = src.digest.strip_prefix("sha256:").unwrap_or("");
    if !crate::digest::is_sha256_hex(hex) {
        return Err(refuse(
            "image.source.digest".into(),
            &src.digest,
            "expected sha256:<64 lowercase hex>",
        ));
    }
    if src.reference.is_empty()
        || src.reference.len() > 1024
        || src.reference.contains(char::is_whitespace)
    {
        return Err(refuse(
            "image.source.reference".into(),
            &src.reference,
            "1-1024 bytes without whitespace",
        ));
    }
    Ok(())
}

/// The merged environment's size check (each part was checked on its own).
pub(crate) fn check_merged_size(env: &[(String, String)]) -> Result<(), SpecError> {
    let bytes: usize = env.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
    if bytes > MAX_ENV_BYTES {
        return Err(SpecError::EnvTooLarge {
            bytes,
            max: MAX_ENV_BYTES,
        });
    }
    Ok(())
}
