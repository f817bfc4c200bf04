//! Image roots from the OCI store (`--image REF`).
//!
//! [`resolve_oci`] asks a [`crate::oci::Store`] for a reference (`name:tag` or
//! `name@sha256:…`; from the store without any network when it holds the digest, else pulled
//! and converted) and [`use_image`] writes the result into a [`Spec`]: `image.rootfs` = the
//! read-only erofs file, `image.config` = the image config's defaults, and `image.source` =
//! the reference with the manifest digest actually booted, so the spec (and `--dry-run`)
//! records what ran. Validation then treats the root like any `--rootfs` file.

use std::path::PathBuf;

use thiserror::Error;
use vm_spec::{ImageConfig, ImageSource, Spec};

use crate::oci;

/// A resolved image, as the spec needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    /// The reference as asked for.
    pub reference: String,
    /// The manifest digest it resolved to (`sha256:<64 hex>`).
    pub digest: String,
    /// The read-only erofs image of its flattened layers.
    pub rootfs: PathBuf,
    /// The image config's Env, WorkingDir, User, Entrypoint and Cmd.
    pub config: ImageConfig,
}

impl ResolvedImage {
    /// The spec's view of a store image found for `reference`.
    pub fn from_oci(reference: &str, image: &oci::Image) -> ResolvedImage {
        let c = &image.config;
        ResolvedImage {
            reference: reference.to_string(),
            digest: image.digest.to_string(),
            rootfs: image.erofs.clone(),
            config: ImageConfig {
                env: c.env.clone(),
                working_dir: c.working_dir.clone(),
                user: c.user.clone(),
                entrypoint: c.entrypoint.clone(),
                cmd: c.cmd.clone(),
            },
        }
    }
}

/// Why an image reference could not be resolved.
#[derive(Debug, Error)]
#[error("resolving image {reference}")]
pub struct ImageRootError {
    pub reference: String,
    #[source]
    pub source: oci::Error,
}

impl ImageRootError {
    /// The reference itself is malformed (a usage error, not a store or registry failure).
    pub fn is_bad_reference(&self) -> bool {
        matches!(self.source, oci::Error::Reference(_))
    }
}

/// Writes `image` into `spec` as its root, defaults and recorded source.
pub fn use_image(spec: &mut Spec, image: ResolvedImage) {
    spec.image.rootfs = Some(image.rootfs);
    spec.image.config = image.config;
    spec.image.source = Some(ImageSource {
        reference: image.reference,
        digest: image.digest,
    });
}

/// Resolves `reference` in `store` ([`oci::Store::get_or_pull`]: what the store holds under
/// that name or digest without any network, else pulled and converted with the docker
/// `config.json` credentials) and writes it into `spec`.
pub async fn resolve_oci(
    store: &oci::Store,
    spec: &mut Spec,
    reference: &str,
) -> Result<ResolvedImage, ImageRootError> {
    let image = store
        .get_or_pull(reference)
        .await
        .map_err(|source| ImageRootError {
            reference: reference.to_string(),
            source,
        })?;
    let resolved = ResolvedImage::from_oci(reference, &image);
    use_image(spec, resolved.clone());
    Ok(resolved)
}
