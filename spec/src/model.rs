//! The declarative request: what to boot and under which guarantees.
//!
//! These types are plain data (serde both ways) so the CLI can print them with
//! `--dry-run --json`. Nothing here is trusted until [`Spec::validate`](crate::Spec::validate)
//! turns it into a [`ValidSpec`](crate::ValidSpec).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::imageconfig::ImageConfig;
use crate::limits::Limits;

/// Default guest working root: where file operations are confined and commands run.
pub const DEFAULT_ROOT: &str = "/work";

/// A host path exposed inside the guest. Only read-only mounts pass validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Absolute host path (file or directory).
    pub host_path: PathBuf,
    /// Absolute guest path it appears at.
    pub guest_path: String,
    /// Must be true: a writable host mount into an untrusted guest is a hole.
    pub read_only: bool,
    /// How the guest gets it: the read-only file server (the default), or an erofs copy.
    #[serde(default, skip_serializing_if = "MountVia::is_share")]
    pub via: MountVia,
}

/// How a host mount reaches the guest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountVia {
    /// A read-only virtio-fs share: the host's files as they are, read in place by a jailed
    /// file server on the host; nothing copied, no size cap.
    #[default]
    Share,
    /// A directory copied into a cached erofs image on a read-only disk: no file server on
    /// the host side, at the cost of the copy (and its size cap).
    Erofs,
}

impl MountVia {
    /// Whether this is the default, [`MountVia::Share`].
    pub fn is_share(&self) -> bool {
        *self == MountVia::Share
    }
}

impl Mount {
    /// A read-only mount, served by the file server.
    pub fn read_only(host_path: impl Into<PathBuf>, guest_path: impl Into<String>) -> Self {
        Mount {
            host_path: host_path.into(),
            guest_path: guest_path.into(),
            read_only: true,
            via: MountVia::Share,
        }
    }

    /// A read-only directory mount copied into an erofs image ([`MountVia::Erofs`]).
    pub fn erofs_copy(host_path: impl Into<PathBuf>, guest_path: impl Into<String>) -> Self {
        Mount {
            via: MountVia::Erofs,
            ..Mount::read_only(host_path, guest_path)
        }
    }
}

/// Optional pinned sha256 (lowercase hex) per image file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageDigests {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bz_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<String>,
}

/// Where an image root came from: the reference asked for and the manifest digest that was
/// actually resolved and booted (`sha256:<64 hex>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSource {
    pub reference: String,
    pub digest: String,
}

/// The guest kernel and filesystems to boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// Uncompressed kernel (`vmlinux`, ELF with a PVH note), booted by our own VMM.
    pub kernel: PathBuf,
    /// Compressed kernel (`bzImage`) for drivers that need one (QEMU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bz_image: Option<PathBuf>,
    /// Initramfs (uncompressed newc cpio with `/init` = the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    /// Optional root filesystem image (erofs or ext4, read-only): the root every command
    /// runs in, under a tmpfs overlay that vanishes with the VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,
    /// Pinned digests; a file whose digest is given must match it.
    #[serde(default)]
    pub digests: ImageDigests,
    /// The image's defaults (env, working dir, user, entrypoint, cmd); empty for a bare
    /// `rootfs`.
    #[serde(default)]
    pub config: ImageConfig,
    /// The OCI image `rootfs` and `config` were resolved from (`None` for a bare `rootfs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ImageSource>,
}

/// The non-negotiable security composition a guest runs under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guarantees {
    /// No outbound network. Must be true.
    pub egress_denied: bool,
    /// Resource caps.
    pub limits: Limits,
    /// Host paths exposed to the guest; each must be read-only.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// The complete environment of every guest process; nothing is inherited.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Env names explicitly allowed even though they look like secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_allow: Vec<String>,
    /// Host paths explicitly allowed as mounts even though they are (or hold) credentials
    /// ([`crate::secrets::CREDENTIAL_PATHS`]); compared after resolving symlinks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_secret_allow: Vec<PathBuf>,
}

impl Guarantees {
    /// The untrusted posture: egress denied, the given caps, every mount forced read-only,
    /// an empty environment.
    pub fn untrusted(limits: Limits, mounts: Vec<Mount>) -> Self {
        let mounts = mounts
            .into_iter()
            .map(|m| Mount {
                read_only: true,
                ..m
            })
            .collect();
        Guarantees {
            egress_denied: true,
            limits,
            mounts,
            env: Vec::new(),
            env_allow: Vec::new(),
            mount_secret_allow: Vec::new(),
        }
    }

    /// Add one environment variable.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// The runtime's default guest environment ([`crate::env::default_guest_env`]: `PATH` =
    /// [`crate::env::DEFAULT_GUEST_PATH`]). Not applied unless asked for with
    /// [`Guarantees::with_default_env`].
    pub fn default_guest_env() -> Vec<(String, String)> {
        crate::env::default_guest_env()
    }

    /// Write each variable of [`Guarantees::default_guest_env`] whose name `env` does not
    /// set yet into `env` (ahead of the caller's, in the defaults' order). The result is
    /// still the complete, explicit environment: the spec (and `--dry-run`) shows it.
    pub fn with_default_env(mut self) -> Self {
        let missing: Vec<(String, String)> = Self::default_guest_env()
            .into_iter()
            .filter(|(name, _)| !self.env.iter().any(|(n, _)| n == name))
            .collect();
        self.env.splice(0..0, missing);
        self
    }
}

/// A request to boot a confined guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// Guest working root (absolute guest path); file operations are confined to it.
    pub root: String,
    pub image: Image,
    pub guarantees: Guarantees,
    /// Run every command as this user (`NAME`, `UID`, `NAME:GROUP`, `UID:GID`) instead of
    /// the image's `User`; `None` = the image's, else root.
    #[serde(default)]
    pub user: Option<String>,
}

impl Spec {
    /// A spec rooted at [`DEFAULT_ROOT`].
    pub fn new(image: Image, guarantees: Guarantees) -> Self {
        Spec {
            root: DEFAULT_ROOT.to_string(),
            image,
            guarantees,
            user: None,
        }
    }

    /// Write each variable of [`Guarantees::default_guest_env`] that neither
    /// `Guarantees.env` nor the image's `Env` sets into `Guarantees.env` (so an image's own
    /// `PATH` is kept). The result is still the complete, explicit environment.
    pub fn with_default_env(mut self) -> Self {
        let image_env = &self.image.config.env;
        let missing: Vec<(String, String)> = Guarantees::default_guest_env()
            .into_iter()
            .filter(|(name, _)| {
                !self.guarantees.env.iter().any(|(n, _)| n == name)
                    && !image_env.iter().any(|(n, _)| n == name)
            })
            .collect();
        self.guarantees.env.splice(0..0, missing);
        self
    }
}
