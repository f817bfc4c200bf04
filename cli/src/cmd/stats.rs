//! `vm stats`: what named VMs cost the host now (as `docker stats --no-stream`): CPU use over
//! a one-second sample, resident memory and process count of every host process of each VM
//! (`vm_sys::control::group_usage` over the process groups its record lists), beside the
//! guest's memory. With `--json`, each VM on our own VMM (kvm) also carries its device
//! counters (`vmm_devices`, the `metrics.json` its supervisor refreshes every second); for
//! other drivers that field is `null`: they have no such counters, and zeros would lie.

use std::time::{Duration, Instant};

use serde_json::json;
use vm_sys::control::{self, Usage};

use crate::args::StatsArgs;
use crate::exit;
use crate::output::{Table, print_json, print_table};
use crate::state::{Record, Runtime, VmState};

/// The CPU sample.
const SAMPLE: Duration = Duration::from_secs(1);

/// The device counters the supervisor of `r` last saved (`null` when there are none: a
/// backend without them, or none saved yet).
fn vmm_devices(rt: &Runtime, r: &Record) -> serde_json::Value {
    if !r.device_metrics {
        return serde_json::Value::Null;
    }
    std::fs::read(rt.dir(&r.name).join(crate::supervisor::METRICS_JSON))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn groups(r: &Record) -> Vec<u32> {
    r.host_pids
        .iter()
        .filter(|p| p.alive())
        .map(|p| p.pid)
        .collect()
}

/// `vm stats [--json] [NAME…]`: the named VMs, or every running or paused one.
pub async fn run(a: StatsArgs) -> anyhow::Result<u8> {
    let rt = Runtime::from_env()?;
    let mut records = Vec::new();
    if a.names.is_empty() {
        for mut r in rt.list()? {
            rt.reap_stale(&mut r)?;
            if matches!(r.effective_state(), VmState::Running | VmState::Paused) {
                records.push(r);
            }
        }
    } else {
        for name in &a.names {
            let mut r = rt.load(name)?;
            rt.reap_stale(&mut r)?;
            let st = r.effective_state();
            if !matches!(st, VmState::Running | VmState::Paused) {
                return Err(exit::failed(format!("VM {name} is {}", st.as_str())));
            }
            records.push(r);
        }
    }
    let before: Vec<Usage> = records
        .iter()
        .map(|r| control::group_usage(&groups(r)))
        .collect();
    let t0 = Instant::now();
    tokio::time::sleep(SAMPLE).await;
    let after: Vec<Usage> = records
        .iter()
        .map(|r| control::group_usage(&groups(r)))
        .collect();
    let elapsed_ns = t0.elapsed().as_nanos().max(1) as f64;
    let cpu = |b: &Usage, a: &Usage| {
        let used = (a.user_ns + a.system_ns).saturating_sub(b.user_ns + b.system_ns);
        used as f64 * 100.0 / elapsed_ns
    };
    if a.json {
        let list: Vec<_> = records
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(r, (b, u))| {
                json!({
                    "name": r.name,
                    "state": r.effective_state().as_str(),
                    "cpu_percent": (cpu(b, u) * 10.0).round() / 10.0,
                    "host_rss_bytes": u.rss_bytes,
                    "host_processes": u.processes,
                    "guest_mem_mib": r.mem_mib,
                    "vmm_devices": vmm_devices(&rt, r),
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(list))?;
        return Ok(exit::OK);
    }
    let mut t = Table::new(&["NAME", "STATE", "CPU %", "HOST MEM", "PROCS", "GUEST MEM"]);
    for (r, (b, u)) in records.iter().zip(before.iter().zip(&after)) {
        t.row(vec![
            r.name.clone(),
            r.effective_state().as_str().into(),
            format!("{:.1}", cpu(b, u)),
            format!("{}M", u.rss_bytes >> 20),
            u.processes.to_string(),
            format!("{}M", r.mem_mib),
        ]);
    }
    print_table(&t)?;
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmm_devices_are_the_saved_counters_of_a_kvm_vm_else_null() {
        let tmp = tempfile::tempdir().unwrap();
        let rt = Runtime::at(tmp.path().join("vm")).unwrap();
        let mut r = Record::starting(
            "box",
            &vm_spec::Limits::default(),
            vm_spec::Trust::Untrusted,
            serde_json::Value::Null,
        );
        rt.create(&r).unwrap();
        let saved = json!({"devices": [{"name": "virtio-rng", "requests": 2, "bytes": 64,
            "errors": 0, "rate_limited": 0}], "log_suppressed": 0});
        let file = rt.dir("box").join(crate::supervisor::METRICS_JSON);
        std::fs::write(&file, saved.to_string()).unwrap();
        // Not (yet) known to have counters, or on a backend without them: null, not zeros.
        assert!(vmm_devices(&rt, &r).is_null());
        r.driver = Some("tcg".into());
        assert!(vmm_devices(&rt, &r).is_null());
        r.device_metrics = true;
        assert_eq!(vmm_devices(&rt, &r), saved);
        std::fs::write(&file, b"{half").unwrap();
        assert!(vmm_devices(&rt, &r).is_null());
    }
}
