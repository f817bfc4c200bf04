//! The runtime's options: the trust level and policy a container runs under, never guessed.
//!
//! containerd hands a runtime its options as a protobuf `Any`: on the shim's `start` (stdin)
//! and, when the client gives task options, in `CreateTaskRequest.options`. For a runtime that
//! is not runc, containerd 1.6 (its CRI plugin's
//! `[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vm.options]` table, or
//! `ctr run --runtime-config-path`) sends `runtimeoptions.v1.Options { type_url = 1,
//! config_path = 2 }`. `config_path` names our TOML file ([`ShimConfig`]). No options at all
//! means the strict default: untrusted work, no emulation. Options of any other type, an
//! unreadable file or an unknown key are refused, never read past.

use std::path::{Path, PathBuf};

use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::well_known_types::empty::Empty;
use containerd_shim::protos::protobuf::{Message, UnknownValueRef};
use serde::Deserialize;
use vm_spec::{MAX_MEM_MIB, MIN_MEM_MIB, Policy, Trust};

use crate::error::ShimError;

/// The type URL of containerd's generic runtime options.
pub const RUNTIME_OPTIONS_TYPE: &str = "runtimeoptions.v1.Options";
/// Environment variable carrying the config path from `start` to the serving shim.
pub const CONFIG_PATH_ENV: &str = "VM_SHIM_CONFIG_PATH";
/// Where the VMs' run directories go unless the config says otherwise.
pub const DEFAULT_RUN_DIR: &str = "/run/containerd-shim-vm";
/// Kubelet's root directory unless the config says otherwise.
pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";
/// Guest memory when the bundle sets no memory limit.
pub const DEFAULT_MEMORY_MIB: i64 = 256;

/// The shim's configuration file (TOML), named by the runtime options' `ConfigPath`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShimConfig {
    /// `untrusted` (default), `semi` or `trusted`.
    #[serde(default = "untrusted")]
    pub trust: Trust,
    /// Let untrusted work run on an emulated driver (QEMU TCG) where no hardware boundary
    /// exists: the explicit, visible acceptance of a weaker boundary.
    #[serde(default)]
    pub allow_emulation: bool,
    /// Guest images (`VM_IMAGES_DIR`); default: the shim's environment, then the usual cache.
    #[serde(default)]
    pub images_dir: Option<PathBuf>,
    /// Parent of the per-VM run directories.
    #[serde(default)]
    pub run_dir: Option<PathBuf>,
    /// Cache of the erofs roots made from snapshots; default `<cache home>/vm/snapshot-roots`.
    #[serde(default)]
    pub snapshot_cache: Option<PathBuf>,
    /// Guest memory (MiB) when the bundle has no `linux.resources.memory.limit`.
    #[serde(default)]
    pub default_memory_mib: Option<i64>,
    /// Environment names allowed although they look like secrets (`--env-allow`).
    #[serde(default)]
    pub env_allow: Vec<String>,
    /// Hard lifetime of each container's VM in seconds (`--timeout`): when it expires the VM
    /// is torn down and the container exits 137. Default: none.
    #[serde(default)]
    pub wall_seconds: Option<u64>,
    /// Kubelet's root directory (its `--root-dir`): a writable bind is copied into the guest
    /// only when it is one of kubelet's own files below `pods/` there. Default
    /// [`DEFAULT_KUBELET_ROOT`].
    #[serde(default)]
    pub kubelet_root: Option<PathBuf>,
}

fn untrusted() -> Trust {
    Trust::Untrusted
}

impl Default for ShimConfig {
    fn default() -> Self {
        ShimConfig {
            trust: Trust::Untrusted,
            allow_emulation: false,
            images_dir: None,
            run_dir: None,
            snapshot_cache: None,
            default_memory_mib: None,
            env_allow: Vec::new(),
            wall_seconds: None,
            kubelet_root: None,
        }
    }
}

impl ShimConfig {
    pub fn policy(&self) -> Policy {
        Policy {
            allow_emulation: self.allow_emulation,
            // The shim runs as root under containerd, where the jail can be built.
            allow_weaker_jail: false,
        }
    }

