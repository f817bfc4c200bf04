//! Wall: a guest with a 5 s lifetime is torn down by itself; its host processes, sockets and
//! run directory are gone afterwards.

use std::path::Path;
use std::time::{Duration, Instant};

use vm_drivers::MachineError;
use vm_sandbox::SandboxError;
use vm_tests::host::{children_named, pid_exists};
use vm_tests::{Cases, Ctx, GuestSpec, boot, ensure, error_chain};

const WALL: Duration = Duration::from_secs(5);

/// Every file (not directory) under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else {
                out.push(e.path().display().to_string());
            }
        }
    }
    out
}

fn is_wall_expired(e: &SandboxError) -> bool {
    matches!(
        e,
        SandboxError::Machine {
            source: MachineError::WallExpired { .. },
            ..
        }
    )
}

async fn scenario(driver: &'static str) -> Result<(), String> {
    let parent = tempfile::tempdir().ctx("temp dir")?;
    let mut g = GuestSpec::new("wall");
    g.wall = WALL;
    g.run_dir_parent = Some(parent.path().to_path_buf());
    let vm = boot(driver, &g).await?;
    let booted = Instant::now();
    let me = std::process::id();
    let pids: Vec<u32> = vm
        .machine()
        .host_pids()
        .into_iter()
        .filter(|&p| p != me)
        .collect();
    let mut c = Cases::new("wall", driver);

    c.run("running_before_the_wall", async {
        ensure!(vm.machine().is_running(), "not running right after boot");
        for &p in &pids {
            ensure!(
                pid_exists(p),
                "host pid {p} of the VM does not exist while it runs"
            );
        }
        let files = files_under(parent.path());
        ensure!(
            !files.is_empty(),
            "the run directory holds no sockets while the VM runs"
        );
        eprintln!("    host pids {pids:?}, run files {files:?}");
        Ok(())
    })
    .await;

    c.run("torn_down_by_itself", async {
        // An exec that would outlive the wall is cut off by it, not left hanging.
        let r = vm.exec("sleep 60").await;
        let after = booted.elapsed();
        match r {
            Ok(out) => {
                return Err(format!(
                    "sleep 60 finished after {after:?}: {:?}",
                    out.status
                ));
            }
            Err(e) => ensure!(
                is_wall_expired(&e),
                "sleep 60 failed, but not by the wall: {}",
                error_chain(&e)
            ),
        }
        ensure!(
            after < WALL + Duration::from_secs(10),
            "the exec ended {after:?} after boot"
        );
        ensure!(
            after + Duration::from_secs(2) >= WALL,
            "the exec ended {after:?} after boot, before the wall"
        );
        ensure!(
            vm.machine().wall_expired(),
            "the machine does not report wall expiry"
        );
        ensure!(
            !vm.machine().is_running(),
            "the machine still reports running"
        );
        let again = vm.exec("true").await;
        ensure!(
            again.as_ref().is_err_and(is_wall_expired),
            "exec after the wall: {again:?}"
        );
        Ok(())
    })
    .await;

    c.run("host_processes_gone", async {
        // The watchdog marks the machine expired, then kills and reaps: allow it a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|&p| pid_exists(p)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for &p in &pids {
            ensure!(
                !pid_exists(p),
                "host pid {p} still exists 5 s after the wall"
            );
        }
        eprintln!("    host pids gone {:?} after boot", booted.elapsed());
        for name in ["qemu-system", "vm-vsock"] {
            let left = children_named(name);
            ensure!(left.is_empty(), "{name} children left: {left:?}");
        }
        // The sandbox's owner record stays until the MicroVm is closed (it lets a later `vm`
        // sweep the directory should this process die); the driver's files must be gone.
        let files: Vec<_> = files_under(parent.path())
            .into_iter()
            .filter(|f| !f.ends_with(&format!("/{}", vm_sandbox::rundir::OWNER_FILE)))
            .collect();
        ensure!(files.is_empty(), "run files left after the wall: {files:?}");
        Ok(())
    })
    .await;

    vm.close().await;
    c.run("run_dir_removed", async {
        let left: Vec<_> = std::fs::read_dir(parent.path())
            .ctx("reading run parent")?
            .flatten()
            .map(|e| e.path())
            .collect();
        ensure!(
            left.is_empty(),
            "left in the run dir parent after close: {left:?}"
        );
        Ok(())
    })
    .await;
    c.finish()
}

#[test]
fn wall() {
    vm_tests::scenario("wall", scenario);
}
