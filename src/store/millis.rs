//! Durations as the SQL stores write them: whole milliseconds.

use std::time::Duration;

/// The longest lease or ttl written: a century, far enough to mean "never" while staying
/// within PostgreSQL's interval range and far from overflowing SQLite's integers.
pub(crate) const FOREVER_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// A duration as whole milliseconds, rounded up so a short lease never becomes none, and
/// capped at [`FOREVER_MS`] so no duration overflows the database's arithmetic.
pub(crate) fn millis(duration: Duration) -> i64 {
    let ms = duration.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX).min(FOREVER_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_become_bounded_milliseconds() {
        assert_eq!(millis(Duration::ZERO), 0);
        assert_eq!(millis(Duration::from_nanos(1)), 1);
        assert_eq!(millis(Duration::from_millis(300)), 300);
        assert_eq!(millis(Duration::MAX), FOREVER_MS);
        assert_eq!(millis(Duration::from_secs(u64::MAX / 2)), FOREVER_MS);
    }
}
