//! Durations on the command line (`90m`, `24h`, `7d`, `1h30m`) and ages in tables (kubectl's style).

use std::time::Duration;

const UNITS: [(char, u64); 5] = [
    ('w', 7 * 86_400),
    ('d', 86_400),
    ('h', 3_600),
    ('m', 60),
    ('s', 1),
];

/// Parses a duration: one or more `<integer><unit>` with units `s`, `m`, `h`, `d`, `w` (e.g. `90m`,
/// `1h30m`, `7d`). A bare `0` is zero.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration; give e.g. 90m, 24h or 7d".into());
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let Some((_, seconds)) = UNITS.iter().find(|(unit, _)| *unit == c) else {
            return Err(format!(
                "{text:?} is not a duration: unknown unit {c:?} (use s, m, h, d or w, e.g. 90m, 24h, 7d)"
            ));
        };
        if digits.is_empty() {
            return Err(format!(
                "{text:?} is not a duration: {c:?} needs a number before it (e.g. 90m)"
            ));
        }
        let amount: u64 = digits
            .parse()
            .map_err(|_| format!("{text:?} is not a duration: {digits} is too large"))?;
        total = amount
            .checked_mul(*seconds)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(|| format!("{text:?} is too long"))?;
        digits.clear();
    }
    if !digits.is_empty() {
        return Err(format!(
            "{text:?} is not a duration: {digits} has no unit (use s, m, h, d or w, e.g. {digits}m)"
        ));
    }
    Ok(Duration::from_secs(total))
}

/// Formats a duration in the largest whole units: `10m`, `24h`, `1h30m`, `7d`, `0s`.
pub fn format(duration: Duration) -> String {
    let mut seconds = duration.as_secs();
    if seconds == 0 {
        return "0s".into();
    }
    let mut text = String::new();
    for (unit, size) in UNITS.iter().skip(1) {
        if seconds >= *size {
            text.push_str(&format!("{}{unit}", seconds / size));
            seconds %= size;
        }
    }
    text
}

/// An age as kubectl shows it: `45s`, `3m20s`, `45m`, `3h20m`, `36h`, `3d5h`, `400d`, `2y30d`, `10y`.
pub fn age(seconds: i64) -> String {
    let seconds = seconds.max(0);
    let minutes = seconds / 60;
    let hours = seconds / 3_600;
    let days = seconds / 86_400;
    let years = days / 365;
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        }
    } else if hours < 3 {
        format!("{minutes}m")
    } else if hours < 8 {
        match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if days < 8 {
        match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        }
    } else if years < 2 {
        format!("{days}d")
    } else if years < 8 {
        match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        }
    } else {
        format!("{years}y")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse("90m"), Ok(Duration::from_secs(90 * 60)));
        assert_eq!(parse("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse("2w"), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse("45s"), Ok(Duration::from_secs(45)));
        assert_eq!(parse(" 10m "), Ok(Duration::from_secs(600)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_say_why() {
        assert!(parse("").is_err());
        assert!(parse("90").expect_err("no unit").contains("has no unit"));
        assert!(parse("5y").expect_err("unit").contains("unknown unit 'y'"));
        assert!(parse("h").expect_err("number").contains("needs a number"));
        assert!(parse("1.5h").is_err());
        assert!(parse("-5m").is_err());
        assert!(parse("99999999999999999999w").is_err());
        assert!(
            parse("9999999999999999w")
                .expect_err("overflow")
                .contains("too long")
        );
    }

    #[test]
    fn durations_format_back() {
        for text in ["10m", "1d", "1h30m", "7d", "45s", "1d2h3m4s"] {
            assert_eq!(format(parse(text).expect("parses")), text);
        }
        assert_eq!(format(Duration::ZERO), "0s");
        assert_eq!(format(Duration::from_secs(14 * 86_400)), "14d");
        assert_eq!(format(parse("24h").expect("parses")), "1d");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(-3), "0s");
        assert_eq!(age(45), "45s");
        assert_eq!(age(119), "119s");
        assert_eq!(age(200), "3m20s");
        assert_eq!(age(240), "4m");
        assert_eq!(age(45 * 60), "45m");
        assert_eq!(age(3 * 3600 + 20 * 60), "3h20m");
        assert_eq!(age(36 * 3600), "36h");
        assert_eq!(age(3 * 86_400 + 5 * 3600), "3d5h");
        assert_eq!(age(400 * 86_400), "400d");
        assert_eq!(age((2 * 365 + 30) * 86_400), "2y30d");
        assert_eq!(age(10 * 365 * 86_400), "10y");
    }
}
