//! Pulling from a registry with `oci-client`, without its `pull()` (which returns layers in
//! completion order and holds them in memory): the manifest (an index or manifest list is
//! resolved to linux/amd64), then the config, then each layer *in manifest order*, streamed
//! to a file in the build directory with its size bounded by the manifest and its digest
//! checked (by the client while streaming, and again while unpacking).
//!
//! Plain HTTP is used only for loopback registries (`127.0.0.0/8`, `localhost`, `[::1]`);
//! everything else is HTTPS.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use tokio::io::AsyncWrite;

use crate::digest::Digest;
use crate::manifest::{self, Descriptor, INDEX_TYPES, Index, MANIFEST_TYPES};
use crate::store::{Built, io_err};
use crate::{Auth, Error, Image, Reference, Store};

/// Whether `registry` (`host[:port]`) is a loopback address.
pub(crate) fn is_loopback(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.rsplit_once(':').map_or(registry, |(h, _)| h)
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn client_for(registry: &str) -> oci_client::Client {
    let protocol = if is_loopback(registry) {
        ClientProtocol::HttpsExcept(vec![registry.to_owned()])
    } else {
        ClientProtocol::Https
    };
    oci_client::Client::new(ClientConfig {
        protocol,
        platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
        connect_timeout: Some(Duration::from_secs(15)),
        read_timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    })
}

/// A file that refuses to grow past `max` bytes.
struct Bounded {
    file: tokio::fs::File,
    written: u64,
    max: u64,
}

impl AsyncWrite for Bounded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.written + buf.len() as u64 > self.max {
            let max = self.max;
            return Poll::Ready(Err(io::Error::other(format!(
                "the registry sent more than the {max} bytes the manifest says"
            ))));
        }
        let this = &mut *self;
        let r = Pin::new(&mut this.file).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            this.written += *n as u64;
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

struct Puller<'a> {
    store: &'a Store,
    client: oci_client::Client,
    auth: oci_client::secrets::RegistryAuth,
    reference: &'a Reference,
}

impl Puller<'_> {
    fn err(&self, what: String, source: Option<oci_client::errors::OciDistributionError>) -> Error {
        Error::Registry {
            registry: self.reference.registry().to_owned(),
            what,
            source,
        }
    }

    /// The manifest document `r` names, its digest and whether it is an index.
    async fn document(&self, r: &Reference) -> Result<(Vec<u8>, Digest, bool), Error> {
        let mut accepted: Vec<&str> = MANIFEST_TYPES.to_vec();
        accepted.extend(INDEX_TYPES);
        let (bytes, _) = self
            .client
            .pull_manifest_raw(r, &self.auth, &accepted)
            .await
            .map_err(|e| self.err(format!("fetching manifest {}", r.whole()), Some(e)))?;
        let max = self.store.limits().max_document_bytes;
        if bytes.len() as u64 > max {
            return Err(Error::Manifest(format!(
                "{} is over {max} bytes",
                r.whole()
            )));
        }
        let digest = Digest::of(&bytes);
        if let Some(want) = r.digest()
            && want != digest.as_str()
        {
            return Err(Error::Manifest(format!(
                "{} has digest {digest}, not the {want} asked for",
                r.whole()
            )));
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Kind {
            media_type: Option<String>,
            manifests: Option<serde_json::Value>,
        }
        let kind: Kind = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Manifest(format!("{}: {e}", r.whole())))?;
        let is_index = kind
            .media_type
            .as_deref()
            .map_or(kind.manifests.is_some(), |t| INDEX_TYPES.contains(&t));
        Ok((bytes.to_vec(), digest, is_index))
    }

    /// Streams the blob `d` names into `out` (at most `max` bytes), digest checked.
    async fn blob(&self, d: &Descriptor, out: &std::path::Path, max: u64) -> Result<u64, Error> {
        let digest = d.digest()?;
        let desc = OciDescriptor {
            media_type: d.media_type.clone(),
            digest: digest.to_string(),
            size: d.size,
            ..Default::default()
        };
        let file = tokio::fs::File::create(out)
            .await
            .map_err(io_err("creating", out))?;
        let mut sink = Bounded {
            file,
            written: 0,
            max,
        };
        let result = self
            .client
            .pull_blob(self.reference, &desc, &mut sink)
            .await;
        let want = d.size(max)?;
        let got = sink.written;
        // A short blob is reported as such, not as the digest error it also causes.
        if got < want && (result.is_ok() || got > 0) {
            return Err(self.err(
                format!("blob {digest} is {got} bytes, the manifest says {want}"),
                result.err(),
            ));
        }
        result.map_err(|e| self.err(format!("fetching blob {digest}"), Some(e)))?;
        Ok(sink.written)
    }
}

