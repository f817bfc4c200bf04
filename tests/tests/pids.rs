//! Pids: a bounded fork bomb is stopped by pids.max inside the guest, and the agent still
//! answers afterwards.

use std::time::{Duration, Instant};

use vm_agent_protocol::protocol::Command;
use vm_sandbox::Run;
use vm_tests::{Cases, Ctx, GuestSpec, MicroVm, boot, ensure, exec_ok};

const PIDS: i64 = 64;

/// Spawns up to 10000 sleepers, recording after each how many were started.
const BOMB: &str = "i=0; while [ $i -lt 10000 ]; do sleep 1000 & i=$((i+1)); echo $i > bomb.count; done; echo all $i";

/// How many `sleep 1000` processes are alive in the guest (read from /proc, so the counting
/// pipeline never counts itself).
/// A process may exit between the glob and the open: stderr goes to /dev/null before the `<`
/// redirection is tried, for the whole loop too.
const COUNT_SLEEPERS: &str = "for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline; echo; done 2>/dev/null | grep -c '^sleep 1000' || true";

async fn fork_bomb_is_contained(vm: &MicroVm) -> Result<(), String> {
    let run = Run {
        command: Command::Shell(BOMB.into()),
        timeout: Some(Duration::from_secs(150)),
        ..Default::default()
    };
    let out = vm.run(run).await.ctx("running the fork bomb")?;
    let text = String::from_utf8_lossy(&out.output);
    ensure!(
        !out.status.timed_out,
        "the fork bomb ran until its timeout: {:?}",
        vm_tests::tail(&text, 400)
    );
    ensure!(
        !text.contains("all 10000"),
        "all 10000 sleepers were started: pids.max did not hold"
    );
    ensure!(
        text.contains("Resource temporarily unavailable"),
        "fork did not fail with EAGAIN: {:?} {:?}",
        out.status,
        vm_tests::tail(&text, 400)
    );
    let count = exec_ok(vm, "cat bomb.count").await?;
    let count: i64 = count
        .trim()
        .parse()
        .map_err(|_| format!("bomb.count holds {count:?}"))?;
    eprintln!("    {count} sleepers started before fork failed (pids.max {PIDS})");
    ensure!(
        count < PIDS,
        "{count} sleepers started, more than pids.max {PIDS} allows"
    );
    ensure!(
        count >= PIDS / 2,
        "only {count} sleepers started under pids.max {PIDS}"
    );
    Ok(())
}

async fn agent_still_answers(vm: &MicroVm) -> Result<(), String> {
    let out = exec_ok(vm, "echo alive").await?;
    ensure!(out == "alive\n", "after the bomb exec printed {out:?}");
    // What the bomb left behind is killed with it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = exec_ok(vm, COUNT_SLEEPERS).await?;
        if left.trim() == "0" {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{} sleepers of the bomb are still running",
            left.trim()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // And the cap is free again: a few processes start normally.
    let out = exec_ok(
        vm,
        "for i in 1 2 3 4 5; do sleep 0 & done; wait; echo forked",
    )
    .await?;
    ensure!(out == "forked\n", "forking after the bomb printed {out:?}");
    Ok(())
}

#[test]
fn pids() {
    vm_tests::scenario("pids", |driver| async move {
        let mut g = GuestSpec::new("pids");
        g.pids = PIDS;
        let vm = boot(driver, &g).await?;
        let mut c = Cases::new("pids", driver);
        c.run("fork_bomb_is_contained", fork_bomb_is_contained(&vm))
            .await;
        c.run("agent_still_answers", agent_still_answers(&vm)).await;
        vm.close().await;
        c.finish()
    });
}
