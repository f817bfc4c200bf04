//! The MicroVm API against the real agent protocol (the agent runs on the host over a Unix
//! socket; see common/hostagent.rs). Real guests are covered by the end-to-end suite.

mod common;

use std::time::Duration;

use common::hostagent::{HostAgentDriver, agent_bin};
use vm_drivers::Registry;
use vm_sandbox::{MicroVm, Options, PublishSpec, SandboxError, ServeSpec};
use vm_spec::{Containment, Spec};

fn setup(name: &str, wall: Duration) -> Option<(tempfile::TempDir, Registry, Spec, Options)> {
    let Some(bin) = agent_bin() else {
        common::skip(
            name,
            "vm-agent not built (cargo build -p guest-agent --bin vm-agent)",
        );
        return None;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = common::spec_in(tmp.path());
    spec.guarantees.mounts.clear(); // the host agent mounts nothing
    spec.guarantees.limits.wall = (!wall.is_zero()).then_some(wall);
    spec.root = tmp.path().join("work").to_str().unwrap().to_string();
    spec.guarantees = spec
        .guarantees
        .with_env("PATH", "/usr/bin:/bin")
        .with_env("GREETING", "hi");
    let runs = tmp.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    let options = Options {
        run_dir_parent: Some(runs),
        mount_cache: Some(tmp.path().join("cache")),
        ..Options::default()
    };
    let registry = Registry::new(vec![Box::new(HostAgentDriver {
        bin,
        machine_containment: Containment::MicroVm,
    })]);
    Some((tmp, registry, spec, options))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_files_glob_and_close() {
    let Some((tmp, registry, spec, options)) = setup("exec_files_glob_and_close", Duration::ZERO)
    else {
        return;
    };
    let vm = MicroVm::create_with(&registry, &spec, &options).unwrap();
    assert_eq!(vm.containment(), Containment::MicroVm);
    assert_eq!(vm.driver(), "host-agent");

    let out = vm.exec("echo $GREETING; pwd").await.unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.output),
        format!("hi\n{}\n", vm.root())
    );

    // The environment is exactly Guarantees.env (argv, no shell).
    let out = vm.capture(&["env"]).await.unwrap();
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.output)
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    assert_eq!(lines, ["GREETING=hi", "PATH=/usr/bin:/bin"]);

    let out = vm.exec("exit 3").await.unwrap();
    assert_eq!(out.status.code, Some(3));

    common::interactive::check(&vm, "GREETING", "hi").await;

    vm.write_file("a/b.txt", b"payload").await.unwrap();
    vm.write_file("a/c/d.txt", b"x").await.unwrap();
    vm.write_file("top.md", b"y").await.unwrap();
    assert_eq!(vm.read_file("a/b.txt").await.unwrap(), b"payload");
    assert_eq!(
        std::fs::read(tmp.path().join("work/a/b.txt")).unwrap(),
        b"payload"
    );

    for bad in ["../escape", "/etc/passwd", "a/../../x", "a\0b", ""] {
        let err = vm.read_file(bad).await.unwrap_err();
        assert!(matches!(err, SandboxError::Path(_)), "{bad:?}: {err}");
        let err = vm.write_file(bad, b"no").await.unwrap_err();
        assert!(matches!(err, SandboxError::Path(_)), "{bad:?}: {err}");
    }
    assert!(!tmp.path().join("escape").exists());

    assert_eq!(
        vm.walk("").await.unwrap(),
        ["a/b.txt", "a/c/d.txt", "top.md"]
    );
    assert_eq!(vm.walk("a/c").await.unwrap(), ["a/c/d.txt"]);
    assert!(vm.walk("nope").await.unwrap().is_empty());
    assert_eq!(vm.glob("**/*.txt").await.unwrap(), ["a/b.txt", "a/c/d.txt"]);
    assert_eq!(vm.glob("a/*.txt").await.unwrap(), ["a/b.txt"]);
    assert_eq!(vm.glob("*.md").await.unwrap(), ["top.md"]);
    assert!(matches!(vm.glob("../*").await, Err(SandboxError::Glob(_))));

    let pids = vm.machine().host_pids();
    let run_dir = std::fs::read_dir(tmp.path().join("runs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // The accessors name the run dir the driver was given and the socket it recorded, and
    // a second client reaches the same agent through that socket.
    assert_eq!(vm.run_dir(), run_dir);
    assert_eq!(vm.agent_socket(), run_dir.join("agent.sock"));
    assert_eq!(vm.agent_socket(), vm.machine().agent_socket());
    vm_agent_client::AgentClient::unix(vm.agent_socket())
        .ping()
        .await
        .expect("ping through MicroVm::agent_socket()");
    vm.close().await;
    vm.close().await; // idempotent
    assert!(!run_dir.exists(), "run dir left behind");
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "agent {pid} still alive"
        );
    }
    assert!(vm.exec("true").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_forwards_a_loopback_port_and_stop_closes_it() {
    let Some((_tmp, registry, spec, options)) = setup("serve_forwards", Duration::ZERO) else {
        return;
    };
    let vm = MicroVm::create_with(&registry, &spec, &options).unwrap();
    let (serving, guest_port) = common::echo::serve(&vm).await;
    let addr = serving.addr();
    assert!(addr.ip().is_loopback() && addr.port() != 0);
    assert!(serving.running());

    assert_eq!(common::echo::ping(addr).await, b"echo:ping");
    tokio::time::sleep(vm_sandbox::POLL_INTERVAL * 2).await;
    assert_eq!(serving.output(), "listening\n");

    serving.stop().await.unwrap();
    serving.stop().await.unwrap(); // idempotent
    assert!(!serving.running());
    tokio::time::timeout(Duration::from_secs(5), serving.done())
        .await
        .expect("done() resolves");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "host port still open"
    );
    // The guest process is gone too: its port is free again.
    assert!(
        common::echo::port_freed(guest_port).await,
        "guest server still holds its port"
    );
    vm.close().await;
}

