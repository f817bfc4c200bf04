//! `--allow-weaker-jail`: where the jail cannot be built, untrusted work is refused unless the
//! caller accepts running without it (no guest boots: dry runs only).

mod common;

use common::{Env, skip};

const REFUSED: i32 = 126;

/// Where the jail cannot be built (here: run as an unprivileged user), untrusted work is
/// refused unless `--allow-weaker-jail` accepts running without it; `--dry-run --json` says
/// which, and so does the verdict.
#[test]
fn an_unbuildable_jail_is_refused_unless_a_weaker_one_is_allowed() {
    let test = "an_unbuildable_jail_is_refused_unless_a_weaker_one_is_allowed";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(test, "needs root to drop to an unprivileged user");
        return;
    }
    // The tcg driver's vsock backend is built beside `vm` (cargo build --workspace).
    let found = std::path::Path::new(common::vm_bin())
        .parent()
        .map(|d| d.join("vm-vsock"))
        .filter(|p| p.is_file());
    let Some(vhost) = found else {
        skip(test, "vm-vsock is not built next to vm");
        return;
    };
    let env = Env::new();
    use std::os::unix::fs::PermissionsExt;
    // The unprivileged user must reach the placeholder images and the vsock backend.
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = env.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::copy(&vhost, bin.join("vm-vsock")).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let run = |extra: &[&str]| {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(common::vm_bin())
            .args([
                "exec",
                "--dry-run",
                "--json",
                "--allow-emulation",
                "--driver",
                "tcg",
            ])
            .args(env.image_args())
            .args(extra)
            .args(["--", "true"])
            .env("PATH", &path)
            .env("HOME", env.dir.path())
            .env("VM_RUNTIME_DIR", env.runtime());
        common::Out::from(c.output().expect("running vm through setpriv"))
    };
    let refused = run(&[]);
    let doc = refused.json();
    assert_eq!(doc["verdict"], "refused", "{doc}");
    assert_eq!(refused.code, REFUSED, "{}", refused.stderr);
    let applied = doc["driver"]["jail"]["applied"]
        .as_str()
        .unwrap_or_default();
    assert!(applied.starts_with("refused: needs root"), "{applied}");
    assert!(
        refused.stderr.contains("--allow-weaker-jail"),
        "{}",
        refused.stderr
    );

    let allowed = run(&["--allow-weaker-jail"]);
    let doc = allowed.json();
    assert_eq!(doc["verdict"], "ok", "{doc}");
    assert_eq!(allowed.code, 0, "{}", allowed.stderr);
    assert_eq!(doc["policy"]["allow_weaker_jail"], true, "{doc}");
    let applied = doc["driver"]["jail"]["applied"]
        .as_str()
        .unwrap_or_default();
    assert!(
        applied.starts_with("none: the host cannot build it"),
        "{applied}"
    );
}
