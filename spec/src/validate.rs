//! `Spec::validate`: every refusal happens here, before anything is created.
//!
//! A [`ValidSpec`] can only be obtained from [`Spec::validate`] (or
//! [`Spec::validate_with`]); it carries the normalized values (resolved host paths,
//! normalized guest paths, concrete limits) that the sandbox turns into a boot plan.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::digest::{is_sha256_hex, sha256_file};
use crate::env::check_env;
use crate::error::SpecError;
use crate::limits::ValidLimits;
use crate::model::{Image, Spec};
use crate::paths::{
    SCRATCH_GUEST_PATHS, check_host_path_text, is_ancestor_or_same, normalize_guest_path,
    refuse_shadowing, refuse_system_guest_path, resolve_mount_source,
};
use crate::secrets::credential_exposed;

/// Most mounts a guest can take (the agent's disk limit).
pub const MAX_MOUNTS: usize = 16;

/// What validation needs from the host: the home directory for the mount-safety rules.
#[derive(Debug, Clone, Default)]
pub struct ValidateContext {
    /// The user's home; `None` skips the home rules (the `/` rule always applies).
    pub home: Option<PathBuf>,
}

impl ValidateContext {
    /// `$HOME` of this process.
    pub fn from_env() -> Self {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from);
        ValidateContext { home }
    }
}

/// A validated mount: host path resolved, guest path normalized, always read-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidMount {
    pub host_path: PathBuf,
    pub guest_path: String,
}

/// Validated image files (existing regular files, digests checked when pinned).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidImage {
    pub kernel: PathBuf,
    pub bz_image: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub rootfs: Option<PathBuf>,
}

/// A spec that passed every rule, with its normalized values.
#[derive(Debug, Clone, Serialize)]
pub struct ValidSpec {
    root: String,
    image: ValidImage,
    limits: ValidLimits,
    mounts: Vec<ValidMount>,
    env: Vec<(String, String)>,
}

impl ValidSpec {
    /// Normalized guest working root.
    pub fn root(&self) -> &str {
        &self.root
    }
    pub fn image(&self) -> &ValidImage {
        &self.image
    }
    pub fn limits(&self) -> &ValidLimits {
        &self.limits
    }
    pub fn mounts(&self) -> &[ValidMount] {
        &self.mounts
    }
    /// The complete environment of every guest process.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }
}

impl Spec {
    /// Validate against this process's `$HOME`.
    pub fn validate(&self) -> Result<ValidSpec, SpecError> {
        self.validate_with(&ValidateContext::from_env())
    }

    /// Validate with an explicit context. Checks run cheapest first; image hashing last.
    pub fn validate_with(&self, ctx: &ValidateContext) -> Result<ValidSpec, SpecError> {
        let g = &self.guarantees;
        if !g.egress_denied {
            return Err(SpecError::EgressAllowed);
        }
        let limits = g.limits.normalize()?;
        let root = normalize_guest_path("root", &self.root)?;
        refuse_system_guest_path("root", &root)?;

        if g.mounts.len() > MAX_MOUNTS {
            return Err(SpecError::TooManyMounts {
                count: g.mounts.len(),
                max: MAX_MOUNTS,
            });
        }
        let mut mounts: Vec<ValidMount> = Vec::with_capacity(g.mounts.len());
        for (index, m) in g.mounts.iter().enumerate() {
            if !m.read_only {
                return Err(SpecError::WritableMount {
                    index,
                    host_path: m.host_path.clone(),
                });
            }
            let field = format!("guarantees.mounts[{index}].guest_path");
            let guest = normalize_guest_path(&field, &m.guest_path)?;
            refuse_system_guest_path(&field, &guest)?;
            for protected in SCRATCH_GUEST_PATHS.iter().copied().chain([root.as_str()]) {
                refuse_shadowing(&field, &guest, protected)?;
            }
            if let Some((j, other)) = mounts.iter().enumerate().find(|(_, o)| {
                is_ancestor_or_same(&o.guest_path, &guest)
                    || is_ancestor_or_same(&guest, &o.guest_path)
            }) {
                return Err(SpecError::OverlappingGuestPath {
                    field,
                    path: guest,
                    other_field: format!("guarantees.mounts[{j}].guest_path"),
                    other: other.guest_path.clone(),
                });
            }
            let host_field = format!("guarantees.mounts[{index}].host_path");
            let host = resolve_mount_source(&host_field, &m.host_path, ctx.home.as_deref())?;
            refuse_secret_mount(
                &host_field,
                &host,
                ctx.home.as_deref(),
                &g.mount_secret_allow,
            )?;
            mounts.push(ValidMount {
                host_path: host,
                guest_path: guest,
            });
        }

        check_env(&g.env, &g.env_allow)?;
        let image = validate_image(&self.image)?;
        Ok(ValidSpec {
            root,
            image,
            limits,
            mounts,
            env: g.env.clone(),
        })
    }
}

