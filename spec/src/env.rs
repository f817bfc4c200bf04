//! The guest environment rules: explicit, well-formed and secret-free.
//!
//! Nothing from the host environment is inherited; `Guarantees.env` is the whole
//! environment of every guest process. A name is refused when it is empty or holds `=` or
//! NUL, a value when it holds NUL, a name set twice is refused, the whole environment is
//! capped at [`MAX_ENV_BYTES`], and a variable that looks
//! like a credential is refused unless its name is listed in `Guarantees.env_allow`:
//! - names with a `_`-separated word TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL(S),
//!   PRIVATE or APIKEY, or whose last word is KEY (`API_KEY`, `SIGNING_KEY`);
//! - names starting with `AWS_`, and `SSH_AUTH_SOCK` (a capability, not a value);
//! - values that carry well-known credential shapes (a PEM private key block, GitHub
//!   `ghp_`/`github_pat_` tokens, Slack `xox?-` tokens, GitLab `glpat-`, AWS `AKIA…` ids).

//!
//! The runtime suggests one default, visibly: [`DEFAULT_GUEST_PATH`], put into a spec by
//! [`Guarantees::with_default_env`](crate::Guarantees::with_default_env) (the CLI does so,
//! so `--dry-run` shows it). Nothing adds it behind the spec's back: a spec without `PATH`
//! runs its commands without one.

use crate::error::SpecError;

/// `PATH` of the default guest environment ([`default_guest_env`]): the usual system
/// directories of the guest image, nothing from the host.
pub const DEFAULT_GUEST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The default guest environment: `PATH` = [`DEFAULT_GUEST_PATH`] and nothing else. It only
/// takes effect when written into `Guarantees.env` (see
/// [`Guarantees::with_default_env`](crate::Guarantees::with_default_env)).
pub fn default_guest_env() -> Vec<(String, String)> {
    vec![("PATH".to_string(), DEFAULT_GUEST_PATH.to_string())]
}

/// Largest total size of the environment (names + values), well below the agent's frame.
pub const MAX_ENV_BYTES: usize = 128 * 1024;

const SECRET_WORDS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "CREDENTIALS",
    "PRIVATE",
    "APIKEY",
];
const SECRET_VALUE_PREFIXES: &[&str] = &[
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "glpat-",
];

/// Why a variable looks like a secret, if it does.
pub fn looks_secret(name: &str, value: &str) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("AWS_") {
        return Some("AWS_ prefix");
    }
    if upper == "SSH_AUTH_SOCK" {
        return Some("ssh agent socket");
    }
    let words: Vec<&str> = upper.split('_').collect();
    if words.iter().any(|w| SECRET_WORDS.contains(w)) {
        return Some("credential word in name");
    }
    if words.last() == Some(&"KEY") {
        return Some("name ends in KEY");
    }
    if value.contains("-----BEGIN") && value.contains("PRIVATE KEY") {
        return Some("value holds a private key");
    }
    if SECRET_VALUE_PREFIXES.iter().any(|p| value.starts_with(p)) {
        return Some("value has a token prefix");
    }
    let aws_id = value.len() == 20
        && value.starts_with("AKIA")
        && value
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
    if aws_id {
        return Some("value is an AWS access key id");
    }
    None
}

/// Why `name` cannot be an `env_allow` entry, if it cannot: an entry names exactly one
/// variable, so it is refused when empty, when it holds `=` or NUL (no variable has such a
/// name), or when it holds `*`, `?` or `[` (no wildcards: each exception is named).
pub fn env_allow_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("empty");
    }
    if name.contains(['=', '\0']) {
        return Some("contains '=' or NUL");
    }
    if name.contains(['*', '?', '[']) {
        return Some("not a wildcard; name each variable");
    }
    None
}

/// Check every `env_allow` entry ([`env_allow_problem`]).
pub fn check_env_allow(allow: &[String]) -> Result<(), SpecError> {
    for (index, name) in allow.iter().enumerate() {
        if let Some(reason) = env_allow_problem(name) {
            return Err(SpecError::EnvAllowName {
                index,
                name: name.clone(),
                reason,
            });
        }
    }
    Ok(())
}

