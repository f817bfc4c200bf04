//! The tools' parameters. Their JSON schemas (schemars) are the tools' input schemas, so the
//! doc comments are what an agent reads about each argument.
//!
//! A call is bounded by its transport before it is parsed (rmcp: 16 MiB a line on stdio,
//! 4 MiB a request body over HTTP); what its values mean is checked where they are used
//! (`host`, then the library: paths, environment, mounts, limits).

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

use super::fault::Fault;
use crate::parse;

/// A size or a duration: a number (MiB, seconds) or text (`512M`, `90s`, `5m`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Amount {
    Number(i64),
    Text(String),
}

impl Amount {
    /// As a positive duration (a number is seconds), or a refusal naming `field`.
    pub fn duration(&self, field: &str) -> Result<Duration, Fault> {
        let d = match self {
            Amount::Number(n) if *n > 0 => Duration::from_secs(*n as u64),
            Amount::Number(_) => Duration::ZERO,
            Amount::Text(t) => parse::duration(t).map_err(|e| Fault::refused(field, e))?,
        };
        if d.is_zero() {
            return Err(Fault::refused(
                field,
                format!(
                    "{self} refused; give a positive number of seconds or a duration (90s, 5m)"
                ),
            ));
        }
        Ok(d)
    }

    /// As MiB (a number is MiB), or a refusal naming `field`.
    pub fn mib(&self, field: &str) -> Result<i64, Fault> {
        match self {
            Amount::Number(n) => Ok(*n),
            Amount::Text(t) => parse::mem_mib(t).map_err(|e| Fault::refused(field, e)),
        }
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Amount::Number(n) => write!(f, "{n}"),
            Amount::Text(t) => write!(f, "{t:?}"),
        }
    }
}

/// A host path shown read-only in the guest.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MountAsk {
    /// Absolute host path (file or directory) under a directory the server allows.
    pub host: String,
    /// Absolute guest path it appears at (read-only).
    pub guest: String,
}

/// What a call may ask of a VM to boot; everything else is the server's.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct VmAsk {
    /// OCI image for the guest's root, one the server offers (default: the server's).
    #[serde(default)]
    pub image: Option<String>,
    /// Guest memory: MiB, or text such as "512M", "1G" (default and maximum: the server's).
    #[serde(default)]
    pub memory: Option<Amount>,
    /// The VM's whole lifetime, boot included: seconds, or text such as "90s", "5m"; the VM
    /// is torn down when it ends (default and maximum: the server's).
    #[serde(default)]
    pub timeout: Option<Amount>,
    /// Host paths to show in the guest, always read-only.
    #[serde(default)]
    pub mounts: Vec<MountAsk>,
}

/// A command to run.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct CommandAsk {
    /// A shell command line, run with /bin/sh -c.
    pub command: String,
    /// Working directory in the guest: relative to /work, or absolute (default: /work).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Environment variables for this command, on top of the sandbox's.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Text written to the command's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
}

/// `run`: a command in a fresh microVM, torn down when it ends.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunParams {
    #[serde(flatten)]
    pub cmd: CommandAsk,
    #[serde(flatten)]
    pub vm: VmAsk,
}

/// The languages `run_code` knows, and the interpreter each runs as.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// python3, the code on its standard input.
    Python,
    /// /bin/sh.
    Sh,
    /// bash.
    Bash,
    /// node.
    Node,
}

impl Language {
    /// The argv that reads a program from standard input.
    pub fn argv(self) -> Vec<String> {
        let argv: &[&str] = match self {
            Language::Python => &["python3", "-"],
            Language::Sh => &["/bin/sh", "-s"],
            Language::Bash => &["bash", "-s"],
            Language::Node => &["node", "-"],
        };
        argv.iter().map(|s| s.to_string()).collect()
    }
}

/// `run_code`: a snippet in a fresh microVM.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RunCodeParams {
    /// The program's source.
    pub code: String,
    /// Its language; the image must have the interpreter (the built-in image has sh only).
    pub language: Language,
    #[serde(flatten)]
    pub vm: VmAsk,
}

/// `sandbox_create`: a microVM that stays for later calls.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct CreateParams {
    /// The sandbox's name ([a-z0-9][a-z0-9_.-]{0,62}; default: one is made).
    #[serde(default)]
    pub name: Option<String>,
    /// Keep the sandbox after this session ends (needs a name): it is then a named VM
    /// (`vm ps`), removed with sandbox_remove or `vm rm -f NAME`.
    #[serde(default)]
    pub keep: bool,
    #[serde(flatten)]
    pub vm: VmAsk,
}

/// A sandbox by name.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct NameParams {
    /// The sandbox's name (sandbox_list lists them).
    pub name: String,
}

/// `sandbox_exec`: a command in a sandbox.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ExecParams {
    /// The sandbox's name.
    pub name: String,
    #[serde(flatten)]
    pub cmd: CommandAsk,
    /// Kill the command's process tree after this long (seconds, or "90s", "5m").
    #[serde(default)]
    pub timeout: Option<Amount>,
}

/// `sandbox_read_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ReadParams {
    /// The sandbox's name.
    pub name: String,
    /// The file: relative to /work, or absolute under it.
    pub path: String,
}

/// How a file's content is written in a call or a result.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// UTF-8 text.
    #[default]
    Utf8,
    /// Base64 of the bytes.
    Base64,
}

/// `sandbox_write_file`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct WriteParams {
    /// The sandbox's name.
    pub name: String,
    /// The file: relative to /work, or absolute under it (parents are created).
    pub path: String,
    /// The content.
    pub content: String,
    /// How `content` is written (default utf8).
    #[serde(default)]
    pub encoding: Encoding,
}

/// `sandbox_list_files`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ListParams {
    /// The sandbox's name.
    pub name: String,
    /// A directory relative to /work (default: /work itself).
    #[serde(default)]
    pub dir: Option<String>,
}

/// `sandbox_serve`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ServeParams {
    /// The sandbox's name.
    pub name: String,
    /// The server's command line, run with /bin/sh -c in /work.
    pub command: String,
    /// The guest TCP port it listens on.
    pub port: u16,
    /// Ready only once GET of this path answers 2xx (default: once the port accepts).
    #[serde(default)]
    pub ready_path: Option<String>,
    /// How long to wait for it (seconds, or "30s"; default 60 s).
    #[serde(default)]
    pub ready_timeout: Option<Amount>,
}

/// No arguments.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct NoParams {}