    pub fn run_dir(&self) -> PathBuf {
        self.run_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR))
    }

    pub fn kubelet_root(&self) -> PathBuf {
        self.kubelet_root
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBELET_ROOT))
    }

    pub fn default_memory_mib(&self) -> i64 {
        self.default_memory_mib.unwrap_or(DEFAULT_MEMORY_MIB)
    }

    /// Reads and checks the file at `path` ([`ShimConfig::check`]).
    pub fn load(path: &Path) -> Result<ShimConfig, ShimError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ShimError::Options(format!("reading {}: {e}", path.display())))?;
        let config: ShimConfig = toml::from_str(&text)
            .map_err(|e| ShimError::Options(format!("{}: {}", path.display(), e.message())))?;
        config
            .check()
            .map_err(|e| ShimError::Options(format!("{}: {e}", path.display())))?;
        Ok(config)
    }

    /// Refuses, by field name, a value no container could run under: memory outside
    /// `MIN_MEM_MIB..=MAX_MEM_MIB`, a zero wall lifetime, a directory that is relative, `/`
    /// or holds `..`, an `env_allow` entry that is not one variable's name.
    pub fn check(&self) -> Result<(), String> {
        if let Some(m) = self.default_memory_mib
            && !(MIN_MEM_MIB..=MAX_MEM_MIB).contains(&m)
        {
            return Err(format!(
                "default_memory_mib: {m} refused; must be {MIN_MEM_MIB}..={MAX_MEM_MIB} MiB"
            ));
        }
        if self.wall_seconds == Some(0) {
            return Err("wall_seconds: 0 refused; give a positive lifetime, or none".into());
        }
        for (field, dir) in [
            ("images_dir", &self.images_dir),
            ("run_dir", &self.run_dir),
            ("snapshot_cache", &self.snapshot_cache),
            ("kubelet_root", &self.kubelet_root),
        ] {
            if let Some(dir) = dir
                && let Some(why) = dir_problem(dir)
            {
                return Err(format!("{field}: {} refused: {why}", dir.display()));
            }
        }
        for (i, name) in self.env_allow.iter().enumerate() {
            if let Some(why) = vm_spec::env::env_allow_problem(name) {
                return Err(format!("env_allow[{i}]: {name:?} refused: {why}"));
            }
        }
        Ok(())
    }
}

/// Why `dir` cannot be one of the shim's directories, if it cannot.
fn dir_problem(dir: &Path) -> Option<&'static str> {
    if !dir.is_absolute() {
        return Some("must be absolute");
    }
    if dir.parent().is_none() {
        return Some("must not be /");
    }
    if dir
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Some("must not hold ..");
    }
    None
}

/// The `config_path` of serialized runtime options (`Any` bytes as containerd sends them);
/// `None` when there are none.
pub fn config_path_from_bytes(data: &[u8]) -> Result<Option<PathBuf>, ShimError> {
    if data.is_empty() {
        return Ok(None);
    }
    let any = Any::parse_from_bytes(data)
        .map_err(|e| ShimError::Options(format!("not a protobuf Any: {e}")))?;
    config_path_from_any(&any)
}

/// The `config_path` of runtime options given as an `Any` (see the module docs).
pub fn config_path_from_any(any: &Any) -> Result<Option<PathBuf>, ShimError> {
    if any.type_url.is_empty() && any.value.is_empty() {
        return Ok(None);
    }
    let ty = any.type_url.rsplit('/').next().unwrap_or_default();
    if ty != RUNTIME_OPTIONS_TYPE {
        return Err(ShimError::Options(format!(
            "type {:?} is not {RUNTIME_OPTIONS_TYPE} (set ConfigPath in the runtime's options)",
            any.type_url
        )));
    }
    // Parsed as an empty message, every field is an unknown one: take field 2.
    let msg = Empty::parse_from_bytes(&any.value)
        .map_err(|e| ShimError::Options(format!("{RUNTIME_OPTIONS_TYPE}: {e}")))?;
    let path = match msg.special_fields.unknown_fields().get(2) {
        None => return Ok(None),
        Some(UnknownValueRef::LengthDelimited(b)) => String::from_utf8(b.to_vec())
            .map_err(|_| ShimError::Options("ConfigPath is not UTF-8".into()))?,
        Some(_) => return Err(ShimError::Options("ConfigPath is not a string".into())),
    };
    if path.is_empty() {
        return Ok(None);
    }
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(ShimError::Options(format!(
            "ConfigPath {} is not absolute",
            path.display()
        )));
    }
    Ok(Some(path))
}

