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
            // The library decides what an image set is; `current` and the build's own
            // directories are never touched.
            let removed = vm_sandbox::images::prune(true)?;
            for e in &removed {
                println!("removed {} ({})", e.hash, human(e.bytes));
            }
            if removed.is_empty() {
                println!("nothing to prune");
            }
            Ok(exit::OK)
        }
    }
}
