//! `vm images build|ls|prune|pull|import|rm`: guest image sets (kernel + initramfs) and OCI
//! images (root filesystems, through `vm_sandbox::oci`).

use std::path::PathBuf;

use anyhow::Context;

use vm_sandbox::oci;

use crate::args::ImagesCommand;
use crate::exit;
use crate::output::{Table, outln, print_json, print_table};

/// The source tree holding `images/build.sh`: `$VM_SOURCE_DIR`, else the tree this binary
/// was built from.
fn source_dir() -> PathBuf {
    match std::env::var_os("VM_SOURCE_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "K", "M", "G"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// Runs an images subcommand.
pub async fn run(cmd: ImagesCommand) -> anyhow::Result<u8> {
    match cmd {
        ImagesCommand::Build { args } => {
            let script = source_dir().join("images/build.sh");
            let script = script.canonicalize().unwrap_or(script);
            if !script.is_file() {
                return Err(exit::failed(format!(
                    "{} not found: set VM_SOURCE_DIR to the vm source tree",
                    script.display()
                )));
            }
            // The script's own output is the progress; it inherits our stdout/stderr.
            let status = tokio::process::Command::new("bash")
                .arg(&script)
                .args(&args)
                .status()
                .await
                .with_context(|| format!("running {}", script.display()))?;
            if !status.success() {
                return Err(exit::failed(format!(
                    "{} failed ({status})",
                    script.display()
                )));
            }
            Ok(exit::OK)
        }
        ImagesCommand::Ls { json } => {
            let list = vm_sandbox::images::list()?;
            let oci = oci_list()?;
            if json {
                let mut all = Vec::new();
                for e in &list {
                    all.push(tagged("set", serde_json::to_value(e)?));
                }
                for i in &oci {
                    all.push(tagged("oci", serde_json::to_value(i)?));
                }
                print_json(&serde_json::Value::Array(all))?;
            } else {
                let mut t = Table::new(&["HASH", "CURRENT", "SIZE", "PATH"]);
                for e in &list {
                    let cur = if e.current { "*" } else { "" };
                    t.row(vec![
                        e.hash.clone(),
                        cur.into(),
                        human(e.bytes),
                        e.path.display().to_string(),
                    ]);
                }
                print_table(&t)?;
                outln!();
                print_table(&oci_table(&oci))?;
            }
            Ok(exit::OK)
        }
        ImagesCommand::Prune => {
            // The library decides what an image set is; `current` and the build's own
            // directories are never touched.
            let mut removed = Vec::new();
            for e in vm_sandbox::images::prune(true)? {
                removed.push(format!("removed {} ({})", e.hash, human(e.bytes)));
            }
            if let Some(store) = oci_store(false)? {
                for i in store.prune()? {
                    removed.push(format!("removed {} ({})", i.digest, human(i.size)));
                }
            }
            for line in &removed {
                outln!("{line}");
            }
            if removed.is_empty() {
                outln!("nothing to prune");
            }
            Ok(exit::OK)
        }
        ImagesCommand::Pull { reference, json } => {
            let r: oci::Reference = reference
                .parse()
                .map_err(|e| exit::usage(format!("invalid image reference {reference:?}: {e}")))?;
            let store = oci_store(true)?.expect("created");
            let auth = oci::Auth::from_docker_config(&r)?;
            let image = store
                .pull(&r, &auth)
                .await
                .with_context(|| format!("pulling {}", r.whole()))?;
            show(&image, json)
        }
        ImagesCommand::Import { path, names, json } => {
            let mut refs = Vec::new();
            for n in &names {
                refs.push(
                    n.parse::<oci::Reference>()
                        .map_err(|e| exit::usage(format!("invalid --name {n:?}: {e}")))?,
                );
            }
            let store = oci_store(true)?.expect("created");
            let image = tokio::task::spawn_blocking(move || store.import_as(&path, &refs))
                .await
                .context("import task")??;
            show(&image, json)
        }
        ImagesCommand::Rm { images } => {
            let Some(store) = oci_store(false)? else {
                return Err(exit::failed(format!(
                    "no image {:?} in the store",
                    images[0]
                )));
            };
            for what in &images {
                let r = store.remove(what)?;
                for name in &r.refs {
                    outln!("untagged {name}");
                }
                if r.deleted {
                    outln!("deleted {} ({})", r.image.digest, human(r.image.size));
                }
            }
            Ok(exit::OK)
        }
    }
}

/// The OCI image store; `None` when it does not exist and `create` is false (so `ls` and
/// `prune` never create it).
fn oci_store(create: bool) -> anyhow::Result<Option<oci::Store>> {
    let dir = oci::default_dir().ok_or(oci::Error::NoDir)?;
    if !create && !dir.is_dir() {
        return Ok(None);
    }
    Ok(Some(oci::Store::open(dir)?))
}

fn oci_list() -> anyhow::Result<Vec<oci::Image>> {
    Ok(match oci_store(false)? {
        Some(s) => s.list()?,
        None => Vec::new(),
    })
}

fn tagged(kind: &str, mut v: serde_json::Value) -> serde_json::Value {
    if let Some(o) = v.as_object_mut() {
        o.insert("kind".into(), kind.into());
    }
    v
}

fn oci_table(images: &[oci::Image]) -> Table {
    let mut t = Table::new(&["DIGEST", "SIZE", "NAMES"]);
    for i in images {
        let names = if i.refs.is_empty() {
            "<none>".to_string()
        } else {
            i.refs.join(", ")
        };
        t.row(vec![i.digest.to_string(), human(i.size), names]);
    }
    t
}

/// Prints a pulled or imported image: a table line, or JSON.
fn show(image: &oci::Image, json: bool) -> anyhow::Result<u8> {
    if json {
        print_json(&serde_json::to_value(image)?)?;
    } else {
        print_table(&oci_table(std::slice::from_ref(image)))?;
        outln!("erofs: {}", image.erofs.display());
    }
    Ok(exit::OK)
}
