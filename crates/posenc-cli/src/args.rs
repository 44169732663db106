//! Parsing of list and range arguments (positions, relative ranges).

use crate::{CliError, CliResult};

/// Parses `0,1,4095,1000000` into positions; negative values are an error
/// naming the position.
pub fn parse_positions(s: &str) -> CliResult<Vec<u64>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let v: i128 = part
            .parse()
            .map_err(|_| CliError(format!("invalid position {part:?}: not an integer")))?;
        if v < 0 {
            return Err(posenc::Error::NegativePosition(v.max(i64::MIN as i128) as i64).into());
        }
        let v = u64::try_from(v).map_err(|_| CliError(format!("position {part} is too large")))?;
        out.push(v);
    }
    if out.is_empty() {
        return Err(CliError("no positions given".into()));
    }
    Ok(out)
}

/// Parses `LO:HI` (inclusive) into a range of relative positions.
pub fn parse_relative_range(s: &str) -> CliResult<(i64, i64)> {
    let (lo, hi) = s
        .split_once(':')
        .ok_or_else(|| CliError(format!("invalid range {s:?}: expected LO:HI, e.g. -8:8")))?;
    let lo: i64 = lo
        .trim()
        .parse()
        .map_err(|_| CliError(format!("invalid range start {lo:?}: not an integer")))?;
    let hi: i64 = hi
        .trim()
        .parse()
        .map_err(|_| CliError(format!("invalid range end {hi:?}: not an integer")))?;
    if lo > hi {
        return Err(CliError(format!(
            "invalid range {s}: start {lo} is after end {hi}"
        )));
    }
    if hi - lo > 10_000_000 {
        return Err(CliError(format!(
            "range {s} is too long (at most 10^7 values)"
        )));
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_parse_and_reject_negatives() {
        assert_eq!(parse_positions("0, 1,4095").unwrap(), vec![0, 1, 4095]);
        let e = parse_positions("0,-3").unwrap_err().0;
        assert!(e.contains("-3") && e.contains("negative"), "{e}");
        assert!(parse_positions("x").is_err());
        assert!(parse_positions("").is_err());
    }

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_relative_range("-3:4").unwrap(), (-3, 4));
        assert!(parse_relative_range("4:-3").is_err());
        assert!(parse_relative_range("4").is_err());
    }
}