/// Refuse a mount exposing a credential location under `home` unless the mount's host path is
/// listed in `allow` (each entry resolved the same way; an unresolvable entry allows nothing).
fn refuse_secret_mount(
    field: &str,
    host: &Path,
    home: Option<&Path>,
    allow: &[PathBuf],
) -> Result<(), SpecError> {
    let Some(hit) = home.and_then(|h| credential_exposed(host, h)) else {
        return Ok(());
    };
    if allow
        .iter()
        .any(|a| a.canonicalize().is_ok_and(|a| a == host))
    {
        return Ok(());
    }
    Err(SpecError::SecretMount {
        field: field.into(),
        path: host.to_path_buf(),
        credential: hit.path,
        what: hit.what,
    })
}

fn validate_image(image: &Image) -> Result<ValidImage, SpecError> {
    let d = &image.digests;
    let files: [(&'static str, Option<&PathBuf>, Option<&String>); 4] = [
        ("kernel", Some(&image.kernel), d.kernel.as_ref()),
        ("bz_image", image.bz_image.as_ref(), d.bz_image.as_ref()),
        ("initrd", image.initrd.as_ref(), d.initrd.as_ref()),
        ("rootfs", image.rootfs.as_ref(), d.rootfs.as_ref()),
    ];
    // Cheap checks for every file before hashing any.
    for (name, path, digest) in &files {
        if let Some(digest) = digest {
            if path.is_none() {
                return Err(SpecError::DigestWithoutFile { field: name });
            }
            if !is_sha256_hex(digest) {
                return Err(SpecError::DigestMalformed {
                    field: format!("image.digests.{name}"),
                    value: (*digest).clone(),
                });
            }
        }
        if let Some(path) = path {
            check_image_file(&format!("image.{name}"), path)?;
        }
    }
    for (name, path, digest) in &files {
        if let (Some(path), Some(expected)) = (path, digest) {
            let field = format!("image.{name}");
            let actual = sha256_file(path).map_err(|source| SpecError::ImageUnreadable {
                field: field.clone(),
                path: path.to_path_buf(),
                source,
            })?;
            if &actual != *expected {
                return Err(SpecError::DigestMismatch {
                    field,
                    path: path.to_path_buf(),
                    expected: (*expected).clone(),
                    actual,
                });
            }
        }
    }
    Ok(ValidImage {
        kernel: image.kernel.clone(),
        bz_image: image.bz_image.clone(),
        initrd: image.initrd.clone(),
        rootfs: image.rootfs.clone(),
    })
}

fn check_image_file(field: &str, path: &Path) -> Result<(), SpecError> {
    check_host_path_text(field, path)?;
    let unreadable = |source| SpecError::ImageUnreadable {
        field: field.into(),
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(unreadable(std::io::Error::other("not a regular file")));
    }
    Ok(())
}
