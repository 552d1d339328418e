//! What the benches' interleaved modes share (`PEERS_INTERLEAVED`, `STORES_INTERLEAVED`,
//! `MEMORY_INTERLEAVED`): both sides of a ratio timed in alternating slices, a moment apart,
//! where criterion runs them seconds or minutes apart, through whatever the host does
//! between them; and the median and range of what the rounds measured.

/// The rounds the environment variable `var` asks for, when it is set to a number: the bench
/// then runs its interleaved mode instead of criterion's benchmarks.
pub(crate) fn rounds(var: &str) -> Option<usize> {
    std::env::var(var).ok()?.parse().ok()
}

/// Runs `a` and `b` once each a round, `rounds` times, `a` first in even rounds and `b`
/// first in odd ones (so neither side always follows the other), and answers each round's
/// `(a's, b's)`.
pub(crate) fn alternate<T>(
    rounds: usize,
    mut a: impl FnMut() -> T,
    mut b: impl FnMut() -> T,
) -> Vec<(T, T)> {
    (0..rounds)
        .map(|round| {
            if round % 2 == 0 {
                let x = a();
                (x, b())
            } else {
                let y = b();
                (a(), y)
            }
        })
        .collect()
}

/// Two sides timed by [`alternate`]: the spread of each side's `value` (its time per unit of
/// work, say), and the spread of `b`'s ÷ `a`'s, round by round (above 1: `a` is faster).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Compared {
    pub(crate) a: Spread,
    pub(crate) b: Spread,
    pub(crate) b_over_a: Spread,
}

impl Compared {
    pub(crate) fn of<T: Copy>(pairs: &[(T, T)], value: impl Fn(T) -> f64) -> Self {
        Self {
            a: Spread::of(pairs.iter().map(|&(a, _)| value(a))),
            b: Spread::of(pairs.iter().map(|&(_, b)| value(b))),
            b_over_a: Spread::of(pairs.iter().map(|&(a, b)| value(b) / value(a))),
        }
    }
}

/// The median of a sample and its range.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
}

impl Spread {
    /// The spread of `values`, which must not be empty.
    pub(crate) fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut values: Vec<f64> = values.into_iter().collect();
        values.sort_by(f64::total_cmp);
        Self {
            median: values[values.len() / 2],
            low: values[0],
            high: values[values.len() - 1],
        }
    }
}
