//! A container's metrics in containerd's cgroup v1 format (`io.containerd.cgroups.v1.Metrics`,
//! what `ctr task metrics` and the CRI plugin decode), from the VM's host processes: the VM
//! is the container, so its CPU time, resident memory (the guest RAM it has touched, plus the
//! VMM or emulator) and process count are what the container costs the host. There is no
//! cgroup behind them: the fields a cgroup alone knows (page cache, throttling, blkio) stay 0.

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat,
};
use vm_sys::control::Usage;

/// The metrics of a VM using `u`, whose guest has `limit_bytes` of memory.
pub fn of(u: &Usage, limit_bytes: u64) -> Metrics {
    Metrics {
        pids: Some(PidsStat {
            current: u.processes,
            ..Default::default()
        })
        .into(),
        cpu: Some(CPUStat {
            usage: Some(CPUUsage {
                total: u.user_ns + u.system_ns,
                kernel: u.system_ns,
                user: u.user_ns,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        })
        .into(),
        memory: Some(MemoryStat {
            rss: u.rss_bytes,
            total_rss: u.rss_bytes,
            usage: Some(MemoryEntry {
                usage: u.rss_bytes,
                limit: limit_bytes,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        })
        .into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim::protos::protobuf::Message;

    #[test]
    fn usage_becomes_cgroup_v1_metrics_under_containerds_type_name() {
        let u = Usage {
            processes: 4,
            user_ns: 3_000,
            system_ns: 2_000,
            rss_bytes: 300 << 20,
        };
        let any = containerd_shim::util::convert_to_any(Box::new(of(&u, 256 << 20))).unwrap();
        assert_eq!(any.type_url, "io.containerd.cgroups.v1.Metrics");
        let back = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(back.pids.current, 4);
        assert_eq!(back.cpu.usage.total, 5_000);
        assert_eq!(back.cpu.usage.kernel, 2_000);
        assert_eq!(back.memory.usage.usage, 300 << 20);
        assert_eq!(back.memory.usage.limit, 256 << 20);
    }
}
