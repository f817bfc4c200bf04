//! `--dry-run`: resolve the spec, validate it, run driver selection, print the verdict,
//! boot nothing. The exit code is the one a real run would fail with (0 when it would boot).

use serde_json::{Value, json};
use vm_sandbox::drivers::Registry;
use vm_spec::{Policy, Spec, Trust};

use crate::exit;
use crate::output::{errln, out, print_json};

/// What a dry run reports.
pub struct Plan<'a> {
    pub spec: &'a Spec,
    pub trust: Trust,
    pub policy: Policy,
    pub driver: Option<&'a str>,
    /// The guest command (exec/serve), if any.
    pub command: Option<&'a [String]>,
    /// Working directory, if given.
    pub workdir: Option<&'a str>,
    /// Normalized publish specs (serve).
    pub publish: Option<Vec<String>>,
    /// VM name (run -d).
    pub name: Option<&'a str>,
}

impl<'a> Plan<'a> {
    /// A plan for `resolved` on the chosen driver (if any), with no command, workdir,
    /// publish specs or name; callers fill in what their command has.
    pub fn new(resolved: &'a crate::resolve::Resolved, driver: Option<&'a str>) -> Plan<'a> {
        Plan {
            spec: &resolved.spec,
            trust: resolved.trust,
            policy: resolved.policy,
            driver,
            command: None,
            workdir: None,
            publish: None,
            name: None,
        }
    }
}