/// What a snapshot taken serving relies on: `detach` closes the host port but leaves the
/// guest process running, and `attach_served` with what `served()` recorded publishes that
/// same process again (nothing new starts in the guest: its output is the first run's) on a
/// new host port; its `stop` then ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_server_runs_on_and_is_published_again_by_attach_served() {
    let Some((_tmp, registry, spec, options)) = setup("attach_served", Duration::ZERO) else {
        return;
    };
    let vm = MicroVm::create_with(&registry, &spec, &options).unwrap();
    let (serving, guest_port) = common::echo::serve(&vm).await;
    let first = serving.addr();
    assert_eq!(common::echo::ping(first).await, b"echo:ping");
    let served = serving.served();
    assert_eq!(served.guest_ports, [guest_port]);
    assert_eq!(served.argv, common::echo::server_argv(guest_port));
    serving.detach();
    drop(serving); // no stop sent: the process is the snapshot's to keep
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        tokio::net::TcpStream::connect(first).await.is_err(),
        "the detached host port is still open"
    );
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", guest_port)).is_err(),
        "the guest server ended with the detach"
    );

    let again = vm
        .attach_served(&served, &[PublishSpec::loopback(0, guest_port)])
        .await
        .unwrap();
    assert_ne!(again.addr(), first);
    assert_eq!(common::echo::ping(again.addr()).await, b"echo:ping");
    assert_eq!(again.argv(), served.argv.as_slice());
    tokio::time::sleep(vm_sandbox::POLL_INTERVAL * 2).await;
    assert!(again.running());
    assert_eq!(
        again.output(),
        "listening\n",
        "a second process was started"
    );
    again.stop().await.unwrap();
    assert!(
        common::echo::port_freed(guest_port).await,
        "stop after attach_served left the guest server running"
    );
    vm.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_taken_host_port_before_starting() {
    let Some((_tmp, registry, spec, options)) =
        setup("serve_refuses_a_taken_host_port", Duration::ZERO)
    else {
        return;
    };
    let vm = MicroVm::create_with(&registry, &spec, &options).unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let marker = format!("{}.{port}", std::process::id()); // a unique sleep duration
    let err = vm
        .serve(ServeSpec {
            argv: vec!["sleep".into(), marker.clone()],
            publish: vec![PublishSpec::loopback(port, 9)],
        })
        .await
        .unwrap_err();
    let SandboxError::Serve(vm_sandbox::ServeError::Bind { addr, source }) = &err else {
        panic!("not a bind refusal: {err:?}")
    };
    assert_eq!(*addr, std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse, "{source}");
    let out = vm
        .exec(&format!("ps -eo args | grep -c '^sleep {marker}$' || true"))
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.output).trim(),
        "0",
        "process started anyway"
    );
    vm.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_lifetime_reaches_the_machine() {
    let Some((_tmp, registry, spec, options)) = setup(
        "wall_lifetime_reaches_the_machine",
        Duration::from_millis(700),
    ) else {
        return;
    };
    let vm = MicroVm::create_with(&registry, &spec, &options).unwrap();
    assert!(vm.exec("true").await.unwrap().status.success());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let err = vm.exec("true").await.unwrap_err();
    let SandboxError::Machine { op, source } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*op, "exec");
    assert!(
        matches!(source, vm_drivers::MachineError::WallExpired { .. }),
        "{source}"
    );
    vm.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_reports_a_process_that_exits_by_itself() {
    let Some((_tmp, registry, spec, options)) = setup(
        "serving_reports_a_process_that_exits_by_itself",
        Duration::ZERO,
    ) else {
        return;
    };
    let vm = MicroVm::create_with(&registry, &spec, &options).unwrap();
    let serving = vm
        .serve(ServeSpec {
            argv: vec!["sh".into(), "-c".into(), "echo bye; exit 7".into()],
            publish: vec![PublishSpec::loopback(0, 9)],
        })
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), serving.done())
        .await
        .expect("done() resolves");
    assert!(!serving.running());
    assert_eq!(serving.exit().and_then(|e| e.code), Some(7));
    assert_eq!(serving.output(), "bye\n");
    serving.stop().await.unwrap();
    vm.close().await;
}

