//! A tool call that could not do what it asked: a tool error (`isError: true`) whose text
//! says what is wrong and whose structured content names the kind and, for a refusal, the
//! tool argument (`memory`, `mounts[0].host`, `image`), as `vm exec` names the flag.
//!
//! A guest command that exits non-zero is not a fault: its exit code is the result.

use std::error::Error;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;
use vm_sandbox::Class;

/// Why a tool call did nothing (or stopped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The call asked for something the host or the spec's rules refuse; nothing ran.
    Refused { field: String, message: String },
    /// No sandbox of that name in this session (or kept by this server).
    NotFound(String),
    /// The server is at its `--max-vms`.
    Busy(String),
    /// The call was cancelled; the guest command tree was killed.
    Cancelled(String),
    /// Anything else: a boot, the guest, the host.
    Failed(String),
}

impl Fault {
    pub fn refused(field: &str, message: impl std::fmt::Display) -> Fault {
        Fault::Refused {
            field: field.to_string(),
            message: message.to_string(),
        }
    }

    pub fn failed(message: impl Into<String>) -> Fault {
        Fault::Failed(message.into())
    }

    pub fn busy(message: impl Into<String>) -> Fault {
        Fault::Busy(message.into())
    }

    /// A library error, by its class ([`vm_sandbox::classify`]): a refused spec names its
    /// field as the tool argument it is; the host's policy refusing is `policy`; a bad image
    /// reference is `image`; anything else is a failure, its causes on one line.
    /// `host_mounts` is how many of the spec's mounts are the host's (`-v`): a call's
    /// `mounts[i]` is the spec's `mounts[host_mounts + i]`.
    pub fn from_error(e: &(dyn Error + 'static), host_mounts: usize) -> Fault {
        let c = vm_sandbox::classify(e);
        let text = vm_error_chain::error_chain(e);
        match (c.class, c.field.as_deref()) {
            (Class::Refused, field) => {
                Fault::refused(&tool_field(field.unwrap_or("spec"), host_mounts), c.message)
            }
            (Class::Forbidden, _) => Fault::refused("policy", text),
            (Class::Usage, Some("image")) => Fault::refused("image", text),
            _ => Fault::Failed(text),
        }
    }

    /// The tool error result.
    pub fn into_result(self) -> CallToolResult {
        let (kind, field, message) = match self {
            Fault::Refused { field, message } => ("refused", Some(field), message),
            Fault::NotFound(m) => ("not_found", None, m),
            Fault::Busy(m) => ("busy", None, m),
            Fault::Cancelled(m) => ("cancelled", None, m),
            Fault::Failed(m) => ("failed", None, m),
        };
        let text = match &field {
            Some(f) if !message.starts_with(&format!("{f}:")) => {
                format!("{kind}: {f}: {message}")
            }
            _ => format!("{kind}: {message}"),
        };
        let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
        result.structured_content = Some(json!({
            "error": kind,
            "field": field,
            "message": message,
        }));
        result
    }
}

/// The tool argument a `vm-spec` field is: `guarantees.limits.mem_mib` is `memory`, the
/// call's own mounts come after the host's.
fn tool_field(spec_field: &str, host_mounts: usize) -> String {
    const FIELDS: &[(&str, &str)] = &[
        ("guarantees.limits.mem_mib", "memory"),
        ("guarantees.limits.wall_ms", "timeout"),
        ("guarantees.env", "env"),
        ("image", "image"),
    ];
    if let Some(rest) = spec_field.strip_prefix("guarantees.mounts[")
        && let Some((index, tail)) = rest.split_once(']')
        && let Ok(i) = index.parse::<usize>()
    {
        let tail = match tail {
            ".host_path" => ".host",
            ".guest_path" => ".guest",
            other => other,
        };
        return match i.checked_sub(host_mounts) {
            Some(own) => format!("mounts[{own}]{tail}"),
            None => format!("the host's -v mount {i}{tail}"),
        };
    }
    for (prefix, field) in FIELDS {
        if spec_field.starts_with(prefix) {
            return field.to_string();
        }
    }
    spec_field.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_fields_become_tool_arguments() {
        assert_eq!(tool_field("guarantees.limits.mem_mib", 0), "memory");
        assert_eq!(tool_field("guarantees.limits.wall_ms", 2), "timeout");
        assert_eq!(
            tool_field("guarantees.mounts[2].guest_path", 1),
            "mounts[1].guest"
        );
        assert_eq!(
            tool_field("guarantees.mounts[0].host_path", 1),
            "the host's -v mount 0.host"
        );
        assert_eq!(tool_field("guarantees.env[3]", 0), "env");
        assert_eq!(tool_field("image.rootfs", 0), "image");
        assert_eq!(tool_field("trust", 0), "trust");
    }

    #[test]
    fn a_refusal_names_its_field_once() {
        let r = Fault::refused("memory", "memory: 9 MiB refused").into_result();
        assert_eq!(r.is_error, Some(true));
        let ContentBlock::Text(t) = &r.content[0] else {
            panic!("not text: {:?}", r.content);
        };
        assert_eq!(t.text, "refused: memory: 9 MiB refused");
        let s = r.structured_content.unwrap();
        assert_eq!(s["error"], "refused");
        assert_eq!(s["field"], "memory");
    }
}
