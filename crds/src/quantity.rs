//! Kubernetes resource quantities (`500m`, `2`, `1Gi`, `1e3`) as integers, for the syncer's quota ledger and
//! `kubectl vc describe`'s usage against quota.

/// Parses a Kubernetes quantity into units of `1 / scale` (e.g. scale 1000 gives millis), rounding up.
/// `None` when it is not a quantity or `scale` is not a whole number of at least 1. Exact decimal
/// arithmetic: `0.175` at scale 1000 is 175, not the 176 a float product rounds up to. Values beyond
/// `i64` saturate.
pub fn parse_quantity(quantity: &str, scale: f64) -> Option<i64> {
    if scale < 1.0 || scale.fract() != 0.0 || scale > 1e18 {
        return None;
    }
    let text = quantity.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (negative, digits) = match number.as_bytes().first() {
        Some(b'-') => (true, &number[1..]),
        Some(b'+') => (false, &number[1..]),
        _ => (false, number),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let well_formed = !(whole.is_empty() && fraction.is_empty())
        && whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit());
    if !well_formed {
        return None;
    }
    // value = mantissa * 2^(10 * binary) * 10^(decimal - fraction digits)
    let (binary, decimal): (u32, i64) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (1, 0),
        "Mi" => (2, 0),
        "Gi" => (3, 0),
        "Ti" => (4, 0),
        "Pi" => (5, 0),
        "Ei" => (6, 0),
        exponent if exponent.starts_with(['e', 'E']) => (0, exponent[1..].parse().ok()?),
        _ => return None,
    };
    let saturated = if negative { i64::MIN } else { i64::MAX };
    let significant = format!("{whole}{fraction}");
    let significant = significant.trim_start_matches('0');
    if significant.is_empty() {
        return Some(0);
    }
    let Ok(mantissa) = significant.parse::<i128>() else {
        return Some(saturated);
    };
    let exponent = decimal - fraction.len() as i64;
    let Some(numerator) = mantissa
        .checked_mul(1i128 << (10 * binary))
        .and_then(|n| n.checked_mul(scale as i128))
        .and_then(|n| {
            let up = u32::try_from(exponent.max(0)).ok()?;
            n.checked_mul(10i128.checked_pow(up)?)
        })
    else {
        return Some(saturated);
    };
    let down = u32::try_from((-exponent).max(0)).unwrap_or(u32::MAX);
    let magnitude = match 10i128.checked_pow(down) {
        // Ceiling of the magnitude for positive values, and towards zero (the ceiling) for negative ones.
        Some(denominator) if negative => numerator / denominator,
        Some(denominator) => numerator / denominator + i128::from(numerator % denominator != 0),
        // Smaller than any unit: a positive value still counts one.
        None => i128::from(!negative),
    };
    let value = if negative { -magnitude } else { magnitude };
    Some(i64::try_from(value).unwrap_or(saturated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_in_every_notation() {
        assert_eq!(parse_quantity("500m", 1000.0), Some(500));
        assert_eq!(parse_quantity("2", 1000.0), Some(2000));
        assert_eq!(parse_quantity("0.25", 1000.0), Some(250));
        assert_eq!(parse_quantity("1Gi", 1.0), Some(1 << 30));
        assert_eq!(parse_quantity("128Mi", 1.0), Some(128 << 20));
        assert_eq!(parse_quantity("1k", 1.0), Some(1000));
        assert_eq!(parse_quantity("1e3", 1.0), Some(1000));
        assert_eq!(parse_quantity("lots", 1.0), None);
    }

    #[test]
    fn decimals_are_exact_and_round_up_only_when_they_must() {
        // A float product makes 0.175 * 1000 = 175.00000000000003, which rounded up to 176.
        assert_eq!(parse_quantity("175m", 1000.0), Some(175));
        assert_eq!(parse_quantity("0.175", 1000.0), Some(175));
        assert_eq!(parse_quantity("0.1", 1000.0), Some(100));
        assert_eq!(parse_quantity("1.1Gi", 1.0), Some(1_181_116_007)); // 1181116006.4 rounded up
        assert_eq!(parse_quantity("100Mi", 1.0), Some(104_857_600));
        assert_eq!(parse_quantity("1500u", 1000.0), Some(2)); // 1.5m rounded up
        assert_eq!(parse_quantity("250000000n", 1000.0), Some(250));
        assert_eq!(parse_quantity("1x", 1.0), None);
        assert_eq!(parse_quantity("0.5m", 1000.0), Some(1));
        assert_eq!(parse_quantity("-0.5m", 1000.0), Some(0));
        assert_eq!(parse_quantity("-2", 1000.0), Some(-2000));
        assert_eq!(parse_quantity("+2k", 1.0), Some(2000));
        assert_eq!(parse_quantity("1e-400", 1.0), Some(1));
        assert_eq!(parse_quantity("0e999", 1.0), Some(0));
        assert_eq!(parse_quantity("9e400", 1.0), Some(i64::MAX));
        assert_eq!(parse_quantity("8Ei", 1000.0), Some(i64::MAX));
        assert_eq!(parse_quantity(".", 1.0), None);
        assert_eq!(parse_quantity("1.2.3", 1.0), None);
        assert_eq!(parse_quantity("--1", 1.0), None);
        assert_eq!(parse_quantity("1", 0.5), None);
    }
}
