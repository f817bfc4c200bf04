//! `vm stats`: what named VMs cost the host now (as `docker stats --no-stream`): CPU use over
//! a one-second sample, resident memory and process count of every host process of each VM
//! (`vm_sandbox::sys::group_usage` over the process groups its record lists), beside the
//! guest's memory.

use std::time::{Duration, Instant};

use serde_json::json;
use vm_sandbox::sys::{self, Usage};

use crate::args::StatsArgs;
use crate::exit;
use crate::output::{Table, print_json, print_table};
use crate::state::{Record, Runtime, VmState};

/// The CPU sample.
const SAMPLE: Duration = Duration::from_secs(1);

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
        .map(|r| sys::group_usage(&groups(r)))
        .collect();
    let t0 = Instant::now();
    tokio::time::sleep(SAMPLE).await;
    let after: Vec<Usage> = records
        .iter()
        .map(|r| sys::group_usage(&groups(r)))
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
