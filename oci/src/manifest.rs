//! The parts of OCI / Docker v2 schema 2 manifests and indexes an image needs, and the checks
//! on them shared by pull and import.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::Error;
use crate::config::{self, ImageConfig};
use crate::digest::Digest;
use crate::limits::Limits;
use crate::unpack::LayerSource;

/// The OCI index media type and Docker's manifest list.
pub(crate) const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// Image manifest media types.
pub(crate) const MANIFEST_TYPES: [&str; 2] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
const CONFIG_TYPES: [&str; 2] = [
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];
const LAYER_TYPES: [&str; 6] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

/// A content descriptor.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
}

/// An image index (or manifest list).
#[derive(Debug, Deserialize)]
pub(crate) struct Index {
    pub manifests: Vec<Descriptor>,
}

/// An image manifest.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Manifest {
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

fn bad(why: impl Into<String>) -> Error {
    Error::Manifest(why.into())
}

impl Descriptor {
    /// The digest, validated.
    pub(crate) fn digest(&self) -> Result<Digest, Error> {
        Ok(Digest::parse(&self.digest)?)
    }

    /// The size, which must be non-negative and at most `max`.
    pub(crate) fn size(&self, max: u64) -> Result<u64, Error> {
        let s = u64::try_from(self.size)
            .map_err(|_| bad(format!("{} has a negative size", self.digest)))?;
        if s > max {
            return Err(bad(format!(
                "{} is {s} bytes, over the {max}-byte limit",
                self.digest
            )));
        }
        Ok(s)
    }

    /// Whether this entry of an index is for linux/amd64 (an entry without a platform counts).
    pub(crate) fn is_linux_amd64(&self) -> bool {
        self.platform
            .as_ref()
            .is_none_or(|p| p.os == "linux" && p.architecture == "amd64")
    }
}

/// Picks the linux/amd64 image manifest (or nested index) from an index.
pub(crate) fn pick(index: &Index) -> Result<&Descriptor, Error> {
    index
        .manifests
        .iter()
        .find(|d| d.is_linux_amd64() && d.platform.is_some())
        .or_else(|| index.manifests.iter().find(|d| d.is_linux_amd64()))
        .ok_or_else(|| bad("the index has no linux/amd64 image"))
}

/// Parses a manifest document, checks its config and layer media types and counts.
pub(crate) fn parse(bytes: &[u8], limits: &Limits) -> Result<Manifest, Error> {
    let m: Manifest =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not an image manifest: {e}")))?;
    if let Some(t) = m.media_type.as_deref()
        && !MANIFEST_TYPES.contains(&t)
    {
        return Err(bad(format!("media type {t} is not an image manifest")));
    }
    if !CONFIG_TYPES.contains(&m.config.media_type.as_str()) {
        return Err(bad(format!(
            "config media type {:?} is not an image config",
            m.config.media_type
        )));
    }
    if m.layers.len() > limits.max_layers {
        return Err(bad(format!(
            "{} layers, over the limit of {}",
            m.layers.len(),
            limits.max_layers
        )));
    }
    for l in &m.layers {
        if !LAYER_TYPES.contains(&l.media_type.as_str()) {
            return Err(bad(format!(
                "layer {} has media type {:?}, not a filesystem layer",
                l.digest, l.media_type
            )));
        }
        l.digest()?;
        l.size(limits.max_blob_bytes)?;
    }
    Ok(m)
}

/// The config's process defaults, and the layers to apply, each with the blob file `blob`
/// gives for its digest.
pub(crate) fn layers(
    m: &Manifest,
    config_bytes: &[u8],
    blob: impl Fn(&Digest) -> PathBuf,
) -> Result<(ImageConfig, Vec<LayerSource>), Error> {
    let parsed = config::parse(config_bytes)?;
    if !parsed.diff_ids.is_empty() && parsed.diff_ids.len() != m.layers.len() {
        return Err(bad(format!(
            "{} layers but the config lists {} diff IDs",
            m.layers.len(),
            parsed.diff_ids.len()
        )));
    }
    let mut out = Vec::new();
    for (i, l) in m.layers.iter().enumerate() {
        let d = l.digest()?;
        out.push(LayerSource {
            path: blob(&d),
            digest: Some(d),
            size: Some(l.size(u64::MAX)?),
            diff_id: parsed.diff_ids.get(i).cloned(),
        });
    }
    Ok((parsed.config, out))
}