/// The configuration for one container: from `path` when the options named one, else the
/// strict default.
pub fn resolve(path: Option<&Path>) -> Result<ShimConfig, ShimError> {
    match path {
        Some(p) => ShimConfig::load(p),
        None => Ok(ShimConfig::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim::protos::protobuf::CodedOutputStream;

    fn options(type_url: &str, config_path: &str) -> Vec<u8> {
        let mut value = Vec::new();
        {
            let mut os = CodedOutputStream::vec(&mut value);
            os.write_string(1, "io.containerd.vm.v1.Options").unwrap();
            os.write_string(2, config_path).unwrap();
            os.flush().unwrap();
        }
        let any = Any {
            type_url: type_url.into(),
            value,
            ..Default::default()
        };
        any.write_to_bytes().unwrap()
    }

    #[test]
    fn config_path_is_read_from_runtime_options() {
        let data = options(RUNTIME_OPTIONS_TYPE, "/etc/vm/shim.toml");
        assert_eq!(
            config_path_from_bytes(&data).unwrap(),
            Some(PathBuf::from("/etc/vm/shim.toml"))
        );
        assert_eq!(config_path_from_bytes(&[]).unwrap(), None);
        let e = config_path_from_bytes(&options("containerd.runc.v1.Options", "/x")).unwrap_err();
        assert!(
            e.to_string().contains("is not runtimeoptions.v1.Options"),
            "{e}"
        );
        let e = config_path_from_bytes(&options(RUNTIME_OPTIONS_TYPE, "rel.toml")).unwrap_err();
        assert!(e.to_string().contains("not absolute"), "{e}");
    }

    #[test]
    fn config_file_is_strict_and_defaults_are_strict() {
        let d = resolve(None).unwrap();
        assert_eq!(d.trust, Trust::Untrusted);
        assert!(!d.policy().allow_emulation);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "allow_emulation = true\ndefault_memory_mib = 300\n").unwrap();
        let c = resolve(Some(&p)).unwrap();
        assert!(c.policy().allow_emulation);
        assert_eq!(c.trust, Trust::Untrusted);
        assert_eq!(c.default_memory_mib(), 300);
        std::fs::write(&p, "allow_emulaton = true\n").unwrap();
        let e = resolve(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("unknown field `allow_emulaton`"), "{e}");
        let e = resolve(Some(&dir.path().join("missing.toml"))).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
    }

    /// Each value no container could run under is refused at load time, by name.
    #[test]
    fn bad_values_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        let cases = [
            ("default_memory_mib = -5", "default_memory_mib: -5 refused"),
            ("default_memory_mib = 0", "default_memory_mib: 0 refused"),
            (
                "default_memory_mib = 9223372036854775807",
                "default_memory_mib: 9223372036854775807 refused",
            ),
            ("wall_seconds = 0", "wall_seconds: 0 refused"),
            (
                "run_dir = \"vms\"",
                "run_dir: vms refused: must be absolute",
            ),
            ("run_dir = \"/\"", "run_dir: / refused: must not be /"),
            ("images_dir = \"img\"", "images_dir: img refused"),
            ("images_dir = \"/\"", "images_dir: / refused"),
            ("images_dir = \"/a/../etc\"", "must not hold .."),
            ("snapshot_cache = \"/\"", "snapshot_cache: / refused"),
            ("env_allow = [\"*\", \"\"]", "env_allow[0]: \"*\" refused"),
            (
                "env_allow = [\"A\", \"\"]",
                "env_allow[1]: \"\" refused: empty",
            ),
        ];
        for (text, want) in cases {
            std::fs::write(&p, text).unwrap();
            let e = resolve(Some(&p)).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        let good = "default_memory_mib = 64\nwall_seconds = 1\nrun_dir = \"/run/x\"\n\
                    images_dir = \"/var/lib/vm\"\nenv_allow = [\"API_TOKEN\"]\n";
        std::fs::write(&p, good).unwrap();
        let c = resolve(Some(&p)).unwrap();
        assert_eq!(c.default_memory_mib(), 64);
    }
}
