//! [`RunningVm`]: attaching to a VM another process holds, through the hybrid-vsock socket
//! a record names, with the same rules as a booted [`vm_sandbox::MicroVm`]. The "VM" is the
//! real guest agent running in this process on the host (base directory `/`) behind a
//! hybrid-vsock front, so every request takes the real client path and the real protocol.

mod common;

use std::path::{Path, PathBuf};

use guest_agent::agent::{Agent, AgentOptions};
use tokio::net::UnixListener;
use vm_sandbox::agent::Command;
use vm_sandbox::confine::PathError;
use vm_sandbox::{Attach, Run, RunningVm, SandboxError};

/// The real agent in this process (base directory `/`) behind a hybrid-vsock front at
/// `<dir>/vsock.sock`, with the boot's token beside the socket as the drivers leave it
/// (attaching presents it).
fn start_agent(dir: &Path) -> (PathBuf, tokio::task::JoinHandle<()>) {
    let token = vm_agent_protocol::AgentToken::generate().unwrap();
    token.write_file(&dir.join("agent.token")).unwrap();
    let agent = Agent::new(AgentOptions {
        token: Some(token),
        ..AgentOptions::default() // base directory `/`
    })
    .unwrap();
    let socket = dir.join("vsock.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let front = tokio::spawn(vm_test_support::hybrid::front(
        listener,
        vm_agent_protocol::AGENT_PORT,
        move |s| {
            agent.spawn_conn(s);
            async {}
        },
    ));
    (socket, front)
}

