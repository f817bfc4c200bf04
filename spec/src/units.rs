//! Sizes and durations as people write them (`256M`, `1G`, `90s`, `1h30m`): the one parser the
//! CLI's flags and the Python SDK's keyword arguments share. Only syntax: whether a value is
//! allowed (memory 0, say) is [`crate::Spec::validate`]'s.

use std::time::Duration;

use thiserror::Error;

/// A value that is not a size or a duration; the message names it and the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct UnitError(pub String);

fn err(msg: String) -> UnitError {
    UnitError(msg)
}

/// Parses a memory size into MiB: a number with an optional `K`, `M`, `G` or `T` suffix
/// (also `KiB`/`KB`/..., any case); a bare number is MiB. The result must be a whole
/// number of MiB (`1536K` is fine, `1000K` is not).
pub fn mem_mib(s: &str) -> Result<i64, UnitError> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.strip_suffix('b').unwrap_or(&lower);
    let body = body.strip_suffix('i').unwrap_or(body);
    let (digits, kib_per_unit): (&str, u128) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 1),
        Some('m') => (&body[..body.len() - 1], 1024),
        Some('g') => (&body[..body.len() - 1], 1024 * 1024),
        Some('t') => (&body[..body.len() - 1], 1024 * 1024 * 1024),
        _ => (body, 1024),
    };
    let bad = || {
        err(format!(
            "invalid size {s:?}: expected a number with an optional K, M or G suffix (MiB when bare), e.g. 256M or 1G"
        ))
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u128 = digits.parse().map_err(|_| bad())?;
    let kib = n.checked_mul(kib_per_unit).ok_or_else(bad)?;
    if kib % 1024 != 0 {
        return Err(err(format!(
            "invalid size {s:?}: not a whole number of MiB"
        )));
    }
    i64::try_from(kib / 1024).map_err(|_| err(format!("invalid size {s:?}: too large")))
}

/// Parses a duration: a sequence of `<number><unit>` with units `ms`, `s`, `m`, `h`
/// (e.g. `90s`, `5m`, `1h30m`); a bare number is seconds.
pub fn duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim();
    let bad = || {
        err(format!(
            "invalid duration {s:?}: expected e.g. 60s, 5m, 1h30m (seconds when bare)"
        ))
    };
    if t.is_empty() {
        return Err(bad());
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse::<u64>().map(Duration::from_secs).map_err(|_| bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let n_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        if n_len == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..n_len].parse().map_err(|_| bad())?;
        rest = &rest[n_len..];
        let u_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let part = match &rest[..u_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = &rest[u_len..];
    }
    Ok(total)
}

/// Formats a duration compactly (`1h2m3s`, `45s`, `250ms`).
pub fn fmt_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}
