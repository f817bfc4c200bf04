//! `vm cp`: copy one file into or out of a running named VM by its absolute guest path
//! (`vm_sandbox::Guest::copy_in`/`copy_out`/`copy_out_to`): streamed in bounded chunks,
//! at most `--max-size` bytes, only regular files, the destination replaced only once complete.

use std::path::Path;

use anyhow::Context;
use vm_sandbox::agent::Plain;

use crate::args::CpArgs;
use crate::exit;
use crate::parse;
use crate::state::Runtime;
use crate::state::named::NamedVm;

/// `NAME:PATH` → (name, guest path relative to `/`), when `s` is a guest reference.
/// Anything with a `/` before the first `:` (or no `:`) is a host path.
fn guest_ref(s: &str) -> Option<(&str, &str)> {
    let (name, path) = s.split_once(':')?;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    Some((name, path))
}

/// Checks a `NAME:PATH` before anything is read or attached: a valid name and an absolute
/// guest path without `..` (the sandbox's rule, [`vm_sandbox::confine::absolute`]).
fn guest_path(name: &str, path: &str) -> anyhow::Result<String> {
    let name = parse::vm_name(name).map_err(|e| exit::usage(e.to_string()))?;
    vm_sandbox::confine::absolute(path).map_err(|e| exit::usage(format!("{name}:{path}: {e}")))?;
    Ok(name)
}

/// `vm cp SRC DST`.
pub async fn run(a: CpArgs) -> anyhow::Result<u8> {
    let rt = Runtime::from_env()?;
    // `vm cp` starts nothing: only the agent's socket and the host file.
    vm_sandbox::confine_reader()?;
    match (guest_ref(&a.src), guest_ref(&a.dst)) {
        (None, Some((name, path))) => {
            let name = guest_path(name, path)?;
            let vm = NamedVm::attach(&rt, &name)?;
            vm.copy_in(Path::new(&a.src), path, a.max_size)
                .await
                .with_context(|| format!("copying {} to {name}:{path}", a.src))?;
        }
        (Some((name, path)), None) => {
            let name = guest_path(name, path)?;
            let vm = NamedVm::attach(&rt, &name)?;
            let copied = if a.dst == "-" {
                let mut out = Plain(tokio::io::stdout());
                vm.copy_out_to(path, a.max_size, &mut out).await
            } else {
                vm.copy_out(path, Path::new(&a.dst), a.max_size).await
            };
            copied.with_context(|| format!("copying {name}:{path} to {}", a.dst))?;
        }
        (Some(_), Some(_)) => {
            return Err(exit::usage(
                "cannot copy between two VMs; copy through the host",
            ));
        }
        (None, None) => {
            return Err(exit::usage(
                "one of SRC and DST must be NAME:PATH (e.g. `vm cp ./f box:/tmp/f`)",
            ));
        }
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_refs() {
        assert_eq!(guest_ref("box:/tmp/x"), Some(("box", "/tmp/x")));
        assert_eq!(guest_ref("./a:b"), None);
        assert_eq!(guest_ref("/abs/file"), None);
        assert_eq!(guest_ref("file.txt"), None);
        assert_eq!(guest_ref(":x"), None);
        assert!(guest_path("box", "tmp/x").is_err());
        assert!(guest_path("box", "/tmp/../etc").is_err());
        assert!(guest_path("bad name", "/tmp/x").is_err());
        assert_eq!(guest_path("box", "/tmp//x").unwrap(), "box");
    }
}
