//! [`Request`]: what a caller asks of a VM to boot — the CLI's flags, the Python SDK's keyword
//! arguments — turned into a [`Spec`] one way for every caller. Nothing is decided here:
//! validation is `vm-spec`'s, admission and selection [`crate::MicroVm`]'s, so a forbidden
//! value (a writable mount, memory 0, a secret-looking variable) passes through unchanged and
//! is refused there, before anything boots.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use vm_spec::{Guarantees, Image, ImageConfig, ImageDigests, Limits, Mount, Spec};

use crate::image_root::{ImageRootError, resolve_oci};
use crate::images::{ImageError, default_spec_image};
use crate::oci;

/// Guest memory when none is asked for (MiB).
pub const DEFAULT_MEM_MIB: i64 = 256;
/// Process limit when none is asked for.
pub const DEFAULT_PIDS: i64 = 256;

/// The values a caller gives for a VM; `None`/empty means the default.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Guest memory in MiB ([`DEFAULT_MEM_MIB`]).
    pub memory_mib: Option<i64>,
    /// Virtual CPUs (one).
    pub cpus: Option<i64>,
    /// Process limit in the guest ([`DEFAULT_PIDS`]).
    pub pids: Option<i64>,
    /// The VM's wall lifetime (none: the caller closes it).
    pub timeout: Option<Duration>,
    /// Host paths shown in the guest (validation refuses any that is not read-only).
    pub mounts: Vec<Mount>,
    /// The guest environment, as given (over an image's `Env`).
    pub env: Vec<(String, String)>,
    /// Names in `env` allowed to look like secrets.
    pub env_allow: Vec<String>,
    /// Credential locations allowed as mounts.
    pub mount_secret_allow: Vec<PathBuf>,
    /// A kernel replacing the built image's.
    pub kernel: Option<PathBuf>,
    /// An initramfs (holding the agent) replacing the built image's.
    pub initrd: Option<PathBuf>,
    /// A root filesystem file (erofs or ext4).
    pub rootfs: Option<PathBuf>,
    /// An OCI image reference, resolved through the default store by [`Request::resolve`].
    pub image: Option<String>,
    /// The user every process runs as (over the image's `User`).
    pub user: Option<String>,
}

/// No guest image to boot: none built and no kernel and initramfs given.
#[derive(Debug, Error)]
#[error("no built guest image (run `vm images build`, or give a kernel and an initrd)")]
pub struct NoImage(#[source] pub ImageError);

/// Why a [`Request`] could not become a spec.
#[derive(Debug, Error)]
pub enum RequestError {
    /// Shown as the cause's own text (the chain skips the repeat), which stays in the chain.
    #[error("{0}")]
    NoImage(#[from] NoImage),
    #[error(transparent)]
    Store(#[from] oci::Error),
    /// Shown as the cause's own text (the chain skips the repeat), so a caller can still
    /// find the [`ImageRootError`] in the chain.
    #[error("{0}")]
    ImageRoot(#[source] ImageRootError),
}

impl Request {
    /// The image to boot: the built-in image (`<images dir>/current/`) with the kernel,
    /// initramfs and root filesystem asked for replacing its parts. With both a kernel and an
    /// initramfs the built-in image is not needed.
    pub fn image(&self) -> Result<Image, NoImage> {
        let mut image = match (&self.kernel, &self.initrd) {
            (Some(kernel), Some(initrd)) => Image {
                kernel: kernel.clone(),
                bz_image: None,
                initrd: Some(initrd.clone()),
                rootfs: None,
                digests: ImageDigests::default(),
                config: ImageConfig::default(),
                source: None,
            },
            _ => default_spec_image().map_err(NoImage)?,
        };
        if let Some(kernel) = &self.kernel {
            image.kernel = kernel.clone();
            image.bz_image = None;
        }
        if let Some(initrd) = &self.initrd {
            image.initrd = Some(initrd.clone());
        }
        image.rootfs = self.rootfs.clone();
        Ok(image)
    }

    /// The spec, without the OCI image and the default environment ([`Request::resolve`]
    /// adds both).
    pub fn spec(&self) -> Result<Spec, NoImage> {
        let limits = Limits {
            vcpus: self.cpus.unwrap_or(1),
            mem_mib: self.memory_mib.unwrap_or(DEFAULT_MEM_MIB),
            pids: self.pids.unwrap_or(DEFAULT_PIDS),
            wall: self.timeout,
        };
        let guarantees = Guarantees {
            egress_denied: true,
            limits,
            mounts: self.mounts.clone(),
            env: self.env.clone(),
            env_allow: self.env_allow.clone(),
            mount_secret_allow: self.mount_secret_allow.clone(),
        };
        let mut spec = Spec::new(self.image()?, guarantees);
        spec.user = self.user.clone();
        Ok(spec)
    }

    /// The whole spec: [`Request::spec`], the OCI image resolved in the default store
    /// (pulled when missing, so the spec records the digest it boots), then `vm-spec`'s
    /// default guest environment where neither the request nor the image sets it.
    pub async fn resolve(&self) -> Result<Spec, RequestError> {
        let mut spec = self.spec()?;
        if let Some(reference) = &self.image {
            let dir = oci::default_dir().ok_or(oci::Error::NoDir)?;
            let store = oci::Store::open(dir)?;
            resolve_oci(&store, &mut spec, reference)
                .await
                .map_err(RequestError::ImageRoot)?;
        }
        Ok(spec.with_default_env())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explicit_image() -> Request {
        Request {
            kernel: Some("/k".into()),
            initrd: Some("/i".into()),
            ..Request::default()
        }
    }

    #[test]
    fn defaults_and_values_reach_the_spec_unjudged() {
        let spec = explicit_image().spec().unwrap();
        let l = &spec.guarantees.limits;
        assert_eq!(
            (l.vcpus, l.mem_mib, l.pids),
            (1, DEFAULT_MEM_MIB, DEFAULT_PIDS)
        );
        assert_eq!(l.wall, None);
        assert!(spec.guarantees.egress_denied);
        let writable = Mount {
            host_path: "/srv".into(),
            guest_path: "/srv".into(),
            read_only: false,
            via: vm_spec::MountVia::Share,
        };
        let r = Request {
            memory_mib: Some(0),
            mounts: vec![writable.clone()],
            env: vec![("API_TOKEN".into(), "x".into())],
            user: Some("1000".into()),
            ..explicit_image()
        };
        let spec = r.spec().unwrap();
        assert_eq!(
            spec.guarantees.limits.mem_mib, 0,
            "refused by validation, not here"
        );
        assert_eq!(spec.guarantees.mounts, vec![writable]);
        assert_eq!(spec.user.as_deref(), Some("1000"));
        assert!(spec.validate().is_err());
        assert_eq!(spec.image.kernel, PathBuf::from("/k"));
        assert_eq!(spec.image.initrd, Some(PathBuf::from("/i")));
    }

    /// The refusal's own error stays in the chain, where callers classify it.
    #[test]
    fn errors_keep_their_cause_in_the_chain() {
        use std::error::Error;
        let e = RequestError::from(NoImage(ImageError::NoDir));
        assert!(e.source().is_some_and(|c| c.is::<NoImage>()));
        assert!(e.to_string().starts_with("no built guest image"));
    }
}
