//! Registry credentials: anonymous, basic (user + password, which the client also trades for
//! a bearer token when the registry asks for one) or a bearer token, read from the docker
//! `config.json` (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`).
//!
//! Entries are matched by registry host (`host[:port]`, with or without `https://` and a
//! path; Docker Hub also as `https://index.docker.io/v1/`). `auth` (base64 `user:password`),
//! `username`/`password` and `registrytoken` are read; a registry that the file sends to a
//! credential helper is refused by name (helpers are not run).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;
use thiserror::Error;

use crate::Reference;

/// Credentials that cannot be read.
#[derive(Debug, Error)]
pub enum AuthError {
    #[error("reading {}", .0.display())]
    Read(PathBuf, #[source] std::io::Error),
    #[error("{}: {why}", .path.display())]
    Bad { path: PathBuf, why: String },
    #[error("{}: registry {registry} uses credential helper {helper:?}, which vm does not run; add an \"auths\" entry instead", .path.display())]
    Helper {
        path: PathBuf,
        registry: String,
        helper: String,
    },
}

/// How to authenticate to a registry.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Auth {
    #[default]
    Anonymous,
    Basic {
        username: String,
        password: String,
    },
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Anonymous => f.write_str("Anonymous"),
            Auth::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Auth::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct File {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, Entry>,
    #[serde(default)]
    cred_helpers: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    registrytoken: Option<String>,
}

/// The docker config file: `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("DOCKER_CONFIG")
        .map(|d| d.join("config.json"))
        .or_else(|| var("HOME").map(|h| h.join(".docker/config.json")))
}

fn host_of(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

fn is_hub(host: &str) -> bool {
    matches!(
        host,
        "docker.io" | "index.docker.io" | "registry-1.docker.io"
    )
}

impl Auth {
    /// The credentials the docker config file holds for `reference`'s registry, else
    /// anonymous. A missing file means anonymous.
    pub fn from_docker_config(reference: &Reference) -> Result<Auth, AuthError> {
        match docker_config_path() {
            Some(p) => Self::from_config_file(&p, reference.registry()),
            None => Ok(Auth::Anonymous),
        }
    }

    /// The credentials `path` (a docker `config.json`) holds for `registry`.
    pub fn from_config_file(path: &Path, registry: &str) -> Result<Auth, AuthError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Auth::Anonymous),
            Err(e) => return Err(AuthError::Read(path.into(), e)),
        };
        let bad = |why: String| AuthError::Bad {
            path: path.into(),
            why,
        };
        let file: File = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        let matches = |key: &str| {
            let h = host_of(key);
            h == registry || (is_hub(h) && is_hub(registry))
        };
        if let Some((_, e)) = file.auths.iter().find(|(k, _)| matches(k)) {
            if let Some(t) = &e.registrytoken {
                return Ok(Auth::Bearer(t.clone()));
            }
            if let (Some(u), Some(p)) = (&e.username, &e.password) {
                return Ok(Auth::Basic {
                    username: u.clone(),
                    password: p.clone(),
                });
            }
            if let Some(a) = &e.auth {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(a.trim())
                    .map_err(|_| bad(format!("auths.{registry}.auth is not base64")))?;
                let text = String::from_utf8(raw)
                    .map_err(|_| bad(format!("auths.{registry}.auth is not UTF-8")))?;
                let (u, p) = text
                    .split_once(':')
                    .ok_or_else(|| bad(format!("auths.{registry}.auth is not user:password")))?;
                return Ok(Auth::Basic {
                    username: u.into(),
                    password: p.into(),
                });
            }
        }
        if let Some((k, helper)) = file.cred_helpers.iter().find(|(k, _)| matches(k)) {
            return Err(AuthError::Helper {
                path: path.into(),
                registry: k.clone(),
                helper: helper.clone(),
            });
        }
        Ok(Auth::Anonymous)
    }

    pub(crate) fn to_client(&self) -> RegistryAuth {
        match self {
            Auth::Anonymous => RegistryAuth::Anonymous,
            Auth::Basic { username, password } => {
                RegistryAuth::Basic(username.clone(), password.clone())
            }
            Auth::Bearer(t) => RegistryAuth::Bearer(t.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_docker_config_entries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(
            &p,
            r#"{"auths":{"https://index.docker.io/v1/":{"auth":"dXNlcjpwYXNz"},
                "127.0.0.1:5000":{"username":"a","password":"b"},
                "reg.example:443":{"registrytoken":"tok"}},
               "credHelpers":{"helped.example":"secretservice"}}"#,
        )
        .unwrap();
        let basic = |u: &str, p: &str| Auth::Basic {
            username: u.into(),
            password: p.into(),
        };
        assert_eq!(
            Auth::from_config_file(&p, "docker.io").unwrap(),
            basic("user", "pass")
        );
        assert_eq!(
            Auth::from_config_file(&p, "127.0.0.1:5000").unwrap(),
            basic("a", "b")
        );
        assert_eq!(
            Auth::from_config_file(&p, "reg.example:443").unwrap(),
            Auth::Bearer("tok".into())
        );
        assert_eq!(
            Auth::from_config_file(&p, "other").unwrap(),
            Auth::Anonymous
        );
        let e = Auth::from_config_file(&p, "helped.example")
            .unwrap_err()
            .to_string();
        assert!(e.contains("secretservice"), "{e}");
        assert_eq!(
            Auth::from_config_file(&dir.path().join("absent"), "x").unwrap(),
            Auth::Anonymous
        );
        assert!(!format!("{:?}", basic("u", "secret")).contains("secret"));
    }
}
