//! Environment: a guest process sees exactly `Guarantees.env`, nothing from the host.

use std::collections::BTreeMap;

use vm_tests::{Cases, Ctx, DEFAULT_PATH, GuestSpec, MicroVm, boot, ensure, exec_ok};

const MARKER: &str = "VM_E2E_MARKER";
const GUEST_HOME: &str = "/e2e-home";

fn passed_env() -> Vec<(String, String)> {
    vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), GUEST_HOME.into()),
        (MARKER.into(), format!("marker-{}", std::process::id())),
    ]
}

fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `env` run directly (no shell adding its own variables) prints exactly what was passed.
async fn exactly_the_passed_env(vm: &MicroVm) -> Result<(), String> {
    let out = vm.capture(&["env"]).await.ctx("env")?;
    ensure!(out.status.success(), "env: {:?}", out.status);
    let guest = parse_env(&String::from_utf8_lossy(&out.output));
    let want: BTreeMap<String, String> = passed_env().into_iter().collect();
    ensure!(
        guest == want,
        "guest environment {guest:?}\nis not exactly the passed {want:?}"
    );
    Ok(())
}

/// Variables this test process has (HOME, PATH, cargo's own) do not leak: the ones not
/// passed are absent, the ones passed carry the passed value, not the host's.
async fn host_env_does_not_leak(vm: &MicroVm) -> Result<(), String> {
    let host: BTreeMap<String, String> = std::env::vars().collect();
    ensure!(
        host.contains_key("HOME") && host.contains_key("PATH"),
        "the host has no HOME/PATH"
    );
    let passed: Vec<String> = passed_env().into_iter().map(|(k, _)| k).collect();
    let unpassed: Vec<&String> = host.keys().filter(|k| !passed.contains(k)).collect();
    ensure!(
        !unpassed.is_empty(),
        "the host has no variable outside the passed set to check"
    );
    let guest = parse_env(&String::from_utf8_lossy(
        &vm.capture(&["env"]).await.ctx("env")?.output,
    ));
    let leaked: Vec<&&String> = unpassed
        .iter()
        .filter(|k| guest.contains_key(k.as_str()))
        .collect();
    ensure!(
        leaked.is_empty(),
        "host variables leaked into the guest: {leaked:?}"
    );
    ensure!(
        guest.get("HOME").map(String::as_str) == Some(GUEST_HOME) && host["HOME"] != GUEST_HOME,
        "guest HOME {:?} (host {:?}, passed {GUEST_HOME})",
        guest.get("HOME"),
        host["HOME"]
    );
    ensure!(
        guest.get("PATH").map(String::as_str) == Some(DEFAULT_PATH),
        "guest PATH {:?}",
        guest.get("PATH")
    );
    // Through a shell as well: the marker expands, a host-only variable does not.
    let ident = |k: &&&String| {
        k.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let probe = unpassed
        .iter()
        .find(|k| k.as_str() == "CARGO_MANIFEST_DIR")
        .or_else(|| unpassed.iter().find(ident))
        .ok_or("no host variable with a shell-safe name")?;
    let out = exec_ok(vm, &format!("echo \"${MARKER}|${{{probe}-unset}}\"")).await?;
    let want = format!("marker-{}|unset\n", std::process::id());
    ensure!(
        out == want,
        "shell saw {out:?}, expected {want:?} (host-only variable {probe})"
    );
    Ok(())
}

#[test]
fn env() {
    vm_tests::scenario("env", |driver| async move {
        let mut g = GuestSpec::new("env");
        g.env = passed_env();
        let vm = boot(driver, &g).await?;
        let mut c = Cases::new("env", driver);
        c.run("exactly_the_passed_env", exactly_the_passed_env(&vm))
            .await;
        c.run("host_env_does_not_leak", host_env_does_not_leak(&vm))
            .await;
        vm.close().await;
        c.finish()
    });
}
