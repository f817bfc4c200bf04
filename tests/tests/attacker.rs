//! The guest-side attacker: code running as root inside the guest tries to reach the control
//! plane and the host. It cannot connect to the agent (no vsock loopback, host peers only, a
//! per-boot token it cannot read), holding many vsock connections does not slow the host's
//! requests, a connection out to a host listener delivers nothing, and UDP/ICMP egress fails
//! (TCP and DNS: `egress.rs`). The vsock attempts use the guest probe
//! ([`vm_tests::probe`], `tests/guest-tools/vsock_probe.c`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vm_tests::probe::{PROBE, install_probe};
use vm_tests::{Cases, GuestSpec, MicroVm, boot, ensure, exec_ok, sh};

/// `vsock-probe connect CID PORT` must fail; returns its output.
async fn connect_fails(vm: &MicroVm, cid: u32, port: u32) -> Result<String, String> {
    let out = sh(vm, &format!("./{PROBE} connect {cid} {port}")).await?;
    let text = String::from_utf8_lossy(&out.output).into_owned();
    ensure!(
        !out.status.success() && text.starts_with("failed:"),
        "guest vsock connect to CID {cid} port {port}: {text:?} ({:?})",
        out.status
    );
    Ok(text)
}

/// The agent's port at the guest's own CID, the loopback CID and the host CID: all refused.
async fn agent_unreachable(vm: &MicroVm) -> Result<(), String> {
    for cid in [1, 2, 3] {
        connect_fails(vm, cid, vm_agent_protocol::AGENT_PORT).await?;
    }
    // Nor can guest code find the token to present: gone from the rootfs, and the agent's
    // memory, environment and fds are closed to guest root.
    let out = exec_ok(
        vm,
        "ls /vm-agent.token 2>&1; head -c 1 /proc/1/mem 2>&1; cat /proc/1/environ 2>&1; cat /proc/1/fd/3 2>&1; true",
    )
    .await?;
    ensure!(out.contains("No such file"), "token file visible: {out:?}");
    ensure!(
        out.matches("Permission denied").count() == 3,
        "agent memory/environ/fds readable by guest code: {out:?}"
    );
    Ok(())
}

/// 600 guest vsock connection attempts held open (to the agent's port at the host CID and at
/// the guest's own CID) while the host runs a command: it answers within 1 s.
async fn host_not_starved(vm: &MicroVm) -> Result<(), String> {
    let line = format!("./{PROBE} hold 2 1024 300 6 & ./{PROBE} hold 3 1024 300 6; wait");
    let flood = sh(vm, &line);
    let host = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let t0 = Instant::now();
        let out = exec_ok(vm, "echo host-still-served").await?;
        Ok::<_, String>((out, t0.elapsed()))
    };
    let (flood, host) = tokio::join!(flood, host);
    let (out, took) = host?;
    let flood = String::from_utf8_lossy(&flood?.output).into_owned();
    ensure!(out == "host-still-served\n", "host exec output {out:?}");
    ensure!(
        took < Duration::from_secs(1),
        "host exec took {took:?} during the guest's vsock flood"
    );
    ensure!(
        flood.lines().all(|l| l.ends_with("connected 0")),
        "a guest connection completed: {flood:?}"
    );
    Ok(())
}

/// A host process listening where a hybrid-vsock VMM would put guest connections to host port
/// 5555 (`<agent socket>_5555`) receives nothing. Where that path cannot even exist (the tcg
/// driver pads its socket path so `_<port>` overflows a Unix socket path), the guest's
/// connect still fails.
async fn no_connection_to_host_listener(vm: &MicroVm) -> Result<(), String> {
    let mut would_be = vm.agent_socket().as_os_str().to_os_string();
    would_be.push("_5555");
    let would_be = PathBuf::from(would_be);
    let listener = match std::os::unix::net::UnixListener::bind(&would_be) {
        Ok(l) => {
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            Some(l)
        }
        Err(e) => {
            eprintln!(
                "{} cannot be bound ({e}): no listener can exist",
                would_be.display()
            );
            None
        }
    };
    connect_fails(vm, 2, 5555).await?;
    if let Some(l) = listener {
        let got = l.accept();
        let _ = std::fs::remove_file(&would_be);
        ensure!(
            matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the host listener got a connection from the guest: {got:?}"
        );
    }
    Ok(())
}

/// ICMP and UDP to an outside address fail (no route: the guest has only `lo`).
async fn udp_icmp_fail(vm: &MicroVm) -> Result<(), String> {
    for line in [
        "timeout 10 ping -c 1 -W 2 1.1.1.1",
        "timeout 20 nslookup example.com 1.1.1.1",
    ] {
        let out = sh(vm, line).await?;
        let text = String::from_utf8_lossy(&out.output);
        ensure!(!out.status.success(), "{line:?} succeeded: {text:?}");
        ensure!(out.status.code != Some(124), "{line:?} hung: {text:?}");
        ensure!(
            !text.lines().any(|l| l.starts_with("Name:")),
            "{line:?} got an answer: {text:?}"
        );
    }
    let out = sh(vm, "timeout 10 ping -c 1 -W 2 1.1.1.1").await?;
    let text = String::from_utf8_lossy(&out.output);
    ensure!(
        text.contains("Network is unreachable"),
        "ping failed without ENETUNREACH: {text:?}"
    );
    Ok(())
}

#[test]
fn attacker() {
    vm_tests::scenario("attacker", |driver| async move {
        let vm = boot(driver, &GuestSpec::new("attacker")).await?;
        let mut c = Cases::new("attacker", driver);
        c.run("install_probe", install_probe(&vm)).await;
        c.run("agent_unreachable_from_guest", agent_unreachable(&vm))
            .await;
        c.run("host_not_starved_by_guest_vsock", host_not_starved(&vm))
            .await;
        c.run(
            "no_connection_to_host_listener",
            no_connection_to_host_listener(&vm),
        )
        .await;
        c.run("udp_icmp_egress_fails", udp_icmp_fail(&vm)).await;
        vm.close().await;
        c.finish()
    });
}
