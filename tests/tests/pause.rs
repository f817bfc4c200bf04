//! Pause: a paused guest is frozen on the host (every thread of every VM process stopped),
//! refuses guest operations with a typed error, and carries on where it was once resumed —
//! a command started before the pause finishes after it. Closing a paused VM leaves nothing.

use std::time::{Duration, Instant};

use vm_drivers::MachineError;
use vm_sandbox::SandboxError;
use vm_test_support::procfs::thread_states;
use vm_tests::host::pid_exists;
use vm_tests::{Cases, GuestSpec, boot, ensure, error_chain};

/// Every process of the process groups `groups` (each VM process leads one; a jailed
/// program runs in its reaper's group).
fn group_members(groups: &[u32]) -> Vec<u32> {
    vm_sys::control::group_members(groups)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

fn is_paused(e: &SandboxError) -> bool {
    matches!(
        e,
        SandboxError::Machine {
            source: MachineError::Paused { .. },
            ..
        }
    )
}

async fn scenario(driver: &'static str) -> Result<(), String> {
    let vm = boot(driver, &GuestSpec::new("pause")).await?;
    let me = std::process::id();
    let groups: Vec<u32> = vm
        .machine()
        .host_pids()
        .into_iter()
        .filter(|&p| p != me)
        .collect();
    let mut c = Cases::new("pause", driver);

    c.run("frozen_while_paused_and_back_after", async {
        // Started before the pause, finished after it: the guest carries on where it was.
        let running = vm.exec("sleep 1; echo slept");
        let pause_and_check = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            vm.pause()
                .map_err(|e| format!("pause: {}", error_chain(&e)))?;
            let members = group_members(&groups);
            ensure!(
                members.len() >= groups.len(),
                "VM processes {members:?} for groups {groups:?}"
            );
            for &p in &members {
                let states = thread_states(p);
                ensure!(
                    !states.is_empty() && states.iter().all(|&s| s == 'T'),
                    "process {p} not frozen while paused: {states:?}"
                );
            }
            ensure!(vm.machine().is_paused(), "the machine does not say paused");
            let r = vm.exec("true").await;
            ensure!(
                r.as_ref().is_err_and(is_paused),
                "exec while paused: {:?}",
                r.map(|o| o.status)
            );
            // Longer than the command left to run: only the pause holds it back.
            tokio::time::sleep(Duration::from_secs(2)).await;
            vm.resume()
                .map_err(|e| format!("resume: {}", error_chain(&e)))?;
            for &p in &members {
                ensure!(
                    !thread_states(p).contains(&'T'),
                    "process {p} still stopped after resume"
                );
            }
            Ok(members)
        };
        let started = Instant::now();
        let (out, members) = tokio::join!(running, pause_and_check);
        let members = members?;
        let out = out.map_err(|e| format!("the command across the pause: {}", error_chain(&e)))?;
        let text = String::from_utf8_lossy(&out.output);
        ensure!(
            out.status.code == Some(0) && text.trim() == "slept",
            "the command across the pause: {:?} {text:?}",
            out.status
        );
        ensure!(
            started.elapsed() >= Duration::from_secs(2),
            "the command finished {:?} after it started, through a 2 s pause",
            started.elapsed()
        );
        eprintln!("    {} VM processes frozen and thawed", members.len());
        let again = vm
            .exec("echo after")
            .await
            .map_err(|e| format!("exec after resume: {}", error_chain(&e)))?;
        let text = String::from_utf8_lossy(&again.output);
        ensure!(text.trim() == "after", "exec after resume: {text:?}");
        Ok(())
    })
    .await;

    c.run("closing_a_paused_vm_leaves_nothing", async {
        vm.pause()
            .map_err(|e| format!("pause: {}", error_chain(&e)))?;
        let members = group_members(&groups);
        let t = Instant::now();
        vm.close().await;
        ensure!(
            t.elapsed() < Duration::from_secs(15),
            "closing a paused VM took {:?}",
            t.elapsed()
        );
        for p in members {
            ensure!(!pid_exists(p), "VM process {p} left after close");
        }
        Ok(())
    })
    .await;
    c.finish()
}

#[test]
fn pause() {
    vm_tests::scenario("pause", scenario);
}
