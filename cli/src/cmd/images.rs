//! `vm images build|ls|prune`.

use std::path::PathBuf;

use anyhow::Context;

use crate::args::ImagesCommand;
use crate::exit;
use crate::output::{Table, print_json, print_table};

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

/// The built image sets: entries of `vm_sandbox::images::list` that are complete image
/// directories (a `manifest.json`, not a hidden build directory). `list` also returns
/// build.sh's own `kernels/`, `logs/` and `.tmp.*` directories.
fn image_sets() -> anyhow::Result<Vec<vm_sandbox::images::ImageEntry>> {
    Ok(vm_sandbox::images::list()?
        .into_iter()
        .filter(|e| !e.hash.starts_with('.') && e.path.join("manifest.json").is_file())
        .collect())
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
            let list = image_sets()?;
            if json {
                print_json(&serde_json::to_value(&list)?)?;
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
            }
            Ok(exit::OK)
        }
        ImagesCommand::Prune => {
            // Not `vm_sandbox::images::prune`: it treats every directory as an image set,
            // including build.sh's `kernels/`, `logs/` and in-progress `.tmp.*` (reported).
            let mut removed = Vec::new();
            for e in image_sets()?.into_iter().filter(|e| !e.current) {
                std::fs::remove_dir_all(&e.path)
                    .with_context(|| format!("removing {}", e.path.display()))?;
                println!("removed {} ({})", e.hash, human(e.bytes));
                removed.push(e);
            }
            if removed.is_empty() {
                println!("nothing to prune");
            }
            Ok(exit::OK)
        }
    }
}