/// Validates and selects; prints text or JSON; returns the exit code.
pub fn report(plan: &Plan<'_>, as_json: bool) -> anyhow::Result<u8> {
    let validation = plan.spec.validate();
    let registry = Registry::with_defaults();
    let selection = vm_sandbox::select(&registry, plan.driver, plan.trust, &plan.policy);
    let allow_weaker = plan.policy.allow_weaker_jail || plan.trust != Trust::Untrusted;
    // A driver whose jail this host cannot build refuses the boot unless a weaker one is
    // accepted: the dry run says so the same way.
    let jail_refusal = selection
        .as_ref()
        .ok()
        .and_then(|d| d.jail())
        .and_then(|j| j.decide(allow_weaker).err());
    let (code, verdict) = match (&validation, &selection) {
        (Err(_), _) => (exit::REFUSED, "refused"),
        (Ok(_), Ok(_)) if jail_refusal.is_some() => (exit::REFUSED, "refused"),
        (Ok(_), Err(e)) => {
            let code = exit::code(vm_sandbox::classify(e).class);
            (
                code,
                if code == exit::NO_DRIVER {
                    "no-driver"
                } else {
                    "refused"
                },
            )
        }
        (Ok(_), Ok(_)) => (exit::OK, "ok"),
    };
    let validation_json = match &validation {
        Ok(v) => json!({ "ok": true, "normalized": v }),
        Err(e) => json!({ "ok": false, "error": e.to_string() }),
    };
    let driver_json = match &selection {
        Ok(d) => {
            json!({
                "ok": true,
                "name": d.name(),
                "containment": d.containment().to_string(),
                "jail": d.jail().map(|j| {
                    let applied = j.applied(allow_weaker);
                    let mut v = json!(j);
                    v["applied"] = json!(applied);
                    v
                }),
            })
        }
        Err(e) => json!({ "ok": false, "error": e.to_string() }),
    };
    let doc = json!({
        "name": plan.name,
        "command": plan.command,
        "workdir": plan.workdir,
        "trust": plan.trust,
        "policy": plan.policy,
        "driver_requested": plan.driver,
        "publish": plan.publish,
        "spec": plan.spec,
        "validation": validation_json,
        "driver": driver_json,
        "verdict": verdict,
        "exit_code": code,
    });
    if as_json {
        print_json(&doc)?;
    } else {
        out!("{}", text(&doc));
    }
    // The verdict's reason also goes to stderr as the usual one-line error.
    let reason = match (&validation, &selection) {
        (Err(e), _) => Some(e.to_string()),
        (Ok(_), Err(e)) => Some(e.to_string()),
        _ => jail_refusal.map(|why| {
            format!("the driver's jail cannot be built here ({why}); pass --allow-weaker-jail to accept running without it")
        }),
    };
    if let Some(reason) = reason {
        errln!("vm: {reason}");
    }
    Ok(code)
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The text rendering of a dry-run document.
fn text(doc: &Value) -> String {
    let spec = &doc["spec"];
    let g = &spec["guarantees"];
    let l = &g["limits"];
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<12} {v}\n"));
    if !doc["name"].is_null() {
        line("name", s(&doc["name"]));
    }
    if let Some(cmd) = doc["command"].as_array() {
        let given = cmd.iter().map(s).collect::<Vec<_>>().join(" ");
        line(
            "command",
            match given.is_empty() {
                true => "- (the image's entrypoint + cmd)".into(),
                false => given,
            },
        );
    }
    if !doc["workdir"].is_null() {
        line("workdir", s(&doc["workdir"]));
    }
    line(
        "trust",
        format!(
            "{} (allow emulation: {})",
            s(&doc["trust"]),
            doc["policy"]["allow_emulation"]
        ),
    );
    let img = &spec["image"];
    line("kernel", s(&img["kernel"]));
    line("initrd", s(&img["initrd"]));
    if !img["source"].is_null() {
        let src = &img["source"];
        line(
            "image",
            format!("{} ({})", s(&src["reference"]), s(&src["digest"])),
        );
    }
    if !img["rootfs"].is_null() {
        line("rootfs", s(&img["rootfs"]));
    }
    let cfg = &img["config"];
    for kv in cfg["env"].as_array().into_iter().flatten() {
        line("image env", format!("{}={}", s(&kv[0]), s(&kv[1])));
    }
    let words = |v: &Value| {
        v.as_array()
            .map(|a| a.iter().map(s).collect::<Vec<_>>().join(" "))
    };
    for (label, key) in [("image wdir", "working_dir"), ("image user", "user")] {
        if !cfg[key].is_null() {
            line(label, s(&cfg[key]));
        }
    }
    for (label, key) in [("entrypoint", "entrypoint"), ("cmd", "cmd")] {
        if let Some(w) = words(&cfg[key]).filter(|w| !w.is_empty()) {
            line(label, w);
        }
    }
    let user = [&spec["user"], &cfg["user"]]
        .into_iter()
        .find(|u| !u.is_null())
        .map(s)
        .unwrap_or_else(|| "root".into());
    line("user", user);
    // As the spec says it: `none` only when it sets none (a 0 is shown, and refused).
    let wall = l["wall_ms"].as_u64();
    line(
        "limits",
        format!(
            "memory {} MiB, cpus {}, pids {}, wall {}",
            l["mem_mib"],
            l["vcpus"],
            l["pids"],
            wall.map(|w| crate::parse::fmt_duration(std::time::Duration::from_millis(w)))
                .unwrap_or_else(|| "none".into())
        ),
    );
    line(
        "egress",
        if g["egress_denied"] == Value::Bool(true) {
            "denied".into()
        } else {
            "allowed".into()
        },
    );
    for m in g["mounts"].as_array().into_iter().flatten() {
        let mode = if m["read_only"] == Value::Bool(true) {
            "ro"
        } else {
            "rw"
        };
        line(
            "mount",
            format!("{} -> {} ({mode})", s(&m["host_path"]), s(&m["guest_path"])),
        );
    }
    for kv in g["env"].as_array().into_iter().flatten() {
        line("env", format!("{}={}", s(&kv[0]), s(&kv[1])));
    }
    for p in doc["publish"].as_array().into_iter().flatten() {
        line("publish", s(p));
    }
    let v = &doc["validation"];
    line(
        "validation",
        if v["ok"] == Value::Bool(true) {
            "ok".into()
        } else {
            format!("refused: {}", s(&v["error"]))
        },
    );
    let d = &doc["driver"];
    line(
        "driver",
        if d["ok"] == Value::Bool(true) {
            format!("{} ({})", s(&d["name"]), s(&d["containment"]))
        } else {
            format!("none: {}", s(&d["error"]))
        },
    );
    line(
        "verdict",
        format!("{} (exit {})", s(&doc["verdict"]), doc["exit_code"]),
    );
    out
}
