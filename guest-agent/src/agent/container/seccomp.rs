//! A container's seccomp profile ([`SeccompProfile`], OCI's `linux.seccomp`) compiled into
//! BPF with `seccompiler`, whose filters have one action for a match and one for the rest.
//!
//! A profile has a default action and rules with actions of their own, so it becomes a stack
//! of filters, which the kernel runs together, taking the most restrictive answer (the most
//! recently installed on a tie):
//! - the default filter: every call some rule names (under that rule's argument conditions)
//!   is allowed, any other gets the default action (none when the default is to allow);
//! - one filter per other action A: a call a rule with action A matches gets A, any other is
//!   allowed (none for A = allow).
//!
//! So a call matching a rule gets that rule's action and any other call the default one, as
//! libseccomp gives it. A syscall name this architecture does not have is left out, as
//! runc does with names its libseccomp does not know (the profile may be newer than the
//! kernel, or name another architecture's calls).

use std::collections::{BTreeMap, BTreeSet};

use seccompiler::{BpfProgram, TargetArch};
use serde_json::{Value, json};
use vm_sync::Lock;

use vm_agent_protocol::container::{SeccompAction, SeccompArg, SeccompOp, SeccompProfile};

/// The kernel's cap on the instructions of one filter (`BPF_MAXINSNS`).
pub const MAX_FILTER_INSNS: usize = 4096;

/// Why a profile cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("seccomp profile: {0}")]
    Compile(String),
    #[error(
        "seccomp profile: a filter of {0} instructions is over the kernel's {MAX_FILTER_INSNS}"
    )]
    TooLarge(usize),
}

fn action(a: SeccompAction) -> Value {
    match a {
        SeccompAction::Allow => json!("allow"),
        SeccompAction::Errno(n) => json!({ "errno": n }),
        SeccompAction::KillThread => json!("kill_thread"),
        SeccompAction::KillProcess => json!("kill_process"),
        SeccompAction::Trap => json!("trap"),
        SeccompAction::Trace(n) => json!({ "trace": n }),
        SeccompAction::Log => json!("log"),
    }
}

fn condition(a: &SeccompArg) -> Value {
    let (op, val) = match a.op {
        SeccompOp::Eq => (json!("eq"), a.value),
        SeccompOp::Ne => (json!("ne"), a.value),
        SeccompOp::Lt => (json!("lt"), a.value),
        SeccompOp::Le => (json!("le"), a.value),
        SeccompOp::Gt => (json!("gt"), a.value),
        SeccompOp::Ge => (json!("ge"), a.value),
        // OCI: `arg & value == value_two`.
        SeccompOp::MaskedEq => (json!({ "masked_eq": a.value }), a.value_two),
    };
    json!({ "index": a.index, "type": "qword", "op": op, "val": val })
}

/// The rules of one filter: each syscall with its argument conditions (an unconditional rule
/// makes the syscall match whatever its arguments).
type Chains<'a> = BTreeMap<&'a str, Option<Vec<&'a [SeccompArg]>>>;

fn add<'a>(chains: &mut Chains<'a>, name: &'a str, args: &'a [SeccompArg]) {
    let entry = chains.entry(name).or_insert_with(|| Some(Vec::new()));
    match (entry.as_mut(), args.is_empty()) {
        (_, true) => *entry = None,
        (Some(list), false) => list.push(args),
        (None, false) => {}
    }
}

fn filter_json(
    chains: &Chains<'_>,
    unknown: &BTreeSet<String>,
    on_match: Value,
    rest: Value,
) -> Value {
    let mut rules = Vec::new();
    for (name, chain) in chains.iter().filter(|(n, _)| !unknown.contains(**n)) {
        match chain {
            None => rules.push(json!({ "syscall": name })),
            Some(list) => rules.extend(list.iter().map(|args| {
                json!({ "syscall": name, "args": args.iter().map(condition).collect::<Vec<_>>() })
            })),
        }
    }
    json!({ "filter_action": on_match, "default_action": rest, "filter": rules })
}

