//! Pull + convert of ~200 MB images from a local registry, and the second resolution of the
//! same digest (which must not fetch or convert anything).
//!
//! `cargo bench -p vm-oci --bench pull` measures two images, each pushed with skopeo to a
//! `docker-registry` started on 127.0.0.1:
//! - the Debian bookworm python3 + numpy userland that `images/oci-debian.sh` packs (one gzip
//!   layer, ~200 MB unpacked; reported as skipped when that script has not built it), or the
//!   OCI layout named by `VM_OCI_BENCH_LAYOUT=DIR:TAG` instead;
//! - a synthetic image (4 gzip layers, ~200 MB unpacked: a mix of compressible text and
//!   incompressible bytes in ~24k files).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::registry::Registry;
use common::{Layer, TestImage, cannot_convert, have};
use vm_oci::{Auth, Reference, Store};

/// Deterministic filler: `n` bytes from a small xorshift generator, half of them text.
fn filler(seed: u64, n: usize, text: bool) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if text {
            out.extend_from_slice(format!("line {} value {}\n", x % 1000, x % 97).as_bytes());
        } else {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out.truncate(n);
    out
}

fn synthetic() -> TestImage {
    let mut layers = Vec::new();
    for l in 0..4u64 {
        let mut layer = Layer::new().dir(&format!("l{l}/"), 0o755);
        for d in 0..60u64 {
            layer = layer.dir(&format!("l{l}/d{d}/"), 0o755);
            for f in 0..100u64 {
                let seed = l * 1_000_000 + d * 1000 + f;
                let size = 2000 + (seed % 13) as usize * 1300;
                layer = layer.file(&format!("l{l}/d{d}/f{f}"), &filler(seed, size, f % 2 == 0));
            }
        }
        layers.push(layer);
    }
    TestImage::new(&layers, serde_json::json!({"Env": ["PATH=/usr/bin:/bin"]}))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The real image: `VM_OCI_BENCH_LAYOUT=DIR:TAG`, else the Debian python layout when built.
fn real_layout() -> Result<(std::path::PathBuf, String), String> {
    let line = match std::env::var("VM_OCI_BENCH_LAYOUT") {
        Ok(v) => v,
        Err(_) => {
            let script =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/oci-debian.sh");
            let out = std::process::Command::new(script)
                .arg("--print-path")
                .output()
                .map_err(|e| format!("running images/oci-debian.sh: {e}"))?;
            if !out.status.success() {
                return Err(
                    "the Debian python OCI image is not built (images/oci-debian.sh)".into(),
                );
            }
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        }
    };
    let (d, t) = line
        .rsplit_once(':')
        .ok_or_else(|| format!("{line:?} is not DIR:TAG"))?;
    Ok((d.into(), t.to_owned()))
}

/// Push `layout:tag` as `name`, then time pull + convert, import + convert, and the cached
/// resolutions.
async fn measure(
    reg: &Registry,
    tmp: &std::path::Path,
    name: &str,
    layout: &std::path::Path,
    tag: &str,
) {
    println!("== {name}");
    reg.push(layout, tag, name, false);
    let r: Reference = format!("{}/{name}:{tag}", reg.addr).parse().unwrap();
    let store = Store::open(tmp.join(format!("store-{name}"))).unwrap();

    let t = Instant::now();
    let img = store.pull(&r, &Auth::Anonymous).await.unwrap();
    let first = t.elapsed();
    println!(
        "pull + convert: {first:.2?} -> erofs {:.1} MB ({})",
        img.size as f64 / 1e6,
        img.digest
    );

    // The same image from the layout on disk: unpack + mkfs.erofs without the registry.
    let local = Store::open(tmp.join(format!("store-import-{name}"))).unwrap();
    let t = Instant::now();
    local.import(layout).unwrap();
    println!(
        "import + convert of the same layout (no registry): {:.2?}",
        t.elapsed()
    );

    let by_digest: Reference = format!("{}/{name}@{}", reg.addr, img.digest)
        .parse()
        .unwrap();
    let mut again = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let same = store.resolve(&by_digest, &Auth::Anonymous).await.unwrap();
        again.push(t.elapsed());
        assert_eq!(same.erofs, img.erofs);
    }
    println!(
        "second resolution of the digest (store.resolve, 20 runs): median {:.2?}, max {:.2?}",
        median(again.clone()),
        again.iter().max().unwrap()
    );
    let mut by_tag = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        store.pull(&r, &Auth::Anonymous).await.unwrap();
        by_tag.push(t.elapsed());
    }
    println!(
        "pull by tag of a stored image (manifest fetch only, 5 runs): median {:.2?}",
        median(by_tag)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter("vm_oci=info")
        .with_target(false)
        .init();
    if let Some(why) = cannot_convert().or_else(|| {
        (!have("docker-registry") || !have("skopeo"))
            .then(|| "docker-registry or skopeo missing".into())
    }) {
        println!("SKIP bench pull: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let reg = Registry::start();
    match real_layout() {
        Ok((layout, tag)) => measure(&reg, tmp.path(), "python", &layout, &tag).await,
        Err(why) => println!("SKIP bench pull (python image): {why}"),
    }

    let t = Instant::now();
    let img = synthetic();
    let dir = tmp.path().join("layout");
    img.write_layout(&dir, "1");
    let blobs: usize = img.layers.iter().map(|(b, _)| b.len()).sum();
    let tars: usize = img.layers.iter().map(|(_, t)| t.len()).sum();
    println!(
        "synthetic image: {} layers, {:.1} MB compressed, {:.1} MB unpacked (built in {:.1?})",
        img.layers.len(),
        blobs as f64 / 1e6,
        tars as f64 / 1e6,
        t.elapsed()
    );
    measure(&reg, tmp.path(), "synthetic", &dir, "1").await;
}
