//! A real model server in a real guest: `vm serve --name llm --ready /health` boots the
//! llama.cpp image that `images/llama-server.sh` builds (a static `llama-server`, user
//! `llama`), with the tiny GGUF model mounted read-only at /models and the guest's port 8080
//! published on an ephemeral loopback port; it prints the URL once `/health` answers 2xx.
//! Through that URL: `/health` is 200, and the official `openai` Python client gets a chat
//! completion, a streamed completion and the same completion unstreamed (greedy: the streamed
//! text equals it). Beside the server (`vm exec llm`, a static busybox mounted at /probe):
//! llama-server runs as uid 1000; a write to the model fails, as root through `vm cp` and as
//! the server's user. On the host the model's sha256 is what was built. Ctrl-C then stops it
//! with 130 and nothing stays published. tcg is slow: generous limits, short completions.

mod common;

use std::time::Instant;

use common::Env;
use common::llama;
use vm_test_support::no_guest_driver;

const TEST: &str = "llama_server_answers_the_openai_client";
/// The serving VM's name (`vm exec` and `vm cp` reach it by it).
const NAME: &str = "llm";
/// Tokens per completion: enough to see generated text, few enough for tcg.
const MAX_TOKENS: u32 = 4;

#[test]
fn llama_server_answers_the_openai_client() {
    let env = Env::new();
    if let Some(why) = common::guest_unavailable(&env) {
        return no_guest_driver(TEST, &why);
    }
    let art = match llama::artifacts() {
        Ok(a) => a,
        Err(why) => return common::skip(TEST, &why),
    };
    let model = art.models.join("tiny.gguf");
    assert_eq!(
        llama::sha256_file(&model),
        art.model_sha256,
        "model changed"
    );
    llama::import(&env, &art);
    // A static busybox on a second read-only mount: the image has no tools of its own, and
    // the test looks beside the server through it.
    let probe = llama::probe_dir(&env);
    let _cleanup = common::VmGuard {
        env: &env,
        name: NAME,
    };
    let probe_mount = format!("{}:/probe:ro", probe.display());
    let extra: Vec<String> = [
        "--name",
        NAME,
        "--ready",
        "/health",
        "--ready-timeout",
        "600s",
        "-v",
        &probe_mount,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let start = Instant::now();
    let (mut child, addr) = llama::spawn_serve(&env, &llama::serve_args(&art, &extra));
    eprintln!("{TEST}: ready (URL printed) after {:?}", start.elapsed());
    let health = common::http::get(addr, "/health");
    assert_eq!(
        health.as_ref().map(|h| h.status).ok(),
        Some(200),
        "{health:?}"
    );

    let reply = llama::openai_client(&art, addr, MAX_TOKENS);
    let chat = &reply["chat"];
    assert_eq!(chat["object"], "chat.completion", "{reply}");
    assert_eq!(chat["role"], "assistant", "{reply}");
    assert_eq!(chat["finish_reason"], "length", "{reply}");
    assert_eq!(chat["completion_tokens"], MAX_TOKENS, "{reply}");
    assert!(
        !chat["content"].as_str().unwrap_or("").is_empty(),
        "{reply}"
    );
    let chunks = reply["stream"]["chunks"].as_array().expect("chunks");
    assert!(chunks.len() >= 2, "not streamed in pieces: {reply}");
    let streamed: String = chunks.iter().filter_map(|c| c.as_str()).collect();
    assert_eq!(reply["stream"]["finish_reason"], "length", "{reply}");
    assert_eq!(reply["plain"]["completion_tokens"], MAX_TOKENS, "{reply}");
    assert_eq!(
        streamed,
        reply["plain"]["text"].as_str().unwrap_or(""),
        "greedy: streamed and unstreamed texts differ"
    );
    assert!(!streamed.is_empty(), "{reply}");

    check_beside_the_server(&env, &probe);
    assert_eq!(
        llama::sha256_file(&model),
        art.model_sha256,
        "the guest changed the model on the host"
    );

    vm_sys::control::signal(child.0.id(), vm_sys::control::Signal::Interrupt).unwrap();
    assert_eq!(child.0.wait().unwrap().code(), Some(130));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the port is still published after stop"
    );
}

/// Through `vm exec NAME` and `vm cp`: llama-server's uids are 1000, and the model cannot be
/// written (the read-only mount), as root through the agent or as the server's user.
fn check_beside_the_server(env: &Env, probe: &std::path::Path) {
    let pid = llama::busybox(env, NAME, &["pidof", "llama-server"]);
    let pid: u32 = pid
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("pidof: {pid:?}"));
    let status = llama::busybox(env, NAME, &["cat", &format!("/proc/{pid}/status")]);
    let uids: Vec<&str> = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .map(|l| l.split_whitespace().skip(1).collect())
        .unwrap_or_default();
    assert_eq!(
        uids, ["1000"; 4],
        "llama-server's real, effective, saved and fs uids: {status}"
    );
    let junk = probe.join("busybox");
    let dst = format!("{NAME}:/models/tiny.gguf");
    let out = env.run(&["cp", junk.to_str().unwrap(), &dst]);
    assert_ne!(out.code, 0, "vm cp over the model succeeded");
    assert!(
        out.stderr.contains("Read-only file system"),
        "{}",
        out.stderr
    );
    let write = "echo x > /models/tiny.gguf";
    let out = env.run(&["exec", NAME, "--", "/probe/busybox", "sh", "-c", write]);
    assert_ne!(out.code, 0, "the server's user wrote the model");
    assert!(
        out.stderr.contains("Read-only file system"),
        "{}",
        out.stderr
    );
}