#[test]
fn a_machine_weaker_than_its_driver_claimed_is_refused_and_torn_down() {
    let Some((tmp, _, spec, options)) = setup("a_machine_weaker_than_its_driver", Duration::ZERO)
    else {
        return;
    };
    let bin = agent_bin().unwrap();
    let liar = HostAgentDriver {
        bin,
        machine_containment: Containment::Container,
    };
    let registry = Registry::new(vec![Box::new(liar)]);
    let err = MicroVm::create_with(&registry, &spec, &options).unwrap_err();
    assert!(matches!(err, SandboxError::Admit(_)), "{err}");
    // The gate's refusal is the cause in the chain (callers walking it find the AdmitError).
    let cause = std::error::Error::source(&err).expect("admit error has a cause");
    assert!(cause.is::<vm_spec::AdmitError>(), "{cause:?}");
    let admit = cause.downcast_ref::<vm_spec::AdmitError>().unwrap();
    assert!(
        matches!(
            admit,
            vm_spec::AdmitError::Forbidden {
                provided: Containment::Container,
                required: Containment::MicroVm,
                ..
            }
        ),
        "{admit:?}"
    );
    assert_eq!(
        std::fs::read_dir(tmp.path().join("runs")).unwrap().count(),
        0,
        "run dir left"
    );
}

/// `wait_ready`: a Python HTTP server that binds after 1 s is ready only once it answers
/// 2xx on the path; a path answering 404 is `NotReady` naming the status; a server that
/// exits first is `ExitedEarly` with its code, long before the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_ready_waits_for_2xx_and_reports_why_not() {
    use vm_sandbox::{Readiness, ServeError};
    let Some((tmp, registry, spec, options)) = setup("wait_ready", Duration::ZERO) else {
        return;
    };
    std::fs::create_dir_all(tmp.path().join("www")).unwrap();
    std::fs::write(tmp.path().join("www/health"), b"ok").unwrap();
    let vm = MicroVm::create_with(&registry, &spec, &options).unwrap();
    let port = common::echo::free_port();
    let www = tmp.path().join("www").display().to_string();
    let argv = [
        "sh",
        "-c",
        "sleep 1; exec python3 -m http.server --bind 127.0.0.1 \"$0\" -d \"$1\"",
    ];
    let serving = vm
        .serve(ServeSpec {
            argv: argv
                .iter()
                .map(|s| s.to_string())
                .chain([port.to_string(), www])
                .collect(),
            publish: vec![PublishSpec::loopback(0, port)],
        })
        .await
        .unwrap();
    let ready = |path: &str, secs| Readiness {
        http_path: Some(path.into()),
        timeout: Duration::from_secs(secs),
    };
    let t = std::time::Instant::now();
    serving.wait_ready(&ready("/health", 30)).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "ready before the bind"
    );
    // Ready means the first plain request answers.
    let mut c = tokio::net::TcpStream::connect(serving.addr())
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    c.write_all(b"GET /health HTTP/1.0\r\n\r\n").await.unwrap();
    let mut reply = Vec::new();
    c.read_to_end(&mut reply).await.unwrap();
    assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.0 200"));

    let err = serving.wait_ready(&ready("/missing", 2)).await.unwrap_err();
    let ServeError::NotReady { waited, last } = &err else {
        panic!("{err:?}")
    };
    assert!(*waited >= Duration::from_secs(1), "{waited:?}");
    assert!(
        last.contains("GET /missing") && last.contains("404"),
        "{last}"
    );
    let bad = serving.wait_ready(&ready("/a b", 2)).await.unwrap_err();
    assert!(matches!(bad, ServeError::ReadyPath { .. }), "{bad:?}");
    serving.stop().await.unwrap();

    let early = vm
        .serve(ServeSpec {
            argv: vec!["sh".into(), "-c".into(), "sleep 0.5; exit 4".into()],
            publish: vec![PublishSpec::loopback(0, common::echo::free_port())],
        })
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let err = early.wait_ready(&ready("/", 60)).await.unwrap_err();
    let ServeError::ExitedEarly { status } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(status.and_then(|s| s.code), Some(4), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    vm.close().await;
}
