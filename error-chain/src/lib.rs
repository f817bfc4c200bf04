//! One way to render an error with all its causes on one line, `outer: cause: root cause`,
//! for the places that must turn an error into text: the agent's wire error messages, the
//! binaries' last words, the end-to-end suite's failure lines. Standard library only, so the
//! static guest agent and the VMM can both use it.

use std::error::Error;

/// The error and all its sources joined by `: `. A cause whose text the line already
/// contains (an error that repeats its source's message) is not repeated.
pub fn error_chain(e: &(dyn Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);

    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn joins_causes_once() {
        let root = E("no such file", None);
        assert_eq!(error_chain(&root), "no such file");
        let e = E("open a", Some(Box::new(E("io", Some(Box::new(root))))));
        assert_eq!(error_chain(&e), "open a: io: no such file");
        let repeats = E("open a: io", Some(Box::new(E("io", None))));
        assert_eq!(error_chain(&repeats), "open a: io");
    }
}
