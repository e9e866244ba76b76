//! Kubernetes resource quantities (`500m`, `2`, `1Gi`, `1e3`) as integers, for the syncer's quota ledger and
//! `kubectl vc describe`'s usage against quota.

/// Parses a Kubernetes quantity into units of `1 / scale` (e.g. scale 1000 gives millis), rounding up.
/// `None` when it is not a quantity.
pub fn parse_quantity(quantity: &str, scale: f64) -> Option<i64> {
    let text = quantity.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => 10f64.powi(exponent[1..].parse().ok()?),
        _ => return None,
    };
    Some((value * factor * scale).ceil() as i64)
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
}
