//! `Spec::validate`: every refusal happens here, before anything is created.
//!
//! A [`ValidSpec`] can only be obtained from [`Spec::validate`] (or
//! [`Spec::validate_with`]); it carries the normalized values (resolved host paths,
//! normalized guest paths, concrete limits) that the sandbox turns into a boot plan.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::digest::{is_sha256_hex, sha256_file};
use crate::env::{check_env, check_env_allow};
use crate::error::SpecError;
use crate::imageconfig::{self, ImageConfig};
use crate::limits::ValidLimits;
use crate::model::{Image, ImageSource, Spec};
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
    #[serde(skip_serializing_if = "crate::MountVia::is_share")]
    pub via: crate::MountVia,
}

/// The filesystem of a root image, from its superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RootfsFormat {
    Erofs,
    Ext4,
}

/// Validated image files (existing regular files, digests checked when pinned).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidImage {
    pub kernel: PathBuf,
    pub bz_image: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub rootfs: Option<PathBuf>,
    /// The filesystem `rootfs` holds (set exactly when `rootfs` is).
    pub rootfs_format: Option<RootfsFormat>,
    /// The image defaults, working directory normalized.
    pub config: ImageConfig,
    /// The OCI image the root was resolved from, with the digest booted.
    pub source: Option<ImageSource>,
}

/// A spec that passed every rule, with its normalized values.
#[derive(Debug, Clone, Serialize)]
pub struct ValidSpec {
    root: String,
    image: ValidImage,
    limits: ValidLimits,
    mounts: Vec<ValidMount>,
    env: Vec<(String, String)>,
    user: Option<String>,
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
    /// The complete environment of every guest process: the image's `Env` under
    /// `Guarantees.env`.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }
    /// The user every command runs as: `Spec.user`, else the image's `User`; `None` = root.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }
    /// The image's working directory (where commands run when none is given).
    pub fn working_dir(&self) -> Option<&str> {
        self.image.config.working_dir.as_deref()
    }
    /// The image's `Entrypoint` + `Cmd` (empty when it has neither).
    pub fn default_command(&self) -> Vec<String> {
        self.image.config.default_command()
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
                via: m.via,
            });
        }

        check_env_allow(&g.env_allow)?;
        check_env(&g.env, &g.env_allow)?;
        imageconfig::check_source(&self.image)?;
        let mut config = self.image.config.clone();
        config.working_dir = imageconfig::check(&config, &g.env_allow)?;
        let env = imageconfig::merge_env(&config.env, &g.env);
        imageconfig::check_merged_size(&env)?;
        if let Some(u) = &self.user {
            imageconfig::check_user("user", u)?;
        }
        let user = self.user.clone().or_else(|| config.user.clone());
        let mut image = validate_image(&self.image)?;
        image.config = config;
        Ok(ValidSpec {
            root,
            image,
            limits,
            mounts,
            env,
            user,
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
    let rootfs_format = image.rootfs.as_deref().map(rootfs_format).transpose()?;
    Ok(ValidImage {
        kernel: image.kernel.clone(),
        bz_image: image.bz_image.clone(),
        initrd: image.initrd.clone(),
        rootfs: image.rootfs.clone(),
        rootfs_format,
        config: ImageConfig::default(),
        source: image.source.clone(),
    })
}

/// Erofs (magic `0xE0F5E1E2` at byte 1024) or ext4 (`0xEF53` at byte 1080), else refused.
fn rootfs_format(path: &Path) -> Result<RootfsFormat, SpecError> {
    use std::io::Read;
    let mut sb = [0u8; 1082];
    let read = std::fs::File::open(path).and_then(|f| {
        let mut n = 0;
        let mut f = f.take(sb.len() as u64);
        while n < sb.len() {
            match f.read(&mut sb[n..])? {
                0 => break,
                k => n += k,
            }
        }
        Ok(n)
    });
    let n = read.map_err(|source| SpecError::ImageUnreadable {
        field: "image.rootfs".into(),
        path: path.to_path_buf(),
        source,
    })?;
    if n == sb.len() {
        if sb[1024..1028] == 0xE0F5_E1E2u32.to_le_bytes() {
            return Ok(RootfsFormat::Erofs);
        }
        if sb[1080..1082] == 0xEF53u16.to_le_bytes() {
            return Ok(RootfsFormat::Ext4);
        }
    }
    Err(SpecError::RootfsFormat {
        path: path.to_path_buf(),
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
