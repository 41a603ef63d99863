//! The parsers of flag values: each refuses what it cannot take with a message that names it.

use crate::policy::{ParseSizeError, parse_memory, parse_size};

/// `--cpus N` (fractional) in thousandths of a CPU.
pub(super) fn parse_cpus(s: &str) -> Result<u64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of CPUs (e.g. 0.5, 2)"))?;
    if !v.is_finite() || v < 0.001 {
        return Err(format!("`{s}`: --cpus must be at least 0.001"));
    }
    if v > 65536.0 {
        return Err(format!("`{s}`: --cpus is at most 65536"));
    }
    Ok((v * 1000.0).round() as u64)
}

/// Log levels `--log-level` accepts, alone or as the level of a `target=level` directive.
pub(super) const LOG_LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// A level name, or comma-separated directives (`warn,openshell_sandbox=debug`). A bare word
/// that is no level would be read by tracing as a target name at level trace, so that `bogus`
/// silently enables everything below a target that does not exist: refuse it.
pub(super) fn parse_log_level(s: &str) -> Result<String, String> {
    let level_ok = |l: &str| LOG_LEVELS.contains(&l.trim().to_ascii_lowercase().as_str());
    for part in s.split(',') {
        let ok = match part.split_once('=') {
            Some((target, level)) => !target.trim().is_empty() && level_ok(level),
            None => level_ok(part),
        };
        if !ok {
            return Err(format!(
                "`{part}` is not a log level: use one of {} (or target=level directives)",
                LOG_LEVELS.join(", ")
            ));
        }
    }
    Ok(s.to_owned())
}

pub(super) fn parse_env_pair(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not K=V: missing `=`"))?;
    if k.is_empty() {
        return Err(format!("`{s}` has an empty variable name"));
    }
    if !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        || k.as_bytes()[0].is_ascii_digit()
    {
        return Err(format!(
            "`{k}` is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
        ));
    }
    if v.contains('\0') {
        return Err(format!("the value of `{k}` contains a NUL byte"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

pub(super) fn parse_hostname(s: &str) -> Result<String, String> {
    // sethostname(2) takes at most HOST_NAME_MAX (64) bytes.
    if s.is_empty() || s.len() > 64 {
        return Err(format!("`{s}`: a hostname is 1 to 64 bytes"));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(format!(
            "`{s}`: only letters, digits, `-` and `.` are allowed"
        ));
    }
    Ok(s.to_owned())
}

pub(super) fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e: ParseSizeError| e.to_string())
}

pub(super) fn parse_memory_arg(s: &str) -> Result<u64, String> {
    parse_memory(s).map_err(|e: ParseSizeError| e.to_string())
}

pub(super) fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if s.starts_with('-') {
        return Err(format!(
            "`{s}` is negative; a count must be a positive whole number"
        ));
    }
    let n: u64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number, or does not fit in 64 bits"))?;
    if n == 0 {
        return Err("0 is not allowed here; the limit must be at least 1".into());
    }
    Ok(n)
}

pub(super) fn parse_id(s: &str) -> Result<u32, String> {
    let s = s.trim();
    let n: u64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a numeric id"))?;
    // 2^32-1 is (uid_t)-1, the "no change" sentinel of setresuid; it can never be an identity.
    if n >= u64::from(u32::MAX) {
        return Err(format!("`{s}` is out of range (0 ..= 4294967294)"));
    }
    Ok(n as u32)
}

/// An inclusive range of uids for `run --uid-range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub start: u32,
    pub end: u32,
}

pub(super) fn parse_uid_range(s: &str) -> Result<UidRange, String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("`{s}` is not START-END"))?;
    let (start, end) = (parse_id(a)?, parse_id(b)?);
    if start > end {
        return Err(format!("`{s}`: START is above END"));
    }
    // Uids below 1000 are system accounts (Debian policy 9.2.2): never hand one to a run.
    if start < 1000 {
        return Err(format!("`{s}` includes system uids (below 1000)"));
    }
    Ok(UidRange { start, end })
}

pub(super) fn parse_secs(s: &str, allow_zero: bool) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "`{s}` must be a finite, non-negative number of seconds"
        ));
    }
    if !allow_zero && v == 0.0 {
        return Err("0 seconds is not a usable limit".into());
    }
    if v > 365.0 * 24.0 * 3600.0 {
        return Err(format!(
            "`{s}` seconds is more than a year; refusing an overflowing limit"
        ));
    }
    Ok(v)
}

pub(super) fn parse_positive_secs(s: &str) -> Result<f64, String> {
    parse_secs(s, false)
}

pub(super) fn parse_nonneg_secs(s: &str) -> Result<f64, String> {
    parse_secs(s, true)
}
