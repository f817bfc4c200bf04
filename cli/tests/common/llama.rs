//! The llama.cpp model server for the CLI tests and the serve benchmark: the artefacts that
//! `images/llama-server.sh` builds (a static `llama-server`, its OCI image, the tiny GGUF model
//! and the venv with the `openai` client), importing the image, starting `vm serve` with it,
//! and waiting for `/health` (through `common::http`).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Env;

/// The name the tests import the image under (in their own OCI store).
pub const IMAGE: &str = "vm.local/llama-server:test";
/// The port llama-server listens on in the guest.
pub const GUEST_PORT: u16 = 8080;

/// What `images/llama-server.sh` built.
pub struct Artifacts {
    /// The OCI image layout.
    pub oci: PathBuf,
    /// The models directory (holds `tiny.gguf`), mounted read-only at /models.
    pub models: PathBuf,
    /// The venv's python (with `openai`).
    pub python: PathBuf,
    /// The same static llama-server on the host (for the benchmark's direct runs).
    pub server: PathBuf,
    /// The model's sha256 as built.
    pub model_sha256: String,
    /// The vocabulary GGUF the models' tokenizer comes from (in the llama.cpp build).
    pub vocabulary: PathBuf,
}

/// The built artefacts, or `Err(reason)` when `images/llama-server.sh` has not built them on
/// this host (ci/setup-tests.sh does).
pub fn artifacts() -> Result<Artifacts, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../images/llama-server.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--print-path")
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(
            "the llama.cpp image is not built (images/llama-server.sh, which \
                    ci/setup-tests.sh runs)"
                .into(),
        );
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("manifest.json")).map_err(|e| format!("manifest.json: {e}"))?,
    )
    .map_err(|e| format!("manifest.json: {e}"))?;
    let field = |v: &serde_json::Value| v.as_str().map(str::to_string).ok_or("manifest field");
    let server = PathBuf::from(field(&manifest["server"])?);
    // The build's layout: <build>/bin/llama-server and <build>/models/<vocabulary>.
    let build = server
        .parent()
        .and_then(Path::parent)
        .ok_or("the server's path")?;
    Ok(Artifacts {
        oci: dir.join("oci"),
        models: dir.join("models"),
        python: dir.join("python"),
        vocabulary: build
            .join("models")
            .join(field(&manifest["model"]["vocabulary"])?),
        server,
        model_sha256: field(&manifest["model"]["sha256"])?,
    })
}

/// sha256 of a file, hex (streamed: a model may be larger than memory would like).
pub fn sha256_file(path: &Path) -> String {
    use sha2::Digest;
    let mut f = std::fs::File::open(path).expect("opening the model");
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h).expect("reading the model");
    hex::encode(h.finalize())
}

/// A `vm` command in the test's environment with its own OCI store.
pub fn vm_cmd(env: &Env) -> Command {
    let mut c = env.cmd();
    c.env("VM_OCI_DIR", env.dir.path().join("oci"));
    c
}

/// Imports the image layout into the test's store as [`IMAGE`].
pub fn import(env: &Env, art: &Artifacts) {
    let out = vm_cmd(env)
        .args(["images", "import"])
        .arg(&art.oci)
        .args(["--name", IMAGE])
        .output()
        .expect("running vm images import");
    assert!(
        out.status.success(),
        "vm images import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `vm serve` arguments for the model server: the image, the models read-only at
/// /models (and `extra` options), a published ephemeral port, and the server's command line.
pub fn serve_args(art: &Artifacts, extra: &[String]) -> Vec<String> {
    let mount = format!("{}:/models:ro", art.models.display());
    let head = ["serve", "--allow-emulation", "--image", IMAGE, "-v", &mount];
    let mut args: Vec<String> = head.iter().map(|s| s.to_string()).collect();
    args.extend(extra.iter().cloned());
    args.extend(
        [
            "-p",
            "0:8080",
            "--",
            "llama-server",
            "-m",
            "/models/tiny.gguf",
            "--host",
            "127.0.0.1",
            "--port",
            "8080",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args
}

/// Starts `vm serve` (stdout piped) and returns it with the address it published (its first
/// stdout line, the URL `http://IP:PORT` printed once ready).
pub fn spawn_serve(env: &Env, args: &[String]) -> (super::ChildGuard, SocketAddr) {
    let mut child = super::ChildGuard(
        vm_cmd(env)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning vm serve"),
    );
    let addr = published_addr(&mut child.0);
    (child, addr)
}

fn published_addr(child: &mut Child) -> SocketAddr {
    let mut reader = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .expect("reading vm serve's stdout");
    if line.trim().is_empty() {
        let mut err = String::new();
        if let Some(e) = child.stderr.as_mut() {
            let _ = e.read_to_string(&mut err);
        }
        panic!("vm serve printed no URL; stderr: {err}");
    }
    let addr = super::http::url_addr(&line);
    assert!(addr.ip().is_loopback(), "{addr}");
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    addr
}

/// Polls `GET /health` until it answers 200 (the model is loaded) or `limit` passes; returns
/// how long it took, or the last answer or error.
pub fn wait_healthy(addr: SocketAddr, limit: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    loop {
        let last = match super::http::get(addr, "/health") {
            Ok(r) if r.status == 200 => return Ok(start.elapsed()),
            Ok(r) => format!("{} {}", r.status, r.body),
            Err(e) => e.to_string(),
        };
        if start.elapsed() > limit {
            return Err(format!("/health not 200 after {limit:?}: {last}"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A greedy completion request body for `POST /v1/completions`.
pub fn completion_body(max_tokens: u32) -> String {
    serde_json::json!({
        "model": "tiny", "prompt": "Once upon a time", "max_tokens": max_tokens,
        "temperature": 0
    })
    .to_string()
}

/// Runs the `openai` client script (tests/llama/openai_client.py: a chat completion, a
/// streamed completion and the same completion unstreamed, greedy) against `addr`; its JSON
/// reply.
pub fn openai_client(art: &Artifacts, addr: SocketAddr, max_tokens: u32) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/llama/openai_client.py");
    let out = Command::new(&art.python)
        .arg(script)
        .arg(format!("http://{addr}"))
        .arg(max_tokens.to_string())
        .output()
        .expect("running the openai client");
    assert!(
        out.status.success(),
        "openai client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "client output ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A directory holding a static busybox, for a test to mount read-only at /probe beside the
/// image (which has no tools of its own) and look beside the server through [`busybox`].
pub fn probe_dir(env: &Env) -> PathBuf {
    let probe = env.dir.path().join("probe");
    std::fs::create_dir(&probe).unwrap();
    std::fs::copy("/bin/busybox", probe.join("busybox")).expect("/bin/busybox (busybox-static)");
    probe
}

/// `vm exec NAME -- /probe/busybox ARGS…` (a static busybox the test mounted at /probe: the
/// image has no tools of its own); its stdout (it must succeed).
pub fn busybox(env: &Env, name: &str, args: &[&str]) -> String {
    let mut argv = vec!["exec", name, "--", "/probe/busybox"];
    argv.extend_from_slice(args);
    let out = env.run(&argv);
    assert_eq!(out.code, 0, "{argv:?}: {}", out.stderr);
    out.stdout
}