impl Store {
    /// The image `reference` names: from the store without any network when the reference
    /// carries a digest (or was pulled before by that digest), else [`Store::pull`].
    pub async fn resolve(&self, reference: &Reference, auth: &Auth) -> Result<Image, Error> {
        if reference.digest().is_some()
            && let Some(img) = self.get(&reference.whole())?
        {
            return Ok(img);
        }
        self.pull(reference, auth).await
    }

    /// What `--image WHAT` needs: the stored image `what` names (a digest, a unique digest
    /// prefix or a stored name) with no network; otherwise `what` is parsed as a reference and
    /// pulled, with credentials from the docker config.
    pub async fn get_or_pull(&self, what: &str) -> Result<Image, Error> {
        if let Some(img) = self.get(what)? {
            return Ok(img);
        }
        let reference: Reference = what.parse()?;
        let auth = Auth::from_docker_config(&reference)?;
        self.pull(&reference, &auth).await
    }

    /// Fetches `reference` from its registry (see the module docs) and stores it; an image
    /// whose manifest digest is already stored is not fetched again.
    pub async fn pull(&self, reference: &Reference, auth: &Auth) -> Result<Image, Error> {
        let p = Puller {
            store: self,
            client: client_for(reference.registry()),
            auth: auth.to_client(),
            reference,
        };
        let (mut bytes, mut digest, mut is_index) = p.document(reference).await?;
        for _ in 0..4 {
            if !is_index {
                break;
            }
            let index: Index = serde_json::from_slice(&bytes)
                .map_err(|e| Error::Manifest(format!("index: {e}")))?;
            let picked = manifest::pick(&index)?.digest()?;
            (bytes, digest, is_index) = p
                .document(&reference.clone_with_digest(picked.to_string()))
                .await?;
        }
        if is_index {
            return Err(Error::Manifest("indexes nested too deep".into()));
        }
        let names = vec![reference.whole()];
        if let Some(img) = self.existing(&digest, &names)? {
            return Ok(img);
        }
        let m = manifest::parse(&bytes, self.limits())?;
        let staging = self.staging()?;
        let blobs = staging.dir.path().join("blobs");
        std::fs::create_dir(&blobs).map_err(io_err("creating", &blobs))?;
        let config_path = blobs.join("config");
        let max_doc = self.limits().max_document_bytes;
        p.blob(&m.config, &config_path, m.config.size(max_doc)?)
            .await?;
        let config = std::fs::read(&config_path).map_err(io_err("reading", &config_path))?;
        for l in &m.layers {
            let d = l.digest()?;
            let want = l.size(self.limits().max_blob_bytes)?;
            let got = p.blob(l, &blobs.join(d.hex()), want).await?;
            if got != want {
                return Err(p.err(
                    format!("blob {d} is {got} bytes, the manifest says {want}"),
                    None,
                ));
            }
        }
        let (config, layers) = manifest::layers(&m, &config, |d| blobs.join(d.hex()))?;
        let built = Built {
            digest,
            config,
            layers,
            source: format!("pull {}", reference.whole()),
            names,
        };
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.finish(staging, built))
            .await
            .map_err(|e| Error::Io {
                what: "building",
                path: self.dir().to_path_buf(),
                source: io::Error::other(e.to_string()),
            })?
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_registries() {
        for r in [
            "127.0.0.1:5000",
            "localhost:5000",
            "[::1]:5000",
            "127.0.0.2",
            "localhost",
        ] {
            assert!(super::is_loopback(r), "{r}");
        }
        for r in [
            "docker.io",
            "10.0.0.1:5000",
            "example.com:443",
            "localhost.example.com",
        ] {
            assert!(!super::is_loopback(r), "{r}");
        }
    }
}
