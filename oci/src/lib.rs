//! `vm-oci`: OCI images as guest root filesystems.
//!
//! An image comes from a registry ([`Store::pull`]: `name:tag` or `name@sha256:…`, manifest
//! lists resolved to linux/amd64, OCI and Docker v2 schema 2 manifests, plain HTTP only for
//! loopback registries, credentials from the docker `config.json`) or from a local file
//! ([`Store::import`]: an OCI image layout directory, an `oci-archive` tarball or a
//! `docker save` tarball). Its layers are applied in order with OCI semantics into a temporary
//! tree, which becomes one uncompressed read-only erofs file cached by manifest digest
//! ([`Image::erofs`]), with the config's process defaults alongside ([`ImageConfig`]).
//!
//! Images are untrusted input: blobs are checked against their digests and sizes (and the
//! uncompressed layers against the config's diff IDs), unpacking never writes outside its tree
//! and runs with reduced capabilities, device nodes and setuid/setgid bits are dropped, and
//! total size, entry count and decompression ratio are capped ([`Limits`]). A failure leaves
//! nothing in the store. See [`store`] for the layout on disk.
//!
//! ```no_run
//! # async fn demo() -> Result<(), vm_oci::Error> {
//! use vm_oci::{Auth, Reference, Store};
//! let store = Store::open_default()?;
//! let r: Reference = "127.0.0.1:5000/python:3".parse()?;
//! let image = store.pull(&r, &Auth::from_docker_config(&r)?).await?;
//! println!("{} {} bytes at {}", image.digest, image.size, image.erofs.display());
//! let again = store.get(image.digest.as_str())?; // no network
//! let for_boot = store.get_or_pull("127.0.0.1:5000/python:3").await?; // stored, else pulled
//! # let _ = again; Ok(()) }
//! ```

mod auth;
pub mod config;
pub mod digest;
mod erofs;
mod import;
mod limits;
mod manifest;
mod pull;
pub mod store;
mod sys;
mod unpack;

use std::path::PathBuf;

use thiserror::Error;

pub use auth::{Auth, AuthError};
pub use config::{ConfigError, ImageConfig};
pub use digest::{Digest, DigestError};
pub use erofs::{
    ErofsError, Owners as ErofsOwners, build as build_erofs, build_with as build_erofs_with,
};
pub use limits::Limits;
pub use oci_client::{ParseError, Reference};
pub use store::{Image, Removed, Store, default_dir};
pub use unpack::{UnpackError, UnpackStats};

/// Why an image could not be fetched, imported or managed.
#[derive(Debug, Error)]
pub enum Error {
    #[error("no image store directory: set VM_OCI_DIR, VM_IMAGES_DIR, XDG_CACHE_HOME or HOME")]
    NoDir,
    #[error("{what} {}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is corrupt: {why}", .path.display())]
    Corrupt { path: PathBuf, why: String },
    #[error("no image {0:?} in the store")]
    NotFound(String),
    #[error("{0:?} matches more than one image: give more of the digest")]
    Ambiguous(String),
    #[error("invalid image reference")]
    Reference(#[from] ParseError),
    #[error("manifest: {0}")]
    Manifest(String),
    #[error("{} is not an image: {why}", .path.display())]
    NotAnImage { path: PathBuf, why: String },
    #[error("registry {registry}: {what}")]
    Registry {
        registry: String,
        what: String,
        #[source]
        source: Option<oci_client::errors::OciDistributionError>,
    },
    #[error(transparent)]
    Digest(#[from] DigestError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Unpack(#[from] UnpackError),
    #[error(transparent)]
    Erofs(#[from] ErofsError),
    #[error(transparent)]
    Auth(#[from] AuthError),
}
