//! Snapshots. On a driver that has them (kvm): a guest booted for snapshots, with a file
//! written, is snapshotted (the VM ends; the directory is 0700, its files 0600) and restored
//! a few seconds later as a new VM: `exec` works, the file is there, the guest's wall clock
//! was stepped to the host's, and the run directory and agent token are new. Two restores of
//! one snapshot at once are two VMs that share nothing writable. A state file with one byte
//! flipped, or of another format version, is refused with the reason, and nothing is left
//! running. On a driver without snapshots (tcg): a VM for snapshots is refused before it
//! boots, naming the reason.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vm_drivers::Registry;
use vm_sandbox::MicroVm;
use vm_tests::host::pid_exists;
use vm_tests::{Cases, GuestSpec, ensure, error_chain, exec_ok, options_for, spec_for};

fn host_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).map_or(0, |m| m.permissions().mode() & 0o777)
}

/// The guest's wall clock, in seconds since the epoch.
async fn guest_now(vm: &MicroVm) -> Result<u64, String> {
    let out = exec_ok(vm, "date +%s").await?;
    out.trim()
        .parse()
        .map_err(|e| format!("date +%s said {out:?}: {e}"))
}

/// Restores `dir`, printing the time from the call to the re-keyed agent answering
/// (`restore+agent ready in X ms`, beside the cold boots' `boot+agent ready` lines).
async fn restore(driver: &str, g: &GuestSpec, dir: &Path) -> Result<MicroVm, String> {
    let start = std::time::Instant::now();
    let vm = MicroVm::restore(dir.to_path_buf(), options_for(driver, g))
        .await
        .map_err(|e| format!("restoring {}: {}", dir.display(), error_chain(&e)))?;
    eprintln!(
        "restore+agent ready in {:.0} ms [{driver}]",
        start.elapsed().as_secs_f64() * 1000.0
    );
    Ok(vm)
}

/// A copy of the snapshot in `from` at `to` (holes kept), then `edit` applied to its state file.
fn tampered_copy(from: &Path, to: &Path, edit: impl FnOnce(&mut Vec<u8>)) -> Result<(), String> {
    let st = std::process::Command::new("cp")
        .args(["-a", "--sparse=always"])
        .arg(from)
        .arg(to)
        .status()
        .map_err(|e| format!("cp: {e}"))?;
    ensure!(
        st.success(),
        "cp -a {} {}: {st}",
        from.display(),
        to.display()
    );
    let state = to.join("vmstate");
    let mut bytes = std::fs::read(&state).map_err(|e| format!("{}: {e}", state.display()))?;
    edit(&mut bytes);
    std::fs::write(&state, bytes).map_err(|e| format!("{}: {e}", state.display()))
}

/// A restore of `dir` must fail naming `why`, leaving no run directory (the driver's error
/// means it left nothing running, and the sandbox removed what it had made).
async fn refused(driver: &str, g: &GuestSpec, dir: &Path, why: &str) -> Result<(), String> {
    match MicroVm::restore(dir.to_path_buf(), options_for(driver, g)).await {
        Ok(vm) => {
            vm.close().await;
            Err(format!("{} was restored", dir.display()))
        }
        Err(e) => {
            let chain = error_chain(&e);
            ensure!(chain.contains(why), "refusal without {why:?}: {chain}");
            let parent = g.run_dir_parent.as_deref().ok_or("no run dir parent")?;
            let left: Vec<_> = std::fs::read_dir(parent)
                .map_err(|e| e.to_string())?
                .flatten()
                .map(|e| e.file_name())
                .collect();
            ensure!(left.is_empty(), "left in {}: {left:?}", parent.display());
            Ok(())
        }
    }
}

