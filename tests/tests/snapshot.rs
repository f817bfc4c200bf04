//! Snapshots. On a driver that has them (kvm): a guest booted for snapshots, with a file
//! written, is snapshotted (the VM ends; the directory is 0700, its files 0600, all of it the
//! user's own, none left to the jail's reusable uid) and restored a few seconds later as a new
//! VM: `exec` works, the file is there, the guest's wall clock was stepped to the host's, and
//! the run directory and agent token are new. Two restores of one snapshot at once are two
//! VMs that share nothing writable and nothing random: a guest process that seeded a
//! generator before the snapshot draws the same numbers in both (the hazard), one that seeds
//! again when `/run/vm/generation` changes (the restore hook) draws different ones, and each
//! has a `boot_id` of its own. A snapshot directory someone else could write (open to others,
//! `snapshot.json` a symbolic link, `memory` writable by others, another owner) is refused
//! naming the file before anything boots; a state file with one byte flipped, or of another
//! format version, is refused with the reason; nothing is left running. On a driver without
//! snapshots (tcg): a VM for snapshots is refused before it boots, naming the reason.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vm_agent_protocol::{Command, ServeRequest};
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

/// A guest process that seeds ash's `$RANDOM` from the kernel before the snapshot, then, once
/// `/tmp/draw` exists, writes four draws to `/tmp/plain`: what a server that seeded its
/// generator at start does.
const PLAIN_RNG: &str = "RANDOM=$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); : > /tmp/plain-seeded; \
    while [ ! -e /tmp/draw ]; do sleep 0.1; done; \
    echo $RANDOM $RANDOM $RANDOM $RANDOM > /tmp/plain.tmp && mv /tmp/plain.tmp /tmp/plain";

