//! `vm drivers`: the registry's table and its verdicts on this host (no guest needed).

mod common;

use common::{Env, skip};

#[test]
fn drivers_table_on_this_host() {
    let env = Env::new();
    let list = common::drivers(&env);
    let names: Vec<&str> = list.iter().map(|d| d.0.as_str()).collect();
    assert_eq!(names, ["kvm", "tcg", "hvf", "hyperv"]);
    let text = env.run(&["drivers"]);
    assert_eq!(text.code, 0);
    assert!(text.stdout.starts_with("NAME"), "{}", text.stdout);
    for col in ["AVAILABLE", "CONTAINMENT", "JAIL", "REASON"] {
        assert!(text.stdout.lines().next().unwrap().contains(col));
    }
    let get = |n: &str| list.iter().find(|d| d.0 == n).unwrap().clone();
    let (_, hvf_ok, hvf_c, hvf_reason) = get("hvf");
    let (_, hv_ok, _, hv_reason) = get("hyperv");
    if cfg!(target_os = "linux") {
        assert!(!hvf_ok && !hvf_reason.is_empty(), "{hvf_reason}");
        assert!(!hv_ok && !hv_reason.is_empty(), "{hv_reason}");
        assert_eq!(hvf_c, "microvm");
    }
}

/// On a PVM-native host kvm is listed as unavailable, saying why, and tcg is the emulated
/// fallback when it is installed.
#[test]
fn drivers_table_on_a_pvm_native_host() {
    let env = Env::new();
    if !common::pvm_native_host() {
        return skip(
            "drivers_table_on_a_pvm_native_host",
            "not a PVM-native host",
        );
    }
    let list = common::drivers(&env);
    let get = |n: &str| list.iter().find(|d| d.0 == n).unwrap().clone();
    let text = env.run(&["drivers"]);
    assert_eq!(text.code, 0);
    let (_, kvm_ok, kvm_c, kvm_reason) = get("kvm");
    assert!(!kvm_ok);
    assert_eq!(kvm_c, "microvm");
    assert!(
        kvm_reason.contains("pvm") && kvm_reason.contains("native"),
        "{kvm_reason}"
    );
    let kvm_line = text.stdout.lines().find(|l| l.starts_with("kvm")).unwrap();
    assert!(
        kvm_line.contains(" no ") && kvm_line.contains("native"),
        "{kvm_line}"
    );
    // The jail each driver builds: kvm's full jail (granted to root, as tests run here).
    let json = env.run(&["drivers", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let kvm_jail = &doc[0]["jail"];
    assert_eq!(
        kvm_jail["namespaces"],
        serde_json::json!(["mnt", "pid", "ipc", "uts", "net"]),
        "{kvm_jail}"
    );
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert_eq!(kvm_jail["granted"], root, "{kvm_jail}");
    assert!(
        kvm_line.contains(if root {
            "mnt,pid,ipc,uts,net+seccomp"
        } else {
            "not granted"
        }),
        "{kvm_line}"
    );
    let (_, tcg_ok, tcg_c, tcg_reason) = get("tcg");
    assert_eq!(tcg_c, "user-kernel");
    let tcg_line = text.stdout.lines().find(|l| l.starts_with("tcg")).unwrap();
    if tcg_ok {
        assert!(tcg_reason.contains("emulated"), "{tcg_reason}");
        assert!(
            tcg_line.contains(" yes ") && tcg_line.contains("user-kernel"),
            "{tcg_line}"
        );
    } else {
        // Not installed here: the table says so, with the reason.
        assert!(
            tcg_line.contains(" no ") && !tcg_reason.is_empty(),
            "{tcg_line}"
        );
    }
}
