//! `vm snapshot` and `vm exec --from` as a user meets them on this host: the store listed and
//! names checked, flags a restore cannot honour refused by name, an unknown snapshot named,
//! `vm drivers --json` saying which drivers snapshot, and (with a tcg guest) `vm snapshot
//! create` on the tcg road refused with QEMU's reason, writing nothing.

mod common;

use common::Env;

fn run(env: &Env, args: &[&str]) -> common::Out {
    common::Out::from(
        env.cmd()
            .env("VM_SNAPSHOTS_DIR", env.dir.path().join("snapshots"))
            .args(args)
            .output()
            .expect("running vm"),
    )
}

/// Runs `vm args`, which must exit `code` with `says` in its stderr.
fn refused(env: &Env, args: &[&str], code: i32, says: &str) {
    let out = run(env, args);
    assert_eq!(out.code, code, "{args:?}: {}", out.stderr);
    assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
}

#[test]
fn the_store_and_the_refusals_before_anything_boots() {
    let env = Env::new();
    let ls = run(&env, &["snapshot", "ls"]);
    assert_eq!(ls.code, 0, "{}", ls.stderr);
    assert_eq!(
        ls.stdout.lines().count(),
        1,
        "only the header: {}",
        ls.stdout
    );
    assert!(ls.stdout.starts_with("NAME"), "{}", ls.stdout);
    let json = run(&env, &["snapshot", "ls", "--json"]);
    assert_eq!(json.stdout.trim(), "[]");

    refused(
        &env,
        &["snapshot", "rm", "nope"],
        125,
        "no snapshot named \"nope\"",
    );
    refused(
        &env,
        &["snapshot", "rm", "../x"],
        2,
        "invalid snapshot name",
    );

    refused(
        &env,
        &[
            "exec", "--from", "base", "--memory", "1G", "-v", "/tmp:/t", "--", "true",
        ],
        2,
        "--memory, -v refused with --from",
    );
    refused(
        &env,
        &["exec", "--from", "base", "--", "true"],
        125,
        "no snapshot named \"base\"",
    );
    let both = run(&env, &["exec", "box", "--from", "base", "--", "true"]);
    assert_eq!(both.code, 2, "NAME and --from: {}", both.stderr);

    let drivers = run(&env, &["drivers", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&drivers.stdout).unwrap();
    let supported = |name: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .map(|d| d["snapshots"]["supported"].clone())
    };
    assert_eq!(supported("kvm"), Some(true.into()));
    assert_eq!(supported("tcg"), Some(false.into()));
}

#[test]
fn create_on_the_tcg_road_is_refused_with_the_reason() {
    let env = Env::new();
    if common::no_guest_here(&env, "create_on_the_tcg_road_is_refused_with_the_reason") {
        return;
    }
    let out = run(
        &env,
        &[
            "snapshot",
            "create",
            "base",
            "--driver",
            "tcg",
            "--allow-emulation",
        ],
    );
    assert_eq!(out.code, 126, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("tcg: no snapshots: QEMU 7.2 refuses to migrate a vhost-user-vsock device"),
        "{}",
        out.stderr
    );
    let store = env.dir.path().join("snapshots");
    let left: Vec<_> = std::fs::read_dir(&store)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the store: {left:?}");
}

#[test]
fn run_d_and_serve_from_refuse_what_a_snapshot_fixes_and_name_a_missing_one() {
    let env = Env::new();
    refused(
        &env,
        &[
            "run", "-d", "--name", "warm", "--from", "base", "--cpus", "2",
        ],
        2,
        "--cpus refused with --from",
    );
    refused(
        &env,
        &[
            "serve", "-p", "8000", "--from", "base", "-e", "A=1", "--user", "1000", "--", "httpd",
        ],
        2,
        "-e, --user refused with --from: a restored VM has the snapshot's environment and user",
    );
    for args in [
        &["run", "-d", "--name", "warm", "--from", "base"][..],
        &["serve", "-p", "8000", "--from", "base", "--", "httpd"][..],
    ] {
        refused(&env, args, 125, "no snapshot named \"base\"");
    }
    // Nothing was recorded for the refused starts.
    let ps = common::Out::from(env.cmd().args(["ps"]).output().expect("vm ps"));
    assert!(!ps.stdout.contains("warm"), "{}", ps.stdout);
}

#[test]
fn create_serving_flags_are_checked_before_anything_boots() {
    let env = Env::new();
    // --ready waits on a served port: without -p there is none.
    refused(
        &env,
        &["snapshot", "create", "web", "--ready", "/", "--", "true"],
        2,
        "--port <GUESTPORT>",
    );
    // Guest port 0 is no port.
    refused(
        &env,
        &["snapshot", "create", "web", "-p", "0", "--", "httpd"],
        2,
        "'0'",
    );
    // A ready path goes into a request line: it must be one.
    let path = run(
        &env,
        &[
            "snapshot", "create", "web", "-p", "80", "--ready", "health", "--", "httpd",
        ],
    );
    assert_eq!(path.code, 2, "{}", path.stderr);
    assert!(!env.dir.path().join("snapshots").join("web").exists());
}

/// A snapshot in the store that someone else could write: `vm snapshot ls` shows why, and
/// `vm exec --from` refuses it naming the directory (126), before anything boots.
#[test]
fn a_snapshot_others_could_write_is_listed_with_why_and_refused() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let base = env.dir.path().join("snapshots").join("base");
    std::fs::create_dir_all(&base).unwrap();
    std::fs::write(base.join("snapshot.json"), b"{}").unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
    let named = format!("{} must belong to uid", base.display());
    refused(&env, &["exec", "--from", "base", "--", "true"], 126, &named);
    let ls = run(&env, &["snapshot", "ls"]);
    assert_eq!(ls.code, 0, "{}", ls.stderr);
    assert!(
        ls.stdout.contains("base") && ls.stdout.contains("writable by group or others"),
        "{}",
        ls.stdout
    );
}
