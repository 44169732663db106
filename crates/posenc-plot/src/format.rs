//! Number formatting for labels and legends.

/// Formats a value compactly for a legend or label: at most three decimals
/// with trailing zeros removed, scientific notation for very large or very
/// small magnitudes, and no negative zero.
///
/// ```
/// use posenc_plot::format_value;
/// assert_eq!(format_value(1.0), "1");
/// assert_eq!(format_value(-0.25), "-0.25");
/// assert_eq!(format_value(1.0 / 3.0), "0.333");
/// assert_eq!(format_value(-0.0), "0");
/// assert_eq!(format_value(123456.0), "1.23e5");
/// assert_eq!(format_value(0.00012), "1.2e-4");
/// ```
pub fn format_value(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a >= 1e5 || (a > 0.0 && a < 1e-3) {
        return sci(v, 2);
    }
    let s = trim_zeros(format!("{v:.3}"));
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

/// Scientific notation with at most `digits` mantissa decimals, zeros trimmed.
fn sci(v: f64, digits: usize) -> String {
    let s = format!("{v:.digits$e}");
    match s.split_once('e') {
        Some((m, e)) => format!("{}e{e}", trim_zeros(m.to_string())),
        None => s,
    }
}

fn trim_zeros(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Formats tick `v` of an axis whose ticks are `step` apart, with the same
/// number of decimals for every tick of the axis.
pub(crate) fn format_tick(v: f64, step: f64) -> String {
    let a = v.abs();
    if a >= 1e5 || (step < 1e-3 && a > 0.0) {
        return sci(v, 2);
    }
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10()).ceil().max(0.0) as usize
    };
    // Snap tiny round-off to zero so "-0.0" never appears.
    let v = if a < step * 1e-9 { 0.0 } else { v };
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_share_decimals() {
        assert_eq!(format_tick(0.5, 0.5), "0.5");
        assert_eq!(format_tick(1.0, 0.5), "1.0");
        assert_eq!(format_tick(-1e-17, 0.5), "0.0");
        assert_eq!(format_tick(20.0, 10.0), "20");
        assert_eq!(format_tick(0.25, 0.05), "0.25");
        assert_eq!(format_tick(2e5, 1e5), "2e5");
    }

    #[test]
    fn values() {
        assert_eq!(format_value(0.0), "0");
        assert_eq!(format_value(12.5), "12.5");
        assert_eq!(format_value(-99999.0), "-99999");
        assert_eq!(format_value(f64::NAN), "NaN");
    }
}
