//! Egress: the guest has no network but loopback; outbound connections and DNS fail.

use vm_tests::{Cases, GuestSpec, MicroVm, boot, ensure, exec_ok, sh};

async fn only_loopback(vm: &MicroVm) -> Result<(), String> {
    let ifaces = exec_ok(vm, "ls /sys/class/net").await?;
    let names: Vec<&str> = ifaces.split_whitespace().collect();
    ensure!(names == ["lo"], "guest interfaces: {names:?}");
    let routes = exec_ok(vm, "cat /proc/net/route").await?;
    let entries: Vec<&str> = routes
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    ensure!(entries.is_empty(), "guest has IPv4 routes: {entries:?}");
    Ok(())
}

/// A TCP connect to `addr:port` fails, quickly, and says the network is unreachable.
async fn connect_fails(vm: &MicroVm, addr: &str) -> Result<(), String> {
    // timeout(1) bounds each probe (busybox-static 1.35's `wget -T` segfaults, so it is not used).
    let probes = [
        format!("timeout 10 nc -w 3 {addr} 80 </dev/null"),
        format!("timeout 10 wget -O /dev/null http://{addr}/"),
    ];
    for line in probes {
        let out = sh(vm, &line).await?;
        let text = String::from_utf8_lossy(&out.output);
        ensure!(!out.status.success(), "{line:?} succeeded: {text:?}");
        ensure!(
            out.status.code != Some(124),
            "{line:?} hung until timeout(1) killed it: {text:?}"
        );
        ensure!(
            text.contains("Network is unreachable"),
            "{line:?} failed without ENETUNREACH: {text:?}"
        );
    }
    Ok(())
}

async fn internet(vm: &MicroVm) -> Result<(), String> {
    connect_fails(vm, "1.1.1.1").await
}

async fn metadata_service(vm: &MicroVm) -> Result<(), String> {
    connect_fails(vm, "169.254.169.254").await
}

async fn dns_fails(vm: &MicroVm) -> Result<(), String> {
    let out = sh(vm, "timeout 20 nslookup example.com").await?;
    let text = String::from_utf8_lossy(&out.output);
    ensure!(
        !out.status.success(),
        "nslookup example.com succeeded: {text:?}"
    );
    let answered = text.lines().any(|l| l.starts_with("Name:"));
    ensure!(!answered, "nslookup printed an answer: {text:?}");
    let out = sh(vm, "timeout 20 wget -O /dev/null http://example.com/").await?;
    let text = String::from_utf8_lossy(&out.output);
    ensure!(
        !out.status.success(),
        "wget http://example.com/ succeeded: {text:?}"
    );
    ensure!(
        text.contains("bad address"),
        "wget to a hostname failed, but not at name resolution: {text:?}"
    );
    Ok(())
}

#[test]
fn egress() {
    vm_tests::scenario("egress", |driver| async move {
        let vm = boot(driver, &GuestSpec::new("egress")).await?;
        let mut c = Cases::new("egress", driver);
        c.run("only_loopback", only_loopback(&vm)).await;
        c.run("internet_unreachable", internet(&vm)).await;
        c.run("metadata_unreachable", metadata_service(&vm)).await;
        c.run("dns_fails", dns_fails(&vm)).await;
        vm.close().await;
        c.finish()
    });
}
