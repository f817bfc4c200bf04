//! Bounds on what an (untrusted) image may make the host do.

/// Caps applied while fetching and unpacking an image. Exceeding one stops the work with an
/// error naming the cap; nothing is left in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest single blob (compressed layer) fetched or read, in bytes.
    pub max_blob_bytes: u64,
    /// Largest manifest, index or config document, in bytes.
    pub max_document_bytes: u64,
    /// Most layers in one image.
    pub max_layers: usize,
    /// Most decompressed tar bytes over all layers (bounds the unpacked tree).
    pub max_unpacked_bytes: u64,
    /// Most tar entries over all layers.
    pub max_entries: u64,
    /// Largest decompressed/compressed ratio of a layer once past [`Limits::ratio_floor`].
    pub max_ratio: u64,
    /// Decompressed bytes of a layer before [`Limits::max_ratio`] applies.
    pub ratio_floor: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_blob_bytes: 8 << 30,
            max_document_bytes: 4 << 20,
            max_layers: 256,
            max_unpacked_bytes: 32 << 30,
            max_entries: 2_000_000,
            max_ratio: 100,
            ratio_floor: 64 << 20,
        }
    }
}
