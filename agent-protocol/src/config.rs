//! Agent configuration, carried on the guest kernel command line.
//!
//! The host renders an [`AgentConfig`] with [`AgentConfig::to_cmdline`] into `vm.<key>=<value>`
//! words; the agent parses `/proc/cmdline` with [`AgentConfig::from_cmdline`] (words not starting
//! with `vm.` belong to the kernel and are ignored). Keys:
//! `vm.hostname=NAME`, `vm.pids=N`, `vm.mem=MIB`, `vm.port=PORT`, `vm.log=LEVEL`, and
//! `vm.disk=<id>:<guest_path>:<erofs|ext4|raw>` (repeatable), `vm.share=<tag>:<guest_path>:<dir|file>[:dax]`
//! (repeatable: a read-only virtio-fs share, one host mount, mounted by its tag; `dax` when the
//! device has a DAX window), and `vm.root=<id>:<erofs|ext4>` (the read-only disk that becomes
//! the root every command runs in). Values never contain spaces or
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

/// What a share holds: a host directory, or one host file (the share is then a directory
/// holding only that file, which the agent binds at the guest path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareKind {
    Dir,
    File,
}

impl ShareKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareKind::Dir => "dir",
            ShareKind::File => "file",
        }
    }
}

/// A read-only virtio-fs share the agent mounts at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareMount {
    /// The device's tag (at most 36 bytes).
    pub tag: String,
    /// Absolute guest path.
    pub guest_path: String,
    pub kind: ShareKind,
    /// Mount with `dax=always` (the device has a DAX window).
    pub dax: bool,
}

/// The read-only disk that becomes the guest's root (under a tmpfs overlay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootDisk {
    /// The virtio-blk serial identifying the device.
    pub id: String,
    /// Erofs or ext4 (a raw root is refused).
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
    /// Read-only virtio-fs shares (every host mount).
    pub shares: Vec<ShareMount>,
    /// The image root, if any; `disks` and `shares` are then mounted inside it.
    pub root: Option<RootDisk>,
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
            shares: Vec::new(),
            root: None,
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
    #[error("too many shares (max {max})")]
    TooManyShares { max: usize },
}

/// Largest number of disks.
pub const MAX_DISKS: usize = 16;
/// Largest number of shares.
pub const MAX_SHARES: usize = 16;
/// Longest virtio-fs tag (the device's config field).
pub const MAX_TAG: usize = 36;

fn invalid(key: &'static str, value: &str, why: &'static str) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: value.chars().take(128).collect(),
        why,
    }
}

fn check_id(id: &str) -> Result<(), ConfigError> {
    if !plain(id) || id.len() > 20 {
        return Err(invalid(
            "disk",
            id,
            "id: 1-20 printable bytes, no ':' or quotes",
        ));
    }
    Ok(())
}

fn parse_fs(key: &'static str, v: &str, fs: &str) -> Result<DiskFs, ConfigError> {
    match fs {
        "erofs" => Ok(DiskFs::Erofs),
        "ext4" => Ok(DiskFs::Ext4),
        "raw" => Ok(DiskFs::Raw),
        _ => Err(invalid(key, v, "fs must be erofs, ext4 or raw")),
    }
}

fn plain(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\'' && b != b':')
}

fn check_guest_path(key: &'static str, p: &str) -> Result<(), ConfigError> {
    if !p.starts_with('/')
        || p == "/"
        || !plain(p)
        || p.len() > 1024
        || p.split('/').any(|c| c == "..")
    {
        return Err(invalid(
            key,
            p,
            "guest path: absolute, not /, no '..', ':' or spaces",
        ));
    }
    Ok(())
}

fn parse_share(v: &str) -> Result<ShareMount, ConfigError> {
    let bad = || invalid("share", v, "expected <tag>:<guest_path>:<dir|file>[:dax]");
    let mut it = v.split(':');
    let (Some(tag), Some(path), Some(kind)) = (it.next(), it.next(), it.next()) else {
        return Err(bad());
    };
    let kind = match kind {
        "dir" => ShareKind::Dir,
        "file" => ShareKind::File,
        _ => return Err(bad()),
    };
    let dax = match (it.next(), it.next()) {
        (None, _) => false,
        (Some("dax"), None) => true,
        _ => return Err(bad()),
    };
    Ok(ShareMount {
        tag: tag.into(),
        guest_path: path.into(),
        kind,
        dax,
    })
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
        if let Some(r) = &self.root {
            check_id(&r.id)?;
            if r.fs == DiskFs::Raw {
                return Err(invalid("root", "raw", "the root must be erofs or ext4"));
            }
        }
        for d in &self.disks {
            check_id(&d.id)?;
            check_guest_path("disk", &d.guest_path)?;
        }
        if self.shares.len() > MAX_SHARES {
            return Err(ConfigError::TooManyShares { max: MAX_SHARES });
        }
        for s in &self.shares {
            if !plain(&s.tag) || s.tag.len() > MAX_TAG {
                return Err(invalid(
                    "share",
                    &s.tag,
                    "tag: 1-36 printable bytes, no ':' or quotes",
                ));
            }
            check_guest_path("share", &s.guest_path)?;
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
        if let Some(r) = &self.root {
            w.push(format!("vm.root={}:{}", r.id, r.fs.as_str()));
        }
        for d in &self.disks {
            w.push(format!(
                "vm.disk={}:{}:{}",
                d.id,
                d.guest_path,
                d.fs.as_str()
            ));
        }
        for s in &self.shares {
            let dax = if s.dax { ":dax" } else { "" };
            w.push(format!(
                "vm.share={}:{}:{}{dax}",
                s.tag,
                s.guest_path,
                s.kind.as_str()
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
                    let fs = parse_fs("disk", v, fs)?;
                    if c.disks.len() >= MAX_DISKS {
                        return Err(ConfigError::TooManyDisks { max: MAX_DISKS });
                    }
                    c.disks.push(DiskMount {
                        id: id.into(),
                        guest_path: path.into(),
                        fs,
                    });
                }
                "share" => {
                    if c.shares.len() >= MAX_SHARES {
                        return Err(ConfigError::TooManyShares { max: MAX_SHARES });
                    }
                    c.shares.push(parse_share(v)?);
                }
                "root" => {
                    let Some((id, fs)) = v.split_once(':') else {
                        return Err(invalid("root", v, "expected <id>:<fs>"));
                    };
                    c.root = Some(RootDisk {
                        id: id.into(),
                        fs: parse_fs("root", v, fs)?,
                    });
                }
                _ => unknown.push(word.chars().take(128).collect()),
            }
        }
        c.validate()?;
        Ok((c, unknown))
    }
}
