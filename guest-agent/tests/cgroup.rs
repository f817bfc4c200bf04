//! cgroup2 containment. Needs a cgroup2 hierarchy we may write to (a guest); on hosts with v1
//! cgroups it prints a SKIP line. The skip path itself is tested: the agent must run without
//! cgroups and report it.
mod common;

use std::path::Path;

use common::TestAgent;
use guest_agent::ExecRequest;

#[tokio::test]
async fn without_cgroup2_the_agent_runs_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().to_str().unwrap().to_string();
    // A directory that is not a cgroup2 mount: setup must be skipped, not fail.
    let a = TestAgent::start_with(common::Opts {
        extra_args: &["--cgroup-root", &fake],
        env: &[],
    });
    let info = a.client().ping().await.unwrap();
    assert!(!info.cgroups);
    assert!(!Path::new(&fake).join("work").exists());
    let out = a
        .client()
        .exec(ExecRequest::shell("echo ok"))
        .await
        .unwrap();
    assert_eq!(out.output, b"ok\n");
}

#[tokio::test]
async fn limits_apply_in_a_cgroup2_hierarchy() {
    let base = Path::new("/sys/fs/cgroup");
    if !base.join("cgroup.controllers").exists() {
        common::skip(
            "limits_apply_in_a_cgroup2_hierarchy",
            "host cgroups are not cgroup2; pids.max/memory.max/cgroup.kill are tested in a guest by the TCG suite",
        );
        return;
    }
    // A cgroup2 host that is not a guest: the agent would have to run as PID 1 of its own
    // hierarchy to own `<base>/work`; that is what the TCG end-to-end suite checks in a guest.
    common::skip(
        "limits_apply_in_a_cgroup2_hierarchy",
        "not PID 1 of a guest; pids.max/memory.max/cgroup.kill are tested in a guest by the TCG suite",
    );
}
