//! Parsing of flag values: sizes, durations, `-v` mounts, `-e` variables, VM names.
//!
//! These only turn text into typed values; whether a value is *allowed* (memory 0, a
//! read-write mount for untrusted work, a relative or home-directory path) is decided by
//! `vm_spec` validation, so a syntactically fine but forbidden value is refused there with
//! the refusal exit code, not here with the usage code.

use std::time::Duration;

use vm_spec::units;

/// A parse failure: the message names the flag's value and the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

fn err(msg: String) -> ParseError {
    ParseError(msg)
}

/// Parses a memory size into MiB ([`vm_spec::units::mem_mib`]: `256M`, `1G`; MiB when bare).
pub fn mem_mib(s: &str) -> Result<i64, ParseError> {
    units::mem_mib(s).map_err(|e| err(e.0))
}

/// Parses a size in bytes, written as for [`mem_mib`] (a whole number of MiB, at least 1).
pub fn byte_size(s: &str) -> Result<u64, ParseError> {
    match mem_mib(s)? {
        0 => Err(err(format!("invalid size {s:?}: must be at least 1M"))),
        mib => Ok(mib as u64 * 1024 * 1024),
    }
}

/// Parses a duration ([`vm_spec::units::duration`]: `90s`, `5m`, `1h30m`; seconds when bare).
pub fn duration(s: &str) -> Result<Duration, ParseError> {
    units::duration(s).map_err(|e| err(e.0))
}

/// Parses a `--ready` HTTP path: `/` then visible ASCII (no spaces or control characters),
/// at most 1024 bytes (the rule is the sandbox's, `vm_sandbox::Readiness::check_path`).
pub fn http_path(s: &str) -> Result<String, ParseError> {
    vm_sandbox::Readiness::check_path(s)
        .map(|()| s.to_string())
        .map_err(|e| err(e.to_string()))
}

pub use vm_spec::units::fmt_duration;

/// A `-v HOST:GUEST[:OPTIONS]` flag, as written (`OPTIONS`: `ro` or `rw`, and `erofs`,
/// comma-separated). `read_only` is true unless `rw` was given.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeArg {
    /// Host path, as written (validation decides whether it is acceptable).
    pub host: String,
    /// Guest path, as written.
    pub guest: String,
    /// False only for an explicit `:rw`.
    pub read_only: bool,
    /// `erofs`: a directory copied into an erofs image instead of the read-only file server.
    #[serde(default)]
    pub erofs: bool,
}

/// Parses `HOST:GUEST[:OPTIONS]` (see [`VolumeArg`]).
pub fn volume(s: &str) -> Result<VolumeArg, ParseError> {
    let bad = || {
        err(format!(
            "invalid mount {s:?}: expected HOST:GUEST or HOST:GUEST:ro (or :ro,erofs)"
        ))
    };
    let parts: Vec<&str> = s.split(':').collect();
    let (host, guest, options) = match parts.as_slice() {
        [h, g] => (*h, *g, ""),
        [h, g, o] => (*h, *g, *o),
        _ => return Err(bad()),
    };
    if host.is_empty() || guest.is_empty() {
        return Err(bad());
    }
    let (mut read_only, mut erofs) = (true, false);
    for o in options.split(',').filter(|_| !options.is_empty()) {
        match o {
            "ro" => read_only = true,
            "rw" => read_only = false,
            "erofs" => erofs = true,
            other => {
                return Err(err(format!(
                    "invalid mount {s:?}: unknown option {other:?} (use ro, or ro,erofs)"
                )));
            }
        }
    }
    Ok(VolumeArg {
        host: host.to_string(),
        guest: guest.to_string(),
        read_only,
        erofs,
    })
}

/// A `-e` flag: `KEY=VALUE`, or `KEY` to forward the host's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvArg {
    /// An explicit value.
    Set(String, String),
    /// Forward the host variable of that name (skipped when unset on the host).
    Forward(String),
}

/// Parses `KEY=VALUE` or `KEY`. The key must be a portable shell name.
pub fn env(s: &str) -> Result<EnvArg, ParseError> {
    let (key, value) = match s.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (s, None),
    };
    let valid = key
        .bytes()
        .enumerate()
        .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
    if key.is_empty() || !valid {
        return Err(err(format!(
            "invalid environment variable {s:?}: expected KEY=VALUE or KEY, KEY made of letters, digits and _"
        )));
    }
    Ok(match value {
        Some(v) => EnvArg::Set(key.to_string(), v.to_string()),
        None => EnvArg::Forward(key.to_string()),
    })
}

