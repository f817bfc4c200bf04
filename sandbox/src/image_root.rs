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
pub enum ImageRootError {
    #[error("invalid image reference {reference:?}")]
    Reference {
        reference: String,
        #[source]
        source: oci::ParseError,
    },
    #[error("reading registry credentials for {reference}")]
    Auth {
        reference: String,
        #[source]
        source: oci::AuthError,
    },
    #[error("resolving image {reference}")]
    Store {
        reference: String,
        #[source]
        source: oci::Error,
    },
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

/// Resolves `reference` in `store` and writes it into `spec`. What the store holds under that
/// name or digest is used without any network; otherwise the reference is pulled and
/// converted (credentials from the docker `config.json`).
pub async fn resolve_oci(
    store: &oci::Store,
    spec: &mut Spec,
    reference: &str,
) -> Result<ResolvedImage, ImageRootError> {
    let store_err = |source| ImageRootError::Store {
        reference: reference.to_string(),
        source,
    };
    let image = match store.get(reference).map_err(store_err)? {
        Some(image) => image,
        None => {
            let r: oci::Reference =
                reference
                    .parse()
                    .map_err(|source| ImageRootError::Reference {
                        reference: reference.to_string(),
                        source,
                    })?;
            let auth =
                oci::Auth::from_docker_config(&r).map_err(|source| ImageRootError::Auth {
                    reference: reference.to_string(),
                    source,
                })?;
            store.resolve(&r, &auth).await.map_err(store_err)?
        }
    };
    let resolved = ResolvedImage::from_oci(reference, &image);
    use_image(spec, resolved.clone());
    Ok(resolved)
}
