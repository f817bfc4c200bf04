//! The host processes that read agent frames run confined once they start nothing more
//! (issue 39): the `run -d` supervisor after its VM booted, `vm exec NAME` from its start, and
//! a booting `vm exec` once its VM is up each show `Seccomp: 2` (a filter) and `NoNewPrivs: 1`
//! in `/proc`, while the command they relay still runs and exits with its own code. What the
//! filter refuses is `jail/tests/reader_filter.rs`'s.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::Env;
use vm_test_support::procfs::{status_field, thread_status_files};

/// `(Seccomp, NoNewPrivs)` of `pid`'s threads (the first value its threads do not share,
/// else theirs), once every thread shows a filter, within 60 s (a booting VM first), or as
/// last seen.
fn confinement(pid: u32) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let threads = thread_status_files(pid);
        let field = |key: &str| {
            let mut values: Vec<String> = threads.iter().map(|t| status_field(t, key)).collect();
            values.sort();
            values.dedup();
            values.join("|")
        };
        let seen = (field("Seccomp"), field("NoNewPrivs"));
        if seen.0 == "2" || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn agent_readers_run_under_a_seccomp_filter() {
    let env = Env::new();
    if common::no_guest_here(&env, "agent_readers_run_under_a_seccomp_filter") {
        return;
    }
    let _cleanup = common::VmGuard {
        env: &env,
        name: "held",
    };
    let out = env.run(&["run", "-d", "--name", "held", "--allow-emulation"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    let ps = env.run(&["ps", "--json"]).json();
    let supervisor = ps[0]["supervisor_pid"].as_u64().unwrap() as u32;
    let one = |v: &str| (v.to_string(), "1".to_string());
    assert_eq!(confinement(supervisor), one("2"), "the supervisor");

    for (what, args) in [
        (
            "vm exec NAME",
            vec!["exec", "held", "--", "sh", "-c", "sleep 4; exit 5"],
        ),
        (
            "a booting vm exec",
            vec![
                "exec",
                "--allow-emulation",
                "--",
                "sh",
                "-c",
                "sleep 4; exit 5",
            ],
        ),
    ] {
        let child = env
            .cmd()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("vm exec");
        assert_eq!(confinement(child.id()), one("2"), "{what}");
        let out = child.wait_with_output().expect("vm exec");
        assert_eq!(
            out.status.code(),
            Some(5),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The supervisor still stops its VM under the filter: nothing of it is left.
    let out = env.run(&["stop", "held"]);
    assert_eq!(out.code, 0, "stderr: {}", out.stderr);
    assert!(
        !common::pid_alive(supervisor),
        "the supervisor outlived its stop"
    );
}
