//! Byte sizes on the command line: `1048576`, `1MiB`, `1M`, `1MB`, `2GiB` ...

/// Why a size did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseSizeError {
    #[error("`{0}` is negative; a size must be a positive number of bytes")]
    Negative(String),
    #[error(
        "`{0}` is not a size: expected digits with an optional unit (K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB, TB)"
    )]
    Malformed(String),
    #[error(
        "`{0}` has an unknown unit `{1}` (use K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB or TB)"
    )]
    Unit(String, String),
    #[error("`{0}` does not fit in 64 bits")]
    Overflow(String),
    #[error("0 is not a usable size limit")]
    Zero,
    #[error(
        "`{0}` is {1} bytes, too little memory to run any program (at least 1 MiB); a size is bytes unless a unit follows: K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB or TB (e.g. 512M)"
    )]
    TooLittleMemory(String, u64),
}

/// The least memory a limit may leave a process (`--memory`, `--address-space`): below it not
/// even a static binary's first pages fit, so a smaller value is a missing unit (`--memory 10`
/// meant as 10 bytes), not a limit anyone wants.
pub const MIN_MEMORY: u64 = 1 << 20;

/// Parse a memory limit: a size ([`parse_size`]) of at least [`MIN_MEMORY`].
pub fn parse_memory(input: &str) -> Result<u64, ParseSizeError> {
    let v = parse_size(input)?;
    if v < MIN_MEMORY {
        return Err(ParseSizeError::TooLittleMemory(input.trim().into(), v));
    }
    Ok(v)
}

/// Parse a byte count. Binary units (`K`, `KiB`) are powers of 1024; `KB`, `MB` ... are SI.
pub fn parse_size(input: &str) -> Result<u64, ParseSizeError> {
    let s = input.trim();
    if s.starts_with('-') {
        return Err(ParseSizeError::Negative(input.into()));
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(ParseSizeError::Malformed(input.into()));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| ParseSizeError::Overflow(input.into()))?;
    let mult: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "Ki" => 1 << 10,
        "KB" | "kB" => 1_000,
        "M" | "m" | "MiB" | "Mi" => 1 << 20,
        "MB" => 1_000_000,
        "G" | "g" | "GiB" | "Gi" => 1 << 30,
        "GB" => 1_000_000_000,
        "T" | "t" | "TiB" | "Ti" => 1 << 40,
        "TB" => 1_000_000_000_000,
        other => return Err(ParseSizeError::Unit(input.into(), other.into())),
    };
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| ParseSizeError::Overflow(input.into()))?;
    if v == 0 {
        return Err(ParseSizeError::Zero);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
    }

    #[test]
    fn bad_sizes_name_the_problem() {
        assert!(matches!(parse_size("-5"), Err(ParseSizeError::Negative(_))));
        assert!(matches!(
            parse_size("abc"),
            Err(ParseSizeError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("5 parsecs"),
            Err(ParseSizeError::Unit(..))
        ));
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(ParseSizeError::Overflow(_))
        ));
        assert!(matches!(
            parse_size("17179869184GiB"),
            Err(ParseSizeError::Overflow(_))
        ));
        assert!(matches!(parse_size("0"), Err(ParseSizeError::Zero)));
    }

    #[test]
    fn a_memory_limit_that_runs_nothing_is_refused() {
        let e = parse_memory("10").unwrap_err();
        assert_eq!(e, ParseSizeError::TooLittleMemory("10".into(), 10));
        let text = e.to_string();
        assert!(text.contains("MiB") && text.contains("512M"), "{text}");
        assert!(matches!(
            parse_memory("1023K"),
            Err(ParseSizeError::TooLittleMemory(..))
        ));
        assert_eq!(parse_memory("1M"), Ok(MIN_MEMORY));
        assert_eq!(parse_memory("64MiB"), Ok(64 << 20));
    }
}