fn sh(line: &str) -> Command {
    Command::Argv(vec!["sh".into(), "-c".into(), line.into()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attached_vm_shares_the_booted_vms_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("work");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let (socket, front) = start_agent(tmp.path());
    let mut spec = common::spec_in(tmp.path());
    spec.guarantees.mounts.clear();
    spec.root = root.to_str().unwrap().to_string();
    spec.guarantees = spec
        .guarantees
        .with_env("PATH", "/usr/bin:/bin")
        .with_env("COLOR", "blue");
    spec.image.kernel = "/nonexistent".into(); // never checked again: the VM runs already
    let vm = RunningVm::attach(Attach {
        agent_socket: socket.clone(),
        spec: spec.clone(),
    })
    .unwrap();
    assert_eq!(vm.agent_socket(), socket);
    assert_eq!(vm.root(), root.to_str().unwrap());
    // Without the token file nothing attaches.
    let elsewhere = tempfile::tempdir().unwrap();
    let err = RunningVm::attach(Attach {
        agent_socket: elsewhere.path().join("vsock.sock"),
        spec: spec.clone(),
    })
    .unwrap_err();
    assert!(
        vm_error_chain::error_chain(&err).contains("agent.token"),
        "{}",
        vm_error_chain::error_chain(&err)
    );

    // The VM's environment, in its root.
    let out = vm.exec("echo $COLOR; pwd").await.unwrap();
    let want = format!("blue\n{}\n", root.display());
    assert_eq!(String::from_utf8_lossy(&out.output), want);
    // A run's own variables replace the VM's; its working directory is under the root.
    let run = Run {
        command: sh("echo $COLOR; pwd"),
        env: vec![("COLOR".into(), "red".into())],
        cwd: Some("sub".into()),
        ..Run::default()
    };
    let out = vm.run(run).await.unwrap();
    let want = format!("red\n{}\n", root.join("sub").display());
    assert_eq!(String::from_utf8_lossy(&out.output), want);
    // A secret-looking variable is refused unless the run allows it.
    let secret = Run {
        command: sh("echo $GH_TOKEN"),
        env: vec![("GH_TOKEN".into(), "x".into())],
        ..Run::default()
    };
    let err = vm.run(secret.clone()).await.unwrap_err();
    assert!(matches!(err, SandboxError::Env(_)), "{err:?}");
    let allowed = Run {
        env_allow: vec!["GH_TOKEN".into()],
        ..secret
    };
    assert_eq!(vm.run(allowed).await.unwrap().output, b"x\n");
    // A working directory outside the root runs there (docker's -w: any absolute path) ...
    let outside = tmp.path().join("elsewhere");
    std::fs::create_dir(&outside).unwrap();
    let out = vm
        .run(Run {
            command: sh("pwd"),
            cwd: Some(format!("{}/./", outside.display())),
            ..Run::default()
        })
        .await
        .unwrap();
    assert_eq!(out.output, format!("{}\n", outside.display()).as_bytes());
    // ... and one with `..` is refused before anything runs.
    let up = Run {
        command: sh("true"),
        cwd: Some(format!("{}/../x", root.display())),
        ..Run::default()
    };
    let err = vm.run(up).await.unwrap_err();
    assert!(
        matches!(err, SandboxError::Path(PathError::DotDot(_))),
        "{err:?}"
    );

    // Files relative to the root, and by absolute guest path.
    vm.write_file("in/a.txt", b"abc").await.unwrap();
    assert_eq!(std::fs::read(root.join("in/a.txt")).unwrap(), b"abc");
    assert_eq!(vm.glob("**/*.txt").await.unwrap(), vec!["in/a.txt"]);
    let abs = tmp.path().join("abs/b.txt");
    vm.write_absolute(abs.to_str().unwrap(), b"def")
        .await
        .unwrap();
    assert_eq!(
        vm.read_absolute(abs.to_str().unwrap()).await.unwrap(),
        b"def"
    );
    // Remove: a file relative to the root goes; a directory stays, refused; `..` never leaves.
    vm.remove("in/a.txt").await.unwrap();
    assert!(!root.join("in/a.txt").exists());
    assert!(vm.remove("in").await.is_err());
    assert!(root.join("in").is_dir());
    let err = vm.remove("../abs/b.txt").await.unwrap_err();
    assert!(
        matches!(err, SandboxError::Path(PathError::DotDot(_))),
        "{err:?}"
    );
    assert!(abs.exists());
    let err = vm.read_absolute("relative/b.txt").await.unwrap_err();
    assert!(
        matches!(err, SandboxError::Path(PathError::NotAbsolute(_))),
        "{err:?}"
    );

    // Streaming exec.
    let run = Run {
        command: sh("echo out; echo err >&2; exit 3"),
        ..Run::default()
    };
    let mut stream = vm.exec_stream(run).await.unwrap();
    let (mut stdout, mut stderr, mut status) = (Vec::new(), Vec::new(), None);
    while let Some(ev) = stream.next().await.unwrap() {
        match ev {
            vm_sandbox::agent::ExecEvent::Stdout(d) => stdout.extend(d),
            vm_sandbox::agent::ExecEvent::Stderr(d) => stderr.extend(d),
            vm_sandbox::agent::ExecEvent::Exit(s) => status = Some(s),
        }
    }
    assert_eq!((stdout, stderr), (b"out\n".to_vec(), b"err\n".to_vec()));
    assert_eq!(status.unwrap().code, Some(3));

    // Interactive exec: the same rules, stdin streamed, a terminal.
    common::interactive::check(&vm, "COLOR", "blue").await;

    // Serve: a host loopback port forwarded to the "guest" port.
    let (serving, _) = common::echo::serve(&vm).await;
    assert_eq!(common::echo::ping(serving.addr()).await, b"echo:ping");
    serving.stop().await.unwrap();
    assert!(!serving.running());
    front.abort();
}

#[test]
fn attach_refuses_a_record_that_breaks_the_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = common::spec_in(tmp.path());
    spec.root = "relative/root".into();
    let err = RunningVm::attach(Attach {
        agent_socket: tmp.path().join("vsock.sock"),
        spec: spec.clone(),
    })
    .unwrap_err();
    assert!(matches!(err, SandboxError::Spec(_)), "{err:?}");
    spec.root = "/work".into();
    spec.guarantees = spec.guarantees.with_env("API_TOKEN", "abc");
    let err = RunningVm::attach(Attach {
        agent_socket: tmp.path().join("vsock.sock"),
        spec,
    })
    .unwrap_err();
    assert!(err.to_string().contains("spec refused"), "{err}");
}

/// A VM booted from an image root keeps the image's defaults when attached: its `Env` under
/// the spec's, its working directory, its user (or `Spec.user`), and `Entrypoint` + `Cmd` for
/// an empty argv.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attached_vm_applies_the_image_defaults() {
    // SAFETY: geteuid has no arguments or memory effects.
    if unsafe { libc::geteuid() } != 0 {
        vm_test_support::skip(
            "attached_vm_applies_the_image_defaults",
            "switching users needs the agent to run as root",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("work");
    let wd = root.join("wd");
    std::fs::create_dir_all(&wd).unwrap();
    let (socket, front) = start_agent(tmp.path());
    let mut spec = common::spec_in(tmp.path());
    spec.guarantees.mounts.clear();
    spec.root = root.to_str().unwrap().to_string();
    spec.guarantees = spec.guarantees.with_env("COLOR", "blue");
    spec.image.config = vm_spec::ImageConfig {
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("COLOR".into(), "image".into()),
            ("SHADE".into(), "dark".into()),
        ],
        working_dir: Some(wd.to_str().unwrap().to_string()),
        user: Some("4242:4343".into()),
        entrypoint: vec!["sh".into(), "-c".into()],
        cmd: vec!["echo $SHADE $COLOR; pwd; id -u; id -g".into()],
    };
    let vm = RunningVm::attach(Attach {
        agent_socket: socket.clone(),
        spec: spec.clone(),
    })
    .unwrap();
    let run = Run {
        command: Command::Argv(Vec::new()),
        ..Run::default()
    };
    let out = vm.run(run).await.unwrap();
    let want = format!("dark blue\n{}\n4242\n4343\n", wd.display());
    assert_eq!(String::from_utf8_lossy(&out.output), want);
    // A run's own user wins over the image's.
    let run = Run {
        command: sh("id -u"),
        user: Some("0".into()),
        ..Run::default()
    };
    assert_eq!(vm.run(run).await.unwrap().output, b"0\n");
    // Spec.user wins over the image's User.
    spec.user = Some("4444:4444".into());
    let vm = RunningVm::attach(Attach {
        agent_socket: socket,
        spec,
    })
    .unwrap();
    assert_eq!(vm.exec("id -u").await.unwrap().output, b"4444\n");
    front.abort();
}
