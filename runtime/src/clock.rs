//! The time, as the certificates, tokens and snapshots of every component count it.

/// Now, in whole seconds since the Unix epoch (0 for a clock set before it).
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| i64::try_from(since.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_after_this_code_was_written() {
        // 2026-01-01T00:00:00Z.
        assert!(super::now() > 1_767_225_600);
    }
}
