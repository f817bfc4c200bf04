//! `vm ps`, `vm stop`, `vm rm`, `vm logs`: managing named VMs through their records.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::json;
use vm_sys::control::{self, Signal};

use crate::args::{LogsArgs, PsArgs, RmArgs, StopArgs};
use crate::exit;
use crate::output::{Table, errln, outln, print_json, print_table};
use crate::parse::fmt_duration;
use crate::state::{self, Runtime, VmState, labels};

/// How often stop/logs poll a supervisor.
const POLL: Duration = Duration::from_millis(100);

/// `vm ps`.
pub async fn ps(a: PsArgs) -> anyhow::Result<u8> {
    let rt = Runtime::from_env()?;
    let records = rt.ps()?;
    if a.json {
        let list: Vec<_> = records
            .iter()
            .map(|r| {
                let st = r.effective_state();
                json!({
                    "name": r.name,
                    "state": st.as_str(),
                    "driver": r.driver,
                    "containment": r.containment,
                    "uptime_s": r.uptime(st).map(|d| d.as_secs()),
                    "mem_mib": r.mem_mib,
                    "vcpus": r.vcpus,
                    "created_unix": r.created_unix,
                    "exit_reason": r.exit_reason,
                    "supervisor_pid": r.supervisor.map(|p| p.pid),
                    "labels": r.labels,
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(list))?;
        return Ok(exit::OK);
    }
    let mut t = Table::new(&["NAME", "DRIVER", "STATE", "UPTIME", "MEMORY", "LABELS"]);
    for r in &records {
        let st = r.effective_state();
        let labels: Vec<String> = r
            .labels
            .iter()
            .filter(|(k, _)| k.as_str() != labels::CLI && k.as_str() != labels::NAME)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        t.row(vec![
            r.name.clone(),
            r.driver.clone().unwrap_or_else(|| "-".into()),
            st.as_str().into(),
            r.uptime(st).map(fmt_duration).unwrap_or_else(|| "-".into()),
            format!("{}M", r.mem_mib),
            labels.join(","),
        ]);
    }
    print_table(&t)?;
    Ok(exit::OK)
}

/// Stops one VM: SIGTERM to its supervisor, wait up to `grace`, then SIGKILL the
/// supervisor's process group and any VM process left. Returns false if it was not running.
pub async fn stop_one(rt: &Runtime, name: &str, grace: Duration) -> anyhow::Result<bool> {
    let mut r = rt.load(name)?;
    let Some(sup) = r.supervisor.filter(|p| p.alive()) else {
        rt.reap_stale(&mut r)?;
        return Ok(false);
    };
    tracing::info!(pid = sup.pid, "asking the supervisor of {name} to stop");
    // The supervisor's identity (pid + start time) was just verified.
    if let Err(e) = control::signal(sup.pid, Signal::Terminate) {
        tracing::debug!(pid = sup.pid, error = %e, "the supervisor is already gone");
    }
    let deadline = Instant::now() + grace;
    while sup.alive() && Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
    }
    if sup.alive() {
        tracing::warn!("{name}: supervisor did not stop within {grace:?}; killing it");
        // The supervisor leads its own session and process group (setsid); kill the group
        // so VM helper processes it started go too.
        if let Err(e) = control::signal_group(sup.pid, Signal::Kill) {
            tracing::debug!(pid = sup.pid, error = %e, "the supervisor's group is already gone");
        }
        let until = Instant::now() + Duration::from_secs(5);
        while sup.alive() && Instant::now() < until {
            tokio::time::sleep(POLL).await;
        }
    }
    let mut r = rt.load(name)?;
    state::kill_leftovers(&r);
    rt.reap_stale(&mut r)?;
    Ok(true)
}

/// `vm stop NAME…`.
pub async fn stop(a: StopArgs) -> anyhow::Result<u8> {
    let rt = Runtime::from_env()?;
    let mut code = exit::OK;
    for name in &a.names {
        match stop_one(&rt, name, Duration::from_secs(a.time)).await {
            Ok(_) => outln!("{name}"),
            Err(e) => {
                errln!("vm: stop {name}: {}", exit::one_line(&e));
                code = exit::classify(&e);
            }
        }
    }
    Ok(code)
}

/// `vm rm [-f] NAME…`.
pub async fn rm(a: RmArgs) -> anyhow::Result<u8> {
    let rt = Runtime::from_env()?;
    let mut code = exit::OK;
    for name in &a.names {
        let result = async {
            let mut r = rt.load(name)?;
            rt.reap_stale(&mut r)?;
            if r.effective_state() != VmState::Exited {
                if !a.force {
                    return Err(exit::usage(format!(
                        "{name} is {}; stop it first (`vm stop {name}`) or use `vm rm -f {name}`",
                        r.effective_state().as_str()
                    )));
                }
                stop_one(&rt, name, Duration::from_secs(10)).await?;
            }
            rt.remove(name)?;
            anyhow::Ok(())
        }
        .await;
        match result {
            Ok(()) => outln!("{name}"),
            Err(e) => {
                errln!("vm: rm {name}: {}", exit::one_line(&e));
                code = exit::classify(&e);
            }
        }
    }
    Ok(code)
}

/// `vm logs [-f] [--console|--vmm] NAME`: the VM's console (a bounded tail the supervisor
/// refreshes every second in `console.log`), or for a `vm serve` VM its server's output
/// (`server.log`, the same way) unless `--console`, or with `--vmm` its VMM's log
/// (`vmm.log`, where its backend keeps one: kvm). With `-f`, new output is printed until the VM exits.
pub async fn logs(a: LogsArgs) -> anyhow::Result<u8> {
    let rt = Runtime::from_env()?;
    let record = rt.load(&a.name)?;
    let file = if a.vmm {
        match record.driver.as_deref() {
            Some(other) if !record.vmm_log => {
                return Err(exit::failed(format!(
                    "VM {} runs on the {other} driver, which has no VMM log of ours \
                     (its emulator's output is in `vm logs --console`)",
                    a.name
                )));
            }
            // Its backend keeps one, or (still starting) may: the file appears if it does.
            _ => crate::supervisor::VMM_LOG,
        }
    } else if record.labels.contains_key(labels::SERVE) && !a.console {
        crate::supervisor::SERVER_LOG
    } else {
        crate::supervisor::CONSOLE_LOG
    };
    let console = rt.dir(&a.name).join(file);
    let mut printed = String::new();
    loop {
        let cur = match std::fs::read(&console) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(anyhow::Error::new(e).context(console.display().to_string())),
        };
        let new = unseen(&printed, &cur);
        if !new.is_empty() {
            let mut out = std::io::stdout().lock();
            out.write_all(new.as_bytes())?;
            out.flush()?;
        }
        printed = cur;
        let running = rt
            .load(&a.name)
            .map(|r| r.effective_state() != VmState::Exited)
            .unwrap_or(false);
        if !a.follow || !running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(exit::OK)
}

/// The part of the console snapshot `cur` not in the previous snapshot `prev`. The console
/// is a bounded ring, so old text falls off the front: the new text starts after the last
/// occurrence of the end of `prev`.
fn unseen<'a>(prev: &str, cur: &'a str) -> &'a str {
    if prev.is_empty() {
        return cur;
    }
    if let Some(rest) = cur.strip_prefix(prev) {
        return rest;
    }
    let mut start = prev.len().saturating_sub(64);
    while !prev.is_char_boundary(start) {
        start += 1;
    }
    let anchor = &prev[start..];
    match cur.rfind(anchor) {
        Some(i) => &cur[i + anchor.len()..],
        None => cur,
    }
}

#[cfg(test)]
mod tests {
    use super::unseen;

    #[test]
    fn unseen_console_text() {
        assert_eq!(unseen("", "abc"), "abc");
        assert_eq!(unseen("abc", "abcdef"), "def");
        assert_eq!(unseen("abc", "abc"), "");
        // The ring dropped its head: continue after the previous tail.
        let prev: String = (0..100)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let cur = format!("{}xyz", &prev[30..]);
        assert_eq!(unseen(&prev, &cur), "xyz");
        assert_eq!(unseen("old text", "entirely new"), "entirely new");
    }
}
