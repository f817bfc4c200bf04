//! Image roots from an image store: the seam between `--image REF` and the OCI store.
//!
//! A store (the `vm-oci` crate, being built separately) turns a reference (`name:tag` or
//! `name@sha256:…`) into a [`ResolvedImage`]: the manifest digest it resolved, the read-only
//! erofs file of the flattened layers, and the image config's defaults. [`use_image`] writes
//! one into a [`Spec`]: `image.rootfs` = the erofs file, `image.config` = the defaults, and
//! `image.source` = the reference with the digest actually booted, so the spec (and
//! `--dry-run`) records what ran. Validation then treats it like any `--rootfs` file.
//!
//! The CLI has no `--image` flag yet: it comes with the store, which implements
//! [`ImageResolver`]; nothing here pretends to resolve a reference.

use std::path::PathBuf;

use vm_spec::{ImageConfig, ImageSource, Spec};

/// What an image store returns for a reference.
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

/// An image store: resolves (pulling and converting when needed) a reference.
pub trait ImageResolver {
    type Error: std::error::Error + Send + Sync + 'static;
    fn resolve(&self, reference: &str) -> Result<ResolvedImage, Self::Error>;
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

/// Resolves `reference` with `resolver` and writes the result into `spec`.
pub fn resolve_into<R: ImageResolver>(
    resolver: &R,
    spec: &mut Spec,
    reference: &str,
) -> Result<(), R::Error> {
    let image = resolver.resolve(reference)?;
    use_image(spec, image);
    Ok(())
}
