//! The model path at a model's size (issue 40): a GGUF of more than 1 GiB, written by the
//! `gguf` package with random weights (images/llama/make-tiny-gguf.py `--min-bytes`, its
//! feed-forward layers grown so every token reads every weight), mounted as **one file**
//! (`-v MODEL:/models/big.gguf:ro`, a regular file of the host's size, no copy, no image) into
//! the llama.cpp image, served by `llama-server` as the image's non-root user (uid 1000) and
//! answering the official `openai` client. Beside it, the guest sees the file with the host's
//! size and mode, and it cannot be written; on the host its sha256 is unchanged. Slow tier: a
//! 1 GiB model under tcg.

mod common;

use std::time::Instant;

use common::Env;
use common::llama::{self, Artifacts};
use vm_test_support::no_guest_driver;

const TEST: &str = "a_gguf_over_1_gib_mounted_as_one_file_answers_the_openai_client";
const NAME: &str = "llm-large";
/// More than 1 GiB.
const MIN_BYTES: u64 = (1 << 30) + (64 << 20);
/// Guest memory: the model's pages (llama.cpp maps the file) and the server.
const MEMORY: &str = "2G";
/// Tokens per completion: each reads the whole model under tcg.
const MAX_TOKENS: u32 = 2;

#[test]
#[ignore = "slow tier: a 1 GiB model served under tcg"]
fn a_gguf_over_1_gib_mounted_as_one_file_answers_the_openai_client() {
    let env = Env::new();
    if let Some(why) = common::guest_unavailable(&env) {
        return no_guest_driver(TEST, &why);
    }
    let art = match llama::artifacts() {
        Ok(a) => a,
        Err(why) => return common::skip(TEST, &why),
    };
    let model = env.dir.path().join("big.gguf");
    let started = Instant::now();
    generate(&art, &model);
    let size = std::fs::metadata(&model).unwrap().len();
    assert!(size >= MIN_BYTES, "{size} bytes");
    let sha = llama::sha256_file(&model);
    eprintln!("{TEST}: {size} bytes written in {:?}", started.elapsed());
    llama::import(&env, &art);
    let probe = llama::probe_dir(&env);
    let _cleanup = common::VmGuard {
        env: &env,
        name: NAME,
    };
    let mount = format!("{}:/models/big.gguf:ro", model.display());
    let probe_mount = format!("{}:/probe:ro", probe.display());
    let args = [
        "serve",
        "--allow-emulation",
        "--image",
        llama::IMAGE,
        "--name",
        NAME,
        "--memory",
        MEMORY,
        "-v",
        &mount,
        "-v",
        &probe_mount,
        "--ready",
        "/health",
        "--ready-timeout",
        "900s",
        "-p",
        "0:8080",
        "--",
        "llama-server",
        "-m",
        "/models/big.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "-t",
        "1",
    ]
    .map(String::from);
    let start = Instant::now();
    let (mut child, addr) = llama::spawn_serve(&env, &args);
    eprintln!("{TEST}: ready (model loaded) after {:?}", start.elapsed());

    let start = Instant::now();
    let reply = llama::openai_client(&art, addr, MAX_TOKENS);
    eprintln!(
        "{TEST}: the client's three requests took {:?}",
        start.elapsed()
    );
    let chat = &reply["chat"];
    assert_eq!(chat["object"], "chat.completion", "{reply}");
    assert_eq!(chat["role"], "assistant", "{reply}");
    assert_eq!(chat["completion_tokens"], MAX_TOKENS, "{reply}");
    let streamed: String = reply["stream"]["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    assert_eq!(
        streamed,
        reply["plain"]["text"].as_str().unwrap_or(""),
        "greedy: streamed and unstreamed texts differ"
    );

    // Beside the server: its user, the file as the host has it, and no way to write it.
    let pid = llama::busybox(&env, NAME, &["pidof", "llama-server"]);
    let status = llama::busybox(
        &env,
        NAME,
        &["cat", &format!("/proc/{}/status", pid.trim())],
    );
    let uid = status.lines().find(|l| l.starts_with("Uid:"));
    assert_eq!(
        uid.map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>()),
        Some(vec!["1000"; 4]),
        "{status}"
    );
    let stat = llama::busybox(&env, NAME, &["stat", "-c", "%F %s %a", "/models/big.gguf"]);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&model).unwrap().permissions())
            & 0o7777;
    assert_eq!(
        stat.trim(),
        format!("regular file {size} {mode:o}"),
        "the guest's view of the host file"
    );
    let write = "echo x >> /models/big.gguf";
    let out = env.run(&["exec", NAME, "--", "/probe/busybox", "sh", "-c", write]);
    assert!(
        out.code != 0 && out.stderr.contains("Read-only file system"),
        "{out:?}"
    );

    vm_sys::control::signal(child.0.id(), vm_sys::control::Signal::Interrupt).unwrap();
    assert_eq!(child.0.wait().unwrap().code(), Some(130));
    assert_eq!(
        llama::sha256_file(&model),
        sha,
        "the guest changed the model on the host"
    );
}

/// Writes the model with the image's generator and the `gguf` package of its venv.
fn generate(art: &Artifacts, out: &std::path::Path) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../images/llama/make-tiny-gguf.py"
    );
    let run = std::process::Command::new(&art.python)
        .arg(script)
        .arg(&art.vocabulary)
        .arg(out)
        .args(["--min-bytes", &MIN_BYTES.to_string()])
        .output()
        .expect("running make-tiny-gguf.py");
    assert!(
        run.status.success(),
        "make-tiny-gguf.py: {}",
        String::from_utf8_lossy(&run.stderr)
    );
}
