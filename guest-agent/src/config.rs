//! Agent configuration, carried on the guest kernel command line.
//!
//! The host renders an [`AgentConfig`] with [`AgentConfig::to_cmdline`] into `vm.<key>=<value>`
//! words; the agent parses `/proc/cmdline` with [`AgentConfig::from_cmdline`] (words not starting
//! with `vm.` belong to the kernel and are ignored). Keys:
//! `vm.hostname=NAME`, `vm.pids=N`, `vm.mem=MIB`, `vm.port=PORT`, `vm.log=LEVEL`, and
//! `vm.disk=<id>:<guest_path>:<erofs|ext4|raw>` (repeatable). Values never contain spaces or
//! quotes, so the rendering needs no escaping.

use crate::AGENT_PORT;

/// Filesystem of a read-only disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFs {
    Erofs,
    Ext4,
    /// No filesystem: the block device itself appears at the guest path (read-only).
    Raw,
}

impl DiskFs {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFs::Erofs => "erofs",
            DiskFs::Ext4 => "ext4",
            DiskFs::Raw => "raw",
        }
    }
}

/// A read-only disk the agent mounts at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskMount {
    /// The virtio-blk serial (at most 20 bytes) identifying the device.
    pub id: String,
    /// Absolute guest path.
    pub guest_path: String,
    pub fs: DiskFs,
}

/// Everything the agent is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    pub hostname: String,
    /// `pids.max` of the work cgroup (`None` = unlimited).
    pub pids_max: Option<u32>,
    /// `memory.max` of the work cgroup in MiB (`None` = unlimited).
    pub mem_limit_mib: Option<u32>,
    pub disks: Vec<DiskMount>,
    /// vsock port to listen on.
    pub port: u32,
    /// Log level (`error`, `warn`, `info`, `debug`, `trace`).
    pub log: String,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            hostname: "vm".into(),
            pids_max: None,
            mem_limit_mib: None,
            disks: Vec::new(),
            port: AGENT_PORT,
            log: "info".into(),
        }
    }
}

/// Configuration errors; each names the key and the value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid value for vm.{key}: {value:?} ({why})")]
    Invalid {
        key: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("too many disks (max {max})")]
    TooManyDisks { max: usize },
}

/// Largest number of disks.
pub const MAX_DISKS: usize = 16;

fn invalid(key: &'static str, value: &str, why: &'static str) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: value.chars().take(128).collect(),
        why,
    }
}

fn plain(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\'' && b != b':')
}

impl AgentConfig {
    /// Check every field so that rendering and parsing round-trip.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let h = &self.hostname;
        if h.is_empty()
            || h.len() > 64
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return Err(invalid("hostname", h, "1-64 of [A-Za-z0-9.-]"));
        }
        if self.port == 0 {
            return Err(invalid("port", "0", "must be nonzero"));
        }
        if self.pids_max == Some(0) {
            return Err(invalid("pids", "0", "must be at least 1"));
        }
        if self.mem_limit_mib == Some(0) {
            return Err(invalid("mem", "0", "must be at least 1"));
        }
        if !matches!(
            self.log.as_str(),
            "error" | "warn" | "info" | "debug" | "trace"
        ) {
            return Err(invalid(
                "log",
                &self.log,
                "one of error|warn|info|debug|trace",
            ));
        }
        if self.disks.len() > MAX_DISKS {
            return Err(ConfigError::TooManyDisks { max: MAX_DISKS });
        }
        for d in &self.disks {
            if !plain(&d.id) || d.id.len() > 20 {
                return Err(invalid(
                    "disk",
                    &d.id,
                    "id: 1-20 printable bytes, no ':' or quotes",
                ));
            }
            let p = &d.guest_path;
            if !p.starts_with('/')
                || p == "/"
                || !plain(p)
                || p.len() > 1024
                || p.split('/').any(|c| c == "..")
            {
                return Err(invalid(
                    "disk",
                    p,
                    "guest path: absolute, not /, no '..', ':' or spaces",
                ));
            }
        }
        Ok(())
    }

    /// Render as kernel command-line words (`vm.key=value ...`).
    pub fn to_cmdline(&self) -> Result<String, ConfigError> {
        self.validate()?;
        let mut w = vec![
            format!("vm.hostname={}", self.hostname),
            format!("vm.port={}", self.port),
        ];
        if let Some(p) = self.pids_max {
            w.push(format!("vm.pids={p}"));
        }
        if let Some(m) = self.mem_limit_mib {
            w.push(format!("vm.mem={m}"));
        }
        if self.log != "info" {
            w.push(format!("vm.log={}", self.log));
        }
        for d in &self.disks {
            w.push(format!(
                "vm.disk={}:{}:{}",
                d.id,
                d.guest_path,
                d.fs.as_str()
            ));
        }
        Ok(w.join(" "))
    }

    /// Parse the `vm.*` words of a kernel command line; other words are ignored, and so are
    /// unknown `vm.*` keys (returned in the second element, for logging).
    pub fn from_cmdline(cmdline: &str) -> Result<(AgentConfig, Vec<String>), ConfigError> {
        let mut c = AgentConfig::default();
        let mut unknown = Vec::new();
        for word in cmdline.split_ascii_whitespace() {
            let Some(kv) = word.strip_prefix("vm.") else {
                continue;
            };
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "hostname" => c.hostname = v.to_string(),
                "pids" => {
                    c.pids_max = Some(v.parse().map_err(|_| invalid("pids", v, "not a number"))?)
                }
                "mem" => {
                    c.mem_limit_mib =
                        Some(v.parse().map_err(|_| invalid("mem", v, "not a number"))?)
                }
                "port" => c.port = v.parse().map_err(|_| invalid("port", v, "not a number"))?,
                "log" => c.log = v.to_string(),
                "disk" => {
                    let mut it = v.split(':');
                    let (Some(id), Some(path), Some(fs), None) =
                        (it.next(), it.next(), it.next(), it.next())
                    else {
                        return Err(invalid("disk", v, "expected <id>:<guest_path>:<fs>"));
                    };
                    let fs = match fs {
                        "erofs" => DiskFs::Erofs,
                        "ext4" => DiskFs::Ext4,
                        "raw" => DiskFs::Raw,
                        _ => return Err(invalid("disk", v, "fs must be erofs, ext4 or raw")),
                    };
                    if c.disks.len() >= MAX_DISKS {
                        return Err(ConfigError::TooManyDisks { max: MAX_DISKS });
                    }
                    c.disks.push(DiskMount {
                        id: id.into(),
                        guest_path: path.into(),
                        fs,
                    });
                }
                _ => unknown.push(word.chars().take(128).collect()),
            }
        }
        c.validate()?;
        Ok((c, unknown))
    }
}
