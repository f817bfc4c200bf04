//! The part of an OCI image config a guest needs: its defaults for the process, and the
//! layer diff IDs used to check what was unpacked.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::digest::Digest;

/// An image config that cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("image config is not valid JSON")]
    Json(#[source] serde_json::Error),
    #[error("image is for {0}; only linux/amd64 images run here")]
    Platform(String),
    #[error("image config {field}: {why}")]
    Field { field: &'static str, why: String },
}

/// Process defaults from the image config, as plain data. Every field may be empty; callers
/// apply them under their own explicit settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `Env`, split at the first `=` (names are non-empty and hold no `=`).
    pub env: Vec<(String, String)>,
    /// `WorkingDir` (absolute), if set.
    pub working_dir: Option<String>,
    /// `User` (`uid`, `uid:gid`, `name` or `name:group`), if set.
    pub user: Option<String>,
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    config: Option<RawProcess>,
    #[serde(default)]
    rootfs: Option<RawRootfs>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawProcess {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct RawRootfs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// A parsed image config: the process defaults and the layer diff IDs.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub config: ImageConfig,
    pub diff_ids: Vec<Digest>,
}

fn field(field: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field,
        why: why.into(),
    }
}

fn no_nul(name: &'static str, s: &str) -> Result<(), ConfigError> {
    if s.contains('\0') {
        return Err(field(name, "contains a NUL byte"));
    }
    Ok(())
}

/// Parses an image config blob; refuses a non-linux/amd64 image.
pub(crate) fn parse(bytes: &[u8]) -> Result<Parsed, ConfigError> {
    let raw: Raw = serde_json::from_slice(bytes).map_err(ConfigError::Json)?;
    if raw.os != "linux" || raw.architecture != "amd64" {
        return Err(ConfigError::Platform(format!(
            "{}/{}",
            raw.os, raw.architecture
        )));
    }
    let p = raw.config.unwrap_or(RawProcess {
        env: None,
        working_dir: None,
        user: None,
        entrypoint: None,
        cmd: None,
    });
    let mut env = Vec::new();
    for e in p.env.unwrap_or_default() {
        no_nul("Env", &e)?;
        match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => env.push((k.to_owned(), v.to_owned())),
            _ => return Err(field("Env", format!("{e:?} is not NAME=VALUE"))),
        }
    }
    let working_dir = p.working_dir.filter(|w| !w.is_empty());
    if let Some(w) = &working_dir {
        no_nul("WorkingDir", w)?;
        if !w.starts_with('/') {
            return Err(field("WorkingDir", format!("{w:?} is not absolute")));
        }
    }
    let user = p.user.filter(|u| !u.is_empty());
    if let Some(u) = &user {
        no_nul("User", u)?;
    }
    let entrypoint = p.entrypoint.unwrap_or_default();
    let cmd = p.cmd.unwrap_or_default();
    for a in entrypoint.iter().chain(&cmd) {
        no_nul("Entrypoint/Cmd", a)?;
    }
    let diff_ids = raw
        .rootfs
        .map(|r| r.diff_ids)
        .unwrap_or_default()
        .iter()
        .map(|d| Digest::parse(d).map_err(|e| field("rootfs.diff_ids", e.to_string())))
        .collect::<Result<_, _>>()?;
    Ok(Parsed {
        config: ImageConfig {
            env,
            working_dir,
            user,
            entrypoint,
            cmd,
        },
        diff_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_defaults_and_refuses_bad_ones() {
        let ok = br#"{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin","A=b=c"],
            "WorkingDir":"/srv","User":"1000:1000","Entrypoint":["/bin/sh","-c"],"Cmd":["echo hi"]},
            "rootfs":{"type":"layers","diff_ids":[]}}"#;
        let p = parse(ok).unwrap();
        assert_eq!(
            p.config.env,
            vec![("PATH".into(), "/bin".into()), ("A".into(), "b=c".into())]
        );
        assert_eq!(p.config.working_dir.as_deref(), Some("/srv"));
        assert_eq!(p.config.user.as_deref(), Some("1000:1000"));
        assert_eq!(p.config.entrypoint, ["/bin/sh", "-c"]);
        assert_eq!(p.config.cmd, ["echo hi"]);
        let arm = br#"{"architecture":"arm64","os":"linux"}"#;
        assert!(parse(arm).unwrap_err().to_string().contains("linux/arm64"));
        let env = br#"{"architecture":"amd64","os":"linux","config":{"Env":["NOVALUE"]}}"#;
        assert!(parse(env).unwrap_err().to_string().contains("Env"));
        let wd = br#"{"architecture":"amd64","os":"linux","config":{"WorkingDir":"rel"}}"#;
        assert!(parse(wd).unwrap_err().to_string().contains("WorkingDir"));
    }
}
