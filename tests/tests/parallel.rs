//! Many guests at once: 20 booted concurrently on each driver, each running a command, three
//! rounds; every boot must succeed (no retry hides a race) and every failure prints its
//! console tail. Slow tier (`#[ignore]`: 60 guests on a 2-core host take minutes); run with
//! `cargo nextest run -p vm-tests --run-ignored ignored-only -E 'binary(parallel)'`.

use std::time::Instant;

use vm_tests::{GuestSpec, boot, exec_ok};

const AT_ONCE: usize = 20;
const ROUNDS: usize = 3;

/// One guest: boot, run a command that names it, close.
async fn one(driver: &'static str, round: usize, i: usize) -> Result<(), String> {
    let mut g = GuestSpec::new(&format!("par-{round}-{i}"));
    g.mem_mib = 128;
    let vm = boot(driver, &g).await?;
    let out = exec_ok(&vm, &format!("echo guest-{i}")).await;
    vm.close().await;
    let out = out?;
    vm_tests::ensure!(out == format!("guest-{i}\n"), "guest {i} said {out:?}");
    Ok(())
}

#[test]
#[ignore = "slow tier: 3 x 20 concurrent guests"]
fn twenty_guests_at_once_three_rounds() {
    vm_tests::scenario("parallel", |driver| async move {
        let mut failures = Vec::new();
        for round in 0..ROUNDS {
            let t0 = Instant::now();
            let tasks: Vec<_> = (0..AT_ONCE)
                .map(|i| tokio::spawn(one(driver, round, i)))
                .collect();
            let mut ok = 0;
            for (i, t) in tasks.into_iter().enumerate() {
                match t.await {
                    Ok(Ok(())) => ok += 1,
                    Ok(Err(e)) => failures.push(format!("round {round} guest {i}: {e}")),
                    Err(e) => failures.push(format!("round {round} guest {i}: task {e}")),
                }
            }
            eprintln!(
                "round {round}: {ok}/{AT_ONCE} in {:.1} s [{driver}]",
                t0.elapsed().as_secs_f64()
            );
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("\n\n"))
        }
    });
}
