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
        .map(|d| (d.name(), d.containment(), d.detect()))
        .collect();
    if a.json {
        let list: Vec<_> = rows
            .iter()
            .map(|(name, containment, avail)| {
                json!({
                    "name": name,
                    "available": avail.ok,
                    "containment": containment.to_string(),
                    "reason": avail.detail,
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(list))?;
    } else {
        let mut t = Table::new(&["NAME", "AVAILABLE", "CONTAINMENT", "REASON"]);
        for (name, containment, avail) in &rows {
            let yes = if avail.ok { "yes" } else { "no" };
            t.row(vec![
                name.to_string(),
                yes.into(),
                containment.to_string(),
                avail.detail.clone(),
            ]);
        }
        print_table(&t)?;
    }
    Ok(crate::exit::OK)
}
