//! `vm drivers`: the driver registry as a table.

use serde_json::json;
use vm_sandbox::drivers::Registry;

use crate::args::DriversArgs;
use crate::output::{Table, print_json, print_table};

/// Prints every registered driver with its detection verdict.
pub fn run(a: DriversArgs) -> anyhow::Result<u8> {
    let registry = Registry::with_defaults();
    let rows: Vec<_> = registry
        .drivers()
        .map(|d| {
            (
                d.name(),
                d.containment(),
                d.detect(),
                d.jail(),
                d.snapshots(),
            )
        })
        .collect();
    if a.json {
        let list: Vec<_> = rows
            .iter()
            .map(|(name, containment, avail, jail, snapshots)| {
                json!({
                    "name": name,
                    "available": avail.ok,
                    "containment": containment.to_string(),
                    "reason": avail.detail,
                    "jail": jail,
                    "snapshots": { "supported": snapshots.ok, "detail": snapshots.detail },
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(list))?;
    } else {
        let mut t = Table::new(&[
            "NAME",
            "AVAILABLE",
            "CONTAINMENT",
            "JAIL",
            "SNAPSHOTS",
            "REASON",
        ]);
        for (name, containment, avail, jail, snapshots) in &rows {
            let yes = if avail.ok { "yes" } else { "no" };
            let jail = match jail {
                Some(j) if !j.granted => "not granted".to_string(),
                Some(j) if j.namespaces.is_empty() => "seccomp only".to_string(),
                Some(j) => format!("{}+seccomp", j.namespaces.join(",")),
                None => "-".to_string(),
            };
            t.row(vec![
                name.to_string(),
                yes.into(),
                containment.to_string(),
                jail,
                if snapshots.ok { "yes" } else { "no" }.into(),
                avail.detail.clone(),
            ]);
        }
        print_table(&t)?;
        // Why an available driver cannot snapshot (`vm exec --from` on it is refused so).
        for (name, _, avail, _, snapshots) in &rows {
            if avail.ok && !snapshots.ok {
                crate::output::outln!("{name}: no snapshots: {}", snapshots.detail);
            }
        }
    }
    Ok(crate::exit::OK)
}
