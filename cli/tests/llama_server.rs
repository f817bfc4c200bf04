//! A real model server in a real guest: `vm serve` boots the llama.cpp image that
//! `images/llama-server.sh` builds (a static `llama-server`, user `llama`), with the tiny GGUF
//! model mounted read-only at /models and the guest's port 8080 published on an ephemeral
//! loopback port. Through that port: `/health` answers 200, and the official `openai` Python
//! client gets a chat completion, a streamed completion and the same completion unstreamed
//! (greedy: the streamed text equals it). In the guest (attached through the VM's agent
//! socket, a static busybox mounted at /probe): the server runs as uid 1000, and a write to
//! the model fails. On the host: the
//! model's sha256 is what was built. Then Ctrl-C stops it with 130 and nothing is published.
//! tcg is slow, so the limits are generous and the completions short.

mod common;

use std::time::Duration;

use common::Env;
use common::llama::{self, Artifacts};
use vm_test_support::no_guest_driver;

const TEST: &str = "llama_server_answers_the_openai_client";
/// Tokens per completion: enough to see generated text, few enough for tcg.
const MAX_TOKENS: u32 = 4;
/// Boot + model load under tcg on a loaded 2-core host.
const READY_LIMIT: Duration = Duration::from_secs(600);

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
    // the test looks at the serving guest through it.
    let probe = env.dir.path().join("probe");
    std::fs::create_dir(&probe).unwrap();
    std::fs::copy("/bin/busybox", probe.join("busybox")).expect("/bin/busybox (busybox-static)");
    let args = llama::serve_args(
        &art,
        &["-v".into(), format!("{}:/probe:ro", probe.display())],
    );
    let (mut child, addr) = llama::spawn_serve(&env, &args);

    let ready = llama::wait_healthy(addr, READY_LIMIT);
    if let Err(e) = &ready {
        panic!("{e}; vm serve: {}", stop_and_collect(&mut child));
    }
    eprintln!("{TEST}: healthy after {:?}", ready.unwrap());

    let reply = openai_client(&art, addr);
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

    check_inside_guest(&env, &args);
    assert_eq!(
        llama::sha256_file(&model),
        art.model_sha256,
        "the guest changed the model on the host"
    );

    vm_sandbox::sys::signal(child.0.id(), vm_sandbox::sys::Signal::Interrupt).unwrap();
    assert_eq!(child.0.wait().unwrap().code(), Some(130));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the port is still published after stop"
    );
}

/// Runs the `openai` client script; its JSON reply.
fn openai_client(art: &Artifacts, addr: std::net::SocketAddr) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/llama/openai_client.py");
    let out = std::process::Command::new(&art.python)
        .arg(script)
        .arg(format!("http://{addr}"))
        .arg(MAX_TOKENS.to_string())
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

/// Attaches to the serving VM through its agent socket (the spec is the one `vm serve
/// --dry-run` resolves for the same arguments): llama-server's uids are 1000 (read with the
/// busybox at /probe), and writing the model fails (read-only mount), even through the agent.
fn check_inside_guest(env: &Env, args: &[String]) {
    let mut dry = args.to_vec();
    dry.insert(1, "--dry-run".into());
    dry.insert(2, "--json".into());
    let out = llama::vm_cmd(env).args(&dry).output().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("dry-run JSON");
    let spec: vm_spec::Spec = serde_json::from_value(doc["spec"].clone()).expect("spec");
    let socket = common::files_under(&env.runtime())
        .into_iter()
        .find(|p| {
            // `vsock.sock`, or padded `vsock---….sock` (the tcg backend's path rule).
            let n = p.file_name().map(|n| n.to_string_lossy().into_owned());
            n.is_some_and(|n| n.starts_with("vsock") && n.ends_with(".sock"))
        })
        .expect("the serving VM's agent socket");
    let vm = vm_sandbox::RunningVm::attach(vm_sandbox::Attach {
        agent_socket: socket,
        spec,
    })
    .expect("attach");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pid = busybox(&vm, &["pidof", "llama-server"]).await;
        let pid: u32 = pid
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("pidof: {pid:?}"));
        let status = busybox(&vm, &["cat", &format!("/proc/{pid}/status")]).await;
        let uids: Vec<&str> = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .map(|l| l.split_whitespace().skip(1).collect())
            .unwrap_or_default();
        assert_eq!(
            uids, ["1000"; 4],
            "llama-server's real, effective, saved and fs uids: {status}"
        );
        // As root, through the agent: refused by the read-only mount itself.
        let write = vm.write_absolute("/models/tiny.gguf", b"overwritten").await;
        let err =
            vm_error_chain::error_chain(&write.expect_err("a guest write to the model succeeded"));
        assert!(err.contains("Read-only file system"), "{err}");
    });
}

/// Runs the busybox at /probe in the guest with `args`; its output (it must succeed).
async fn busybox(vm: &vm_sandbox::RunningVm, args: &[&str]) -> String {
    let mut argv = vec!["/probe/busybox"];
    argv.extend_from_slice(args);
    let out = vm.capture(&argv).await.expect("exec in the serving guest");
    let text = String::from_utf8_lossy(&out.output).into_owned();
    assert!(out.status.success(), "{argv:?}: {text}");
    text
}

/// Stops `vm serve` (SIGINT) and returns its stderr, for a failure message.
fn stop_and_collect(child: &mut common::ChildGuard) -> String {
    use std::io::Read;
    let _ = vm_sandbox::sys::signal(child.0.id(), vm_sandbox::sys::Signal::Interrupt);
    let _ = child.0.wait();
    let mut err = String::new();
    if let Some(e) = child.0.stderr.as_mut() {
        let _ = e.read_to_string(&mut err);
    }
    err
}
