//! A small shell-style glob over `/`-separated relative paths, matched host-side against
//! the agent's file listing so the result does not depend on a guest shell.
//!
//! - `*` matches any run of characters within one component (not `/`);
//! - `?` matches one character other than `/`;
//! - `[abc]`, `[a-z]`, `[!a-z]` / `[^a-z]` match one character from (or not from) a class;
//! - `**` as a whole component matches zero or more components;
//! - `\x` matches `x` literally.
//!
//! Leading dots are not special. Patterns are relative (no leading `/`, no `..`).

use thiserror::Error;

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GlobError {
    #[error("glob {0:?}: unclosed character class")]
    UnclosedClass(String),
    #[error("glob {0:?}: trailing backslash")]
    TrailingEscape(String),
    #[error("glob {0:?}: must be relative and must not contain '..'")]
    Escapes(String),
    #[error("glob {0:?}: empty pattern")]
    Empty(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Lit(char),
    Any,
    Star,
    Class {
        negated: bool,
        items: Vec<(char, char)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    DoubleStar,
    Toks(Vec<Tok>),
}

/// A compiled glob.
#[derive(Debug, Clone)]
pub struct Glob {
    segs: Vec<Seg>,
    prefix: String,
}

impl Glob {
    /// Compile `pattern`.
    pub fn new(pattern: &str) -> Result<Glob, GlobError> {
        let err = || pattern.to_string();
        if pattern.is_empty() {
            return Err(GlobError::Empty(err()));
        }
        if pattern.starts_with('/') || pattern.split('/').any(|c| c == "..") {
            return Err(GlobError::Escapes(err()));
        }
        let mut segs = Vec::new();
        for comp in pattern.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if comp == "**" {
                if segs.last() != Some(&Seg::DoubleStar) {
                    segs.push(Seg::DoubleStar);
                }
                continue;
            }
            segs.push(Seg::Toks(compile_component(pattern, comp)?));
        }
        if segs.is_empty() {
            return Err(GlobError::Empty(err()));
        }
        let mut prefix = Vec::new();
        for seg in &segs[..segs.len() - 1] {
            match seg {
                Seg::Toks(toks) if toks.iter().all(|t| matches!(t, Tok::Lit(_))) => {
                    prefix.push(toks.iter().map(lit_char).collect::<String>());
                }
                _ => break,
            }
        }
        Ok(Glob {
            segs,
            prefix: prefix.join("/"),
        })
    }

    /// The literal leading directory (`src/a` for `src/a/*.rs`; empty when the first
    /// component has a wildcard): listing only this directory is enough.
    pub fn literal_prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the relative path `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        match_segs(&self.segs, &comps)
    }
}

fn lit_char(t: &Tok) -> char {
    match t {
        Tok::Lit(c) => *c,
        _ => '?',
    }
}

fn compile_component(pattern: &str, comp: &str) -> Result<Vec<Tok>, GlobError> {
    let mut toks = Vec::new();
    let mut chars = comp.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => {
                if toks.last() != Some(&Tok::Star) {
                    toks.push(Tok::Star);
                }
            }
            '?' => toks.push(Tok::Any),
            '\\' => match chars.next() {
                Some(e) => toks.push(Tok::Lit(e)),
                None => return Err(GlobError::TrailingEscape(pattern.into())),
            },
            '[' => {
                let negated = matches!(chars.peek(), Some('!') | Some('^'));
                if negated {
                    chars.next();
                }
                let mut items = Vec::new();
                let mut first = true;
                loop {
                    let Some(c) = chars.next() else {
                        return Err(GlobError::UnclosedClass(pattern.into()));
                    };
                    if c == ']' && !first {
                        break;
                    }
                    first = false;
                    let lo = if c == '\\' {
                        chars
                            .next()
                            .ok_or_else(|| GlobError::UnclosedClass(pattern.into()))?
                    } else {
                        c
                    };
                    let mut hi = lo;
                    let mut probe = chars.clone();
                    if probe.next() == Some('-') && probe.peek().is_some_and(|n| *n != ']') {
                        chars.next();
                        hi = chars.next().unwrap_or(lo);
                    }
                    items.push((lo, hi));
                }
                toks.push(Tok::Class { negated, items });
            }
            c => toks.push(Tok::Lit(c)),
        }
    }
    Ok(toks)
}

/// Dynamic programming over (segment, component): `ok[i][j]` = `segs[i..]` matches
/// `comps[j..]`. O(segments x components) however many `**` there are, so a hostile listing
/// (deep paths from the guest) cannot make matching explode.
fn match_segs(segs: &[Seg], comps: &[&str]) -> bool {
    let (s, c) = (segs.len(), comps.len());
    let mut ok = vec![vec![false; c + 1]; s + 1];
    ok[s][c] = true;
    for i in (0..s).rev() {
        for j in (0..=c).rev() {
            ok[i][j] = match &segs[i] {
                Seg::DoubleStar => ok[i + 1][j] || (j < c && ok[i][j + 1]),
                Seg::Toks(toks) => {
                    j < c && ok[i + 1][j + 1] && {
                        let chars: Vec<char> = comps[j].chars().collect();
                        match_toks(toks, &chars)
                    }
                }
            };
        }
    }
    ok[0][0]
}

/// Iterative wildcard match with single-star backtracking (linear-ish, no recursion blowup).
fn match_toks(toks: &[Tok], s: &[char]) -> bool {
    let (mut t, mut i) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        match toks.get(t) {
            Some(Tok::Star) => {
                star = Some((t, i));
                t += 1;
                continue;
            }
            Some(tok) if one(tok, s[i]) => {
                t += 1;
                i += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((st, si)) => {
                t = st + 1;
                i = si + 1;
                star = Some((st, si + 1));
            }
            None => return false,
        }
    }
    toks[t..].iter().all(|tok| *tok == Tok::Star)
}

fn one(tok: &Tok, c: char) -> bool {
    match tok {
        Tok::Lit(l) => *l == c,
        Tok::Any => true,
        Tok::Star => false,
        Tok::Class { negated, items } => {
            items.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let cases: &[(&str, &str, bool)] = &[
            ("*.rs", "main.rs", true),
            ("*.rs", "src/main.rs", false),
            ("*.rs", ".hidden.rs", true),
            ("src/*.rs", "src/lib.rs", true),
            ("src/*.rs", "src/a/lib.rs", false),
            ("src/**/*.rs", "src/lib.rs", true),
            ("src/**/*.rs", "src/a/b/lib.rs", true),
            ("src/**/*.rs", "lib.rs", false),
            ("**", "a/b/c", true),
            ("**/c", "c", true),
            ("**/c", "a/b/c", true),
            ("**/c", "a/b/cc", false),
            ("a/**", "a/x", true),
            ("a/**/**/b", "a/b", true),
            ("?.txt", "a.txt", true),
            ("?.txt", "ab.txt", false),
            ("?", "/", false),
            ("[abc].txt", "b.txt", true),
            ("[abc].txt", "d.txt", false),
            ("[a-c]x", "cx", true),
            ("[!a-c]x", "cx", false),
            ("[^a-c]x", "dx", true),
            ("[]]", "]", true),
            ("[a-]", "-", true),
            ("\\*", "*", true),
            ("\\*", "a", false),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
            ("*", "", false),
            ("data.csv", "data.csv", true),
            ("./data.csv", "data.csv", true),
            ("d*/*.csv", "data/x.csv", true),
        ];
        for (pat, path, want) in cases {
            let g = Glob::new(pat).unwrap_or_else(|e| panic!("{pat}: {e}"));
            assert_eq!(g.matches(path), *want, "{pat} vs {path}");
        }
    }

    #[test]
    fn refusals() {
        assert!(matches!(Glob::new("[ab"), Err(GlobError::UnclosedClass(_))));
        assert!(matches!(
            Glob::new("a\\"),
            Err(GlobError::TrailingEscape(_))
        ));
        assert!(matches!(Glob::new("/etc/*"), Err(GlobError::Escapes(_))));
        assert!(matches!(Glob::new("../*"), Err(GlobError::Escapes(_))));
        assert!(matches!(Glob::new(""), Err(GlobError::Empty(_))));
    }

    #[test]
    fn literal_prefix() {
        assert_eq!(Glob::new("src/a/*.rs").unwrap().literal_prefix(), "src/a");
        assert_eq!(Glob::new("src/**/x").unwrap().literal_prefix(), "src");
        assert_eq!(Glob::new("*.rs").unwrap().literal_prefix(), "");
        assert_eq!(Glob::new("a.txt").unwrap().literal_prefix(), "");
    }

    #[test]
    fn long_inputs_stay_fast() {
        let g = Glob::new("*a*a*a*a*a*a*b").unwrap();
        let s = "a".repeat(4000);
        assert!(!g.matches(&s));
        // Deep paths (a guest controls the listing) against many `**`.
        let g = Glob::new("**/a/**/a/**/a/**/a/**/b").unwrap();
        let deep = vec!["a"; 2000].join("/");
        assert!(!g.matches(&deep));
        assert!(g.matches(&format!("{deep}/b")));
    }
}