/// Resolves `-e` flags against a host environment lookup. Forwarded variables that are
/// unset on the host are left out (and logged), like `docker run -e KEY`.
pub fn resolve_env(
    args: &[EnvArg],
    lookup: impl Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(args.len());
    for a in args {
        match a {
            EnvArg::Set(k, v) => out.push((k.clone(), v.clone())),
            EnvArg::Forward(k) => match lookup(k) {
                Some(v) => out.push((k.clone(), v)),
                None => tracing::info!(var = %k, "-e {k}: not set on the host, not forwarded"),
            },
        }
    }
    out
}

/// Checks a VM name: `[a-z0-9][a-z0-9_.-]{0,62}`.
pub fn vm_name(s: &str) -> Result<String, ParseError> {
    if !crate::state::valid_name(s) {
        return Err(err(format!(
            "invalid VM name {s:?}: use 1-63 characters [a-z0-9_.-] starting with a letter or digit"
        )));
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(byte_size("1G"), Ok(1 << 30));
        assert_eq!(byte_size("3M"), Ok(3 << 20));
        assert!(byte_size("0").is_err());
        assert_eq!(mem_mib("256"), Ok(256));
        assert_eq!(mem_mib("256M"), Ok(256));
        assert_eq!(mem_mib("256m"), Ok(256));
        assert_eq!(mem_mib("256MiB"), Ok(256));
        assert_eq!(mem_mib("1G"), Ok(1024));
        assert_eq!(mem_mib("2gb"), Ok(2048));
        assert!(mem_mib("1536K").is_err(), "1.5 MiB is not whole");
        assert_eq!(mem_mib("3072K"), Ok(3));
        assert!(mem_mib("1000K").is_err());
        assert_eq!(mem_mib("2048K"), Ok(2));
        assert_eq!(mem_mib("0"), Ok(0));
        for bad in [
            "",
            "M",
            "-1",
            "1.5G",
            "12X",
            "1 G",
            "99999999999999999999999G",
        ] {
            assert!(mem_mib(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "s", "5d", "1.5h", "-3s", "m5"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
        assert_eq!(fmt_duration(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(fmt_duration(Duration::from_secs(60)), "1m");
        assert_eq!(fmt_duration(Duration::from_millis(5)), "5ms");
    }

    #[test]
    fn volumes() {
        let v = volume("/data:/mnt").unwrap();
        assert_eq!(
            (v.host.as_str(), v.guest.as_str(), v.read_only),
            ("/data", "/mnt", true)
        );
        assert!(volume("/data:/mnt:ro").unwrap().read_only);
        assert!(!volume("/data:/mnt:rw").unwrap().read_only);
        assert!(!volume("/data:/mnt:ro").unwrap().erofs);
        let e = volume("/data:/mnt:ro,erofs").unwrap();
        assert!(e.read_only && e.erofs);
        assert!(volume("/data:/mnt:erofs").unwrap().erofs);
        assert!(
            volume("rel:/mnt").is_ok(),
            "relative paths are refused by validation, not here"
        );
        for bad in [
            "/data",
            "/a:/b:xx",
            ":/b",
            "/a:",
            "/a:/b:ro:x",
            "/a:/b:ro,,",
            "/a:/b:ro,raw",
        ] {
            assert!(volume(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn env_vars() {
        assert_eq!(env("A=1"), Ok(EnvArg::Set("A".into(), "1".into())));
        assert_eq!(env("A=x=y"), Ok(EnvArg::Set("A".into(), "x=y".into())));
        assert_eq!(env("A="), Ok(EnvArg::Set("A".into(), String::new())));
        assert_eq!(env("HOME"), Ok(EnvArg::Forward("HOME".into())));
        for bad in ["", "=1", "1A=2", "A-B=1", "A B"] {
            assert!(env(bad).is_err(), "{bad}");
        }
        let got = resolve_env(
            &[
                EnvArg::Forward("SET".into()),
                EnvArg::Forward("UNSET".into()),
                EnvArg::Set("K".into(), "v".into()),
            ],
            |k| (k == "SET").then(|| "host".to_string()),
        );
        assert_eq!(
            got,
            vec![("SET".into(), "host".into()), ("K".into(), "v".into())]
        );
    }

    #[test]
    fn names() {
        for ok in ["a", "0", "web-1", "a.b_c", &"a".repeat(63)] {
            assert!(vm_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "-a", ".a", "a/b", "a b", &"a".repeat(64), "é"] {
            assert!(vm_name(bad).is_err(), "{bad}");
        }
    }
}