/// The stack of filters `profile` compiles to, in the order to install them (see the module
/// docs); empty when it allows everything.
pub fn compile(profile: &SeccompProfile) -> Result<Vec<BpfProgram>, SeccompError> {
    let mut default_chains = Chains::new();
    let mut by_action: BTreeMap<SeccompAction, Chains<'_>> = BTreeMap::new();
    for rule in &profile.rules {
        for name in &rule.names {
            add(&mut default_chains, name, &rule.args);
            if rule.action != SeccompAction::Allow {
                add(by_action.entry(rule.action).or_default(), name, &rule.args);
            }
        }
    }
    let unknown: BTreeSet<String> = default_chains
        .keys()
        .filter(|n| !known(n))
        .map(|n| n.to_string())
        .collect();
    if !unknown.is_empty() {
        tracing::debug!(
            ?unknown,
            "seccomp: syscalls this architecture lacks left out"
        );
    }
    let mut doc = serde_json::Map::new();
    if profile.default_action != SeccompAction::Allow {
        let rest = action(profile.default_action);
        let f = filter_json(
            &default_chains,
            &unknown,
            action(SeccompAction::Allow),
            rest,
        );
        doc.insert("0".into(), f);
    }
    for (i, (a, chains)) in by_action.iter().enumerate() {
        let f = filter_json(chains, &unknown, action(*a), action(SeccompAction::Allow));
        doc.insert(format!("{}", i + 1), f);
    }
    let text = Value::Object(doc).to_string();
    let map = seccompiler::compile_from_json(text.as_bytes(), TargetArch::x86_64)
        .map_err(|e| SeccompError::Compile(e.to_string()))?;
    // Installed in key order: the default filter first, then one per action.
    let mut keyed: Vec<(usize, BpfProgram)> = map
        .into_iter()
        .filter_map(|(k, p)| k.parse().ok().map(|k| (k, p)))
        .collect();
    keyed.sort_by_key(|(k, _)| *k);
    let programs: Vec<BpfProgram> = keyed.into_iter().map(|(_, p)| p).collect();
    match programs.iter().find(|p| p.len() > MAX_FILTER_INSNS) {
        Some(p) => Err(SeccompError::TooLarge(p.len())),
        None => Ok(programs),
    }
}

/// Most names whose answer [`known`] keeps.
const MAX_KNOWN_CACHE: usize = 4096;

/// Whether x86-64 has the syscall `name` (seccompiler's table, asked through a one-rule
/// filter; the answers are kept, at most [`MAX_KNOWN_CACHE`] of them).
fn known(name: &str) -> bool {
    static CACHE: std::sync::Mutex<BTreeMap<String, bool>> = std::sync::Mutex::new(BTreeMap::new());
    let mut cache = CACHE.locked();
    if let Some(k) = cache.get(name) {
        return *k;
    }
    let probe = json!({ "p": {
        "filter_action": "allow",
        "default_action": { "errno": 1 },
        "filter": [{ "syscall": name }],
    }});
    let k =
        seccompiler::compile_from_json(probe.to_string().as_bytes(), TargetArch::x86_64).is_ok();
    if cache.len() < MAX_KNOWN_CACHE {
        cache.insert(name.to_string(), k);
    }
    k
}

/// `program` as the kernel's instruction type.
pub fn to_kernel(program: &BpfProgram) -> Vec<libc::sock_filter> {
    program
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_agent_protocol::container::SeccompRule;

    fn rule(names: &[&str], action: SeccompAction, args: Vec<SeccompArg>) -> SeccompRule {
        SeccompRule {
            names: names.iter().map(|s| s.to_string()).collect(),
            action,
            args,
        }
    }

    #[test]
    fn a_profile_becomes_one_filter_per_action() {
        let allow_list = SeccompProfile {
            default_action: SeccompAction::Errno(1),
            rules: vec![
                rule(
                    &["read", "write", "exit_group"],
                    SeccompAction::Allow,
                    vec![],
                ),
                rule(&["clone3"], SeccompAction::Errno(38), vec![]),
                rule(&["no_such_call_anywhere"], SeccompAction::Allow, vec![]),
            ],
        };
        assert_eq!(compile(&allow_list).unwrap().len(), 2, "default + errno 38");
        let deny_list = SeccompProfile {
            default_action: SeccompAction::Allow,
            rules: vec![rule(
                &["chmod", "fchmodat"],
                SeccompAction::Errno(1),
                vec![],
            )],
        };
        assert_eq!(compile(&deny_list).unwrap().len(), 1);
        let nothing = SeccompProfile {
            default_action: SeccompAction::Allow,
            rules: vec![],
        };
        assert!(compile(&nothing).unwrap().is_empty());
    }

    #[test]
    fn argument_conditions_compile_and_an_unconditional_rule_wins() {
        let arg = |op, value, value_two| SeccompArg {
            index: 0,
            op,
            value,
            value_two,
        };
        let p = SeccompProfile {
            default_action: SeccompAction::KillProcess,
            rules: vec![
                rule(
                    &["personality"],
                    SeccompAction::Allow,
                    vec![arg(SeccompOp::Eq, 8, 0)],
                ),
                rule(
                    &["personality"],
                    SeccompAction::Allow,
                    vec![arg(SeccompOp::MaskedEq, 0xff, 8)],
                ),
                rule(
                    &["uname"],
                    SeccompAction::Allow,
                    vec![arg(SeccompOp::Ne, 1, 0)],
                ),
                rule(&["uname"], SeccompAction::Allow, vec![]),
            ],
        };
        let programs = compile(&p).unwrap();
        assert_eq!(programs.len(), 1);
        let mut chains = Chains::new();
        add(&mut chains, "uname", &p.rules[2].args);
        add(&mut chains, "uname", &[]);
        add(&mut chains, "uname", &p.rules[2].args);
        assert_eq!(chains["uname"], None, "unconditional");
    }
}