/// The same, with the restore hook docs/usage.md describes: it seeds again from the kernel
/// when `/run/vm/generation` changes, then writes the generation and four draws to
/// `/tmp/hooked`.
const HOOKED_RNG: &str = "RANDOM=$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
    seen=$(cat /run/vm/generation 2>/dev/null || echo 0); : > /tmp/hooked-seeded; \
    while [ \"$(cat /run/vm/generation 2>/dev/null || echo 0)\" = \"$seen\" ]; do sleep 0.1; done; \
    RANDOM=$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
    echo $(cat /run/vm/generation) $RANDOM $RANDOM $RANDOM $RANDOM > /tmp/hooked.tmp && \
    mv /tmp/hooked.tmp /tmp/hooked";

/// Starts [`PLAIN_RNG`] and [`HOOKED_RNG`] as long-lived guest processes and waits until both
/// have seeded.
async fn start_generators(vm: &MicroVm, g: &GuestSpec) -> Result<(), String> {
    for script in [PLAIN_RNG, HOOKED_RNG] {
        let req = ServeRequest {
            command: Command::Shell(script.into()),
            env: g.env.clone(),
            cwd: None,
            user: None,
        };
        vm.machine()
            .call(|c| c.serve_start(req))
            .await
            .map_err(|e| format!("starting a generator: {}", error_chain(&e)))?;
    }
    wait_for(
        vm,
        "/tmp/plain-seeded /tmp/hooked-seeded",
        Duration::from_secs(30),
    )
    .await
}

/// Waits until every file of `files` exists in the guest.
async fn wait_for(vm: &MicroVm, files: &str, within: Duration) -> Result<(), String> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let out = exec_ok(
            vm,
            &format!("for f in {files}; do [ -e $f ] || echo missing $f; done"),
        )
        .await?;
        if out.trim().is_empty() {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "after {within:?}: {}",
            out.trim()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What one restore's generators drew: `/tmp/plain`, `/tmp/hooked`, and its `boot_id`.
async fn draws(vm: &MicroVm) -> Result<(String, String, String), String> {
    exec_ok(vm, "touch /tmp/draw").await?;
    wait_for(vm, "/tmp/plain /tmp/hooked", Duration::from_secs(30))
        .await
        .map_err(|e| format!("the generators did not draw (no restore hook?): {e}"))?;
    let read = |f: &'static str| async move {
        exec_ok(vm, &format!("cat {f}"))
            .await
            .map(|s| s.trim().to_string())
    };
    Ok((
        read("/tmp/plain").await?,
        read("/tmp/hooked").await?,
        read("/proc/sys/kernel/random/boot_id").await?,
    ))
}

/// Each tampering of the snapshot `snap` a local user who could write it might do, applied in
/// place and undone: a restore must be refused naming the file, before anything boots.
async fn tamperings_are_refused(driver: &str, g: &GuestSpec, snap: &Path) -> Result<(), String> {
    use std::os::unix::fs::{chown, symlink};
    let chmod = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
            .map_err(|e| format!("chmod {}: {e}", p.display()))
    };
    let (record, memory) = (snap.join("snapshot.json"), snap.join("memory"));
    chmod(snap, 0o777)?;
    let r = refused(
        driver,
        g,
        snap,
        &format!("{} must belong to uid", snap.display()),
    )
    .await;
    chmod(snap, 0o700)?;
    r?;
    chmod(&memory, 0o666)?;
    let r = refused(
        driver,
        g,
        snap,
        &format!("{} must belong to uid", memory.display()),
    )
    .await;
    chmod(&memory, 0o600)?;
    r?;
    let real = snap.join("real.json");
    std::fs::rename(&record, &real).map_err(|e| e.to_string())?;
    symlink("real.json", &record).map_err(|e| e.to_string())?;
    let r = refused(driver, g, snap, &format!("{}", record.display())).await;
    std::fs::remove_file(&record).map_err(|e| e.to_string())?;
    std::fs::rename(&real, &record).map_err(|e| e.to_string())?;
    r?;
    let me = std::fs::metadata(snap).map_err(|e| e.to_string())?;
    let entries: Vec<_> = std::fs::read_dir(snap)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .collect();
    let give = |uid: u32, gid: u32| -> Result<(), String> {
        for p in entries.iter().map(|p| p.as_path()).chain([snap]) {
            chown(p, Some(uid), Some(gid)).map_err(|e| format!("chown {}: {e}", p.display()))?;
        }
        Ok(())
    };
    give(1234, 1234)?;
    let r = refused(driver, g, snap, "belongs to uid 1234").await;
    give(me.uid(), me.gid())?;
    r
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
            start_generators(&vm, &g).await?;
            // Read before the snapshot: the kernel made it then, and the snapshot holds it.
            let booted_id = exec_ok(&vm, "cat /proc/sys/kernel/random/boot_id").await?;
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
            let me = nix::unistd::geteuid().as_raw();
            for f in ["", "vmstate", "memory", "snapshot.json", "agent.token"] {
                let p = snap.join(f);
                ensure!(
                    f.is_empty() || mode(&p) == 0o600,
                    "{f}: mode {:o}",
                    mode(&p)
                );
                let owner = std::fs::metadata(&p).map_err(|e| e.to_string())?.uid();
                ensure!(
                    owner == me,
                    "{} belongs to uid {owner}, not {me}",
                    p.display()
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
            ensure!(r.generation() == 1, "generation {}", r.generation());
            let restored_id = exec_ok(
                &r,
                "cat /run/vm/generation; cat /proc/sys/kernel/random/boot_id",
            )
            .await?;
            ensure!(
                restored_id.lines().next() == Some("1") && !restored_id.contains(booted_id.trim()),
                "after the restore: {restored_id:?} (boot_id before: {booted_id:?})"
            );
            r.close().await;
            Ok(())
        },
    )
    .await;

    c.run("two_restores_at_once_share_nothing_writable_or_random", async {
        let (a, b) = tokio::join!(restore(driver, &g, &snap), restore(driver, &g, &snap));
        let (a, b) = (a?, b?);
        let ((plain_a, hooked_a, id_a), (plain_b, hooked_b, id_b)) = (draws(&a).await?, draws(&b).await?);
        eprintln!("    seeded before the snapshot: {plain_a:?} and {plain_b:?}; after the hook: {hooked_a:?} and {hooked_b:?}");
        ensure!(
            plain_a == plain_b,
            "a generator seeded before the snapshot drew {plain_a:?} and {plain_b:?}: the restores were not of one state"
        );
        ensure!(
            hooked_a.starts_with("1 ") && hooked_b.starts_with("1 ") && hooked_a != hooked_b,
            "after the restore hook: {hooked_a:?} and {hooked_b:?}"
        );
        ensure!(id_a != id_b, "one boot_id for both restores: {id_a}");
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

    c.run(
        "a_snapshot_others_could_write_is_refused_naming_the_file",
        async { tamperings_are_refused(driver, &g, &snap).await },
    )
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