/// Check the whole environment against the rules above.
pub fn check_env(env: &[(String, String)], allow: &[String]) -> Result<(), SpecError> {
    let bytes: usize = env.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
    if bytes > MAX_ENV_BYTES {
        return Err(SpecError::EnvTooLarge {
            bytes,
            max: MAX_ENV_BYTES,
        });
    }
    for (index, (name, value)) in env.iter().enumerate() {
        let bad_name = |reason| SpecError::EnvName {
            index,
            name: name.clone(),
            reason,
        };
        if name.is_empty() {
            return Err(bad_name("empty"));
        }
        if name.contains('=') {
            return Err(bad_name("contains '='"));
        }
        if name.contains('\0') {
            return Err(bad_name("contains NUL"));
        }
        if value.contains('\0') {
            return Err(SpecError::EnvValue {
                index,
                name: name.clone(),
            });
        }
        if env[..index].iter().any(|(n, _)| n == name) {
            return Err(SpecError::DuplicateEnv {
                index,
                name: name.clone(),
            });
        }
        if allow.iter().any(|a| a == name) {
            continue;
        }
        if let Some(why) = looks_secret(name, value) {
            return Err(SpecError::SecretEnv {
                index,
                name: name.clone(),
                why,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{DEFAULT_GUEST_PATH, check_env, check_env_allow, looks_secret};
    use crate::{Guarantees, Limits};

    fn guarantees() -> Guarantees {
        let limits = Limits {
            vcpus: 1,
            mem_mib: 256,
            pids: 64,
            wall: None,
        };
        Guarantees::untrusted(limits, Vec::new())
    }

    #[test]
    fn default_env_is_explicit_and_never_overrides() {
        // Nothing is implied: the untrusted posture starts with an empty environment.
        assert!(guarantees().env.is_empty());
        let g = guarantees().with_env("A", "1").with_default_env();
        assert_eq!(
            g.env,
            [
                ("PATH".to_string(), DEFAULT_GUEST_PATH.to_string()),
                ("A".to_string(), "1".to_string())
            ]
        );
        assert_eq!(Guarantees::default_guest_env(), g.env[..1]);
        // A caller's PATH wins and nothing else is added; applying twice changes nothing.
        let g = guarantees().with_env("PATH", "/bin").with_default_env();
        assert_eq!(g.env, [("PATH".to_string(), "/bin".to_string())]);
        assert_eq!(g.clone().with_default_env(), g);
        check_env(&guarantees().with_default_env().env, &[]).unwrap();
    }

    #[test]
    fn secret_shapes() {
        for name in [
            "GITHUB_TOKEN",
            "API_KEY",
            "AWS_REGION",
            "DB_PASSWORD",
            "MY_SECRET_X",
        ] {
            assert!(looks_secret(name, "x").is_some(), "{name}");
        }
        for name in [
            "PATH",
            "HOME",
            "LANG",
            "KEYBOARD",
            "MONKEY_BUSINESS",
            "TOKENIZER_DIR",
        ] {
            assert!(looks_secret(name, "x").is_none(), "{name}");
        }
        assert!(looks_secret("X", "ghp_abc").is_some());
        assert!(looks_secret("X", "AKIAABCDEFGHIJKLMNOP").is_some());
        assert!(looks_secret("X", "-----BEGIN RSA PRIVATE KEY-----\n").is_some());
    }

    #[test]
    fn env_allow_entries_name_one_variable() {
        for (bad, why) in [
            ("", "empty"),
            ("*", "wildcard"),
            ("AWS_*", "wildcard"),
            ("A=B", "'='"),
        ] {
            let allow = vec!["OK_NAME".to_string(), bad.to_string()];
            let msg = check_env_allow(&allow).unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("guarantees.env_allow[1]: {bad:?} refused")),
                "{msg}"
            );
            assert!(msg.contains(why), "{msg}");
        }
        check_env_allow(&["API_TOKEN".into(), "AWS_REGION".into()]).unwrap();
    }
}
