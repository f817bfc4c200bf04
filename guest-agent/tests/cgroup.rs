//! The agent without a cgroup2 hierarchy: it must run and report it. The limits themselves
//! (`pids.max`, `memory.max`, `cgroup.kill`) need the agent to be PID 1 of its own cgroup2
//! hierarchy, so they are tested where that is real: in a guest, by `tests/guest.rs` (run by
//! `tests/guest/run-tcg.sh`) and the end-to-end suite (`tests/tests/pids.rs`, `memory.rs`,
//! `cancel.rs`).
mod common;

use std::path::Path;

use common::TestAgent;
use vm_agent_protocol::ExecRequest;

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