async fn scenario(driver: &'static str) -> Result<(), String> {
    let can = Registry::with_defaults()
        .get(driver)
        .map(|d| d.snapshots())
        .ok_or_else(|| format!("no driver {driver}"))?;
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = tmp.path().join("snapshots");
    let mut g = GuestSpec::new("snapshot");
    g.run_dir_parent = Some(tmp.path().join("run"));
    let mut options = options_for(driver, &g);
    options.snapshots = Some(store.clone());
    let mut c = Cases::new("snapshot", driver);
    let snap = store.join("base");
    if !can.ok {
        c.run("refused_before_booting_naming_why", async {
            let e = MicroVm::boot(spec_for(&g)?, options.clone())
                .await
                .err()
                .ok_or("a VM for snapshots booted")?;
            let chain = error_chain(&e);
            ensure!(chain.contains(&can.detail), "refusal: {chain}");
            let parent = g.run_dir_parent.as_deref().ok_or("no run dir parent")?;
            ensure!(
                std::fs::read_dir(parent).map_or(true, |mut d| d.next().is_none()),
                "a run dir was made in {}",
                parent.display()
            );
            Ok(())
        })
        .await;
        return c.finish();
    }
    let vm = MicroVm::boot(spec_for(&g)?, options)
        .await
        .map_err(|e| format!("booting for snapshots: {}", error_chain(&e)))?;

    c.run(
        "restored_vm_has_the_files_a_new_token_and_the_hosts_clock",
        async {
            vm.write_file("kept.txt", b"written before the snapshot")
                .await
                .map_err(|e| format!("write_file: {}", error_chain(&e)))?;
            let old_pids = vm.machine().host_pids();
            let taken_at = guest_now(&vm).await?;
            let record = vm
                .snapshot(&snap)
                .await
                .map_err(|e| format!("snapshot: {}", error_chain(&e)))?;
            eprintln!(
                "    snapshot: {} bytes of state, {} of {} bytes of memory written, in {} us",
                record.state_bytes, record.memory_written, record.memory_bytes, record.took_us
            );
            ensure!(
                !vm.machine().is_running(),
                "the VM runs on after its snapshot"
            );
            ensure!(mode(&snap) == 0o700, "snapshot dir mode {:o}", mode(&snap));
            for f in ["vmstate", "memory", "snapshot.json", "agent.token"] {
                ensure!(
                    mode(&snap.join(f)) == 0o600,
                    "{f}: mode {:o}",
                    mode(&snap.join(f))
                );
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            let host_before = host_now();
            let r = restore(driver, &g, &snap).await?;
            let text = r
                .read_file("kept.txt")
                .await
                .map_err(|e| format!("read_file after restore: {}", error_chain(&e)))?;
            ensure!(text == b"written before the snapshot", "kept.txt: {text:?}");
            let now = guest_now(&r).await?;
            ensure!(
                now >= taken_at + 3 && now + 2 >= host_before && now <= host_now() + 2,
                "guest clock {now} after restore: taken at {taken_at}, host {host_before}..{}",
                host_now()
            );
            ensure!(
                r.run_dir() != vm.run_dir(),
                "the restore reused the run dir"
            );
            let new_token =
                std::fs::read(r.run_dir().join("agent.token")).map_err(|e| e.to_string())?;
            let old_token = std::fs::read(snap.join("agent.token")).map_err(|e| e.to_string())?;
            ensure!(
                new_token != old_token,
                "the restored VM kept the snapshot's token"
            );
            ensure!(
                r.machine().host_pids() != old_pids,
                "the restore runs in the old processes"
            );
            r.close().await;
            Ok(())
        },
    )
    .await;

    c.run("two_restores_at_once_share_nothing_writable", async {
        let (a, b) = tokio::join!(restore(driver, &g, &snap), restore(driver, &g, &snap));
        let (a, b) = (a?, b?);
        exec_ok(&a, "echo a > only-in-a").await?;
        let seen = exec_ok(&b, "ls only-in-a 2>&1 || echo absent").await?;
        ensure!(seen.contains("absent"), "b sees a's file: {seen:?}");
        ensure!(
            exec_ok(&a, "cat only-in-a").await?.trim() == "a",
            "a lost its file"
        );
        let (pa, pb) = (a.machine().host_pids(), b.machine().host_pids());
        ensure!(pa != pb, "one process for both: {pa:?}");
        a.close().await;
        b.close().await;
        for p in pa.into_iter().chain(pb) {
            ensure!(!pid_exists(p), "VM process {p} left after close");
        }
        Ok(())
    })
    .await;

    c.run("a_tampered_or_foreign_state_file_is_refused", async {
        let flipped = tmp.path().join("flipped");
        tampered_copy(&snap, &flipped, |b| {
            let at = b.len() / 2;
            b[at] ^= 0x40;
        })?;
        refused(driver, &g, &flipped, "checksum mismatch").await?;
        let foreign = tmp.path().join("foreign");
        tampered_copy(&snap, &foreign, |b| {
            b[8..12].copy_from_slice(&9u32.to_le_bytes())
        })?;
        refused(driver, &g, &foreign, "state format version 9").await
    })
    .await;

    vm.close().await;
    c.finish()
}

#[test]
fn snapshot() {
    vm_tests::scenario("snapshot", scenario);
}
