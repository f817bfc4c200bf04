//! Helpers shared by the CLI integration tests: run the built `vm` binary with an isolated
//! runtime directory, and the skip convention.

#![allow(dead_code)]

pub mod copy;
pub mod http;
pub mod llama;
pub mod tty;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The built binary.
pub fn vm_bin() -> &'static str {
    env!("CARGO_BIN_EXE_vm")
}

/// A sandboxed environment for one test: its own runtime directory and fake image files.
pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("rt")).unwrap();
        std::fs::write(dir.path().join("kernel"), b"not a kernel").unwrap();
        std::fs::write(dir.path().join("initrd"), b"not an initrd").unwrap();
        Env { dir }
    }

    pub fn runtime(&self) -> PathBuf {
        self.dir.path().join("rt")
    }

    /// `--kernel K --initrd I` pointing at placeholder files (enough for --dry-run).
    pub fn image_args(&self) -> Vec<String> {
        vec![
            "--kernel".into(),
            self.dir.path().join("kernel").display().to_string(),
            "--initrd".into(),
            self.dir.path().join("initrd").display().to_string(),
        ]
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(vm_bin());
        c.env("VM_RUNTIME_DIR", self.runtime())
            .env_remove("RUST_LOG");
        c
    }

    pub fn run<S: AsRef<str>>(&self, args: &[S]) -> Out {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        Out::from(self.cmd().args(&args).output().expect("running vm"))
    }

    /// [`Env::run`] with the OCI image store in this test's directory (`VM_OCI_DIR`).
    pub fn run_with_store(&self, args: &[&str]) -> Out {
        Out::from(
            self.cmd()
                .env("VM_OCI_DIR", self.dir.path().join("oci"))
                .args(args)
                .output()
                .expect("running vm"),
        )
    }
}

/// A finished run.
pub use vm_test_support::Out;

/// The skip convention: `SKIP <name>: <reason>` on stderr and appended to `$VM_TEST_SKIP_LOG`.
#[allow(unused_imports)] // not every test binary that includes this module skips
pub use vm_test_support::skip;

/// `vm drivers --json` as (name -> (available, containment, reason)).
pub fn drivers(env: &Env) -> Vec<(String, bool, String, String)> {
    let out = env.run(&["drivers", "--json"]);
    assert_eq!(out.code, 0, "vm drivers failed: {}", out.stderr);
    out.json()
        .as_array()
        .expect("array")
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_string(),
                d["available"].as_bool().unwrap(),
                d["containment"].as_str().unwrap().to_string(),
                d["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub fn tcg_available(env: &Env) -> bool {
    drivers(env).iter().any(|(n, ok, _, _)| n == "tcg" && *ok)
}

/// This host's /dev/kvm is kvm_pvm in native mode (see ENVIRONMENT.md).
pub fn pvm_native_host() -> bool {
    std::fs::read_to_string("/sys/module/kvm_pvm/parameters/pvm_native")
        .map(|s| s.trim() == "Y")
        .unwrap_or(false)
}

/// The built-in image directory (`<images dir>/current`), when its files exist.
pub fn built_images() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = var("VM_IMAGES_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("vm/images")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/vm/images")))?
        .join("current");
    let complete = ["vmlinux", "bzImage", "initramfs.cpio"]
        .iter()
        .all(|f| dir.join(f).is_file());
    complete.then_some(dir)
}

/// Why a guest cannot be booted here (no built guest images, or no tcg driver), if it cannot.
pub fn guest_unavailable(env: &Env) -> Option<String> {
    if built_images().is_none() {
        return Some(
            "guest images are not built (<images dir>/current/; run `vm images build`)".into(),
        );
    }
    (!tcg_available(env)).then(|| "the tcg driver is not available".into())
}

/// For a test that boots a guest: true when none can boot here, after applying the no-driver
/// rule (a failure, or a counted skip under `VM_TEST_ALLOW_NO_DRIVER=1`); the test then returns.
pub fn no_guest_here(env: &Env, test: &str) -> bool {
    let why = guest_unavailable(env);
    if let Some(why) = &why {
        vm_test_support::no_guest_driver(test, why);
    }
    why.is_some()
}

/// Is a process with this pid alive (not a zombie)?
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next().map(|st| st != "Z"))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Every file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.clone());
            if p.is_dir() {
                out.extend(files_under(&p));
            }
        }
    }
    out
}

/// Stops a `vm` child process when a test ends, even by panic: SIGINT (the clean path),
/// then SIGKILL after 20 s; always reaped.
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !matches!(self.0.try_wait(), Ok(None)) {
            return;
        }
        // Our own unreaped child.
        let _ = vm_sys::control::signal(self.0.id(), vm_sys::control::Signal::Interrupt);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes a named VM (`vm rm -f NAME`) when a test ends, even by panic.
pub struct VmGuard<'a> {
    pub env: &'a Env,
    pub name: &'static str,
}

impl Drop for VmGuard<'_> {
    fn drop(&mut self) {
        let _ = self.env.cmd().args(["rm", "-f", self.name]).output();
    }
}

/// Every live descendant of `pid` (children, grandchildren, …), from `/proc/*/stat`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // Fields after the command name: state, ppid, …
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.push((child, ppid));
            }
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found.retain(|p| pid_alive(*p));
    found
}
