//! [`ExpiryIndex`]: a shard's records by their place in time, to drop expired ones first.
//! Each place holds what finds its record (the store keeps its key's hash there).
//!
//! Places mostly come in order: a pending place is its reserve's time plus the lease, a done
//! place its completion's time plus the ttl, and each of the two grows with the clock. So
//! the index keeps a sorted run for each [`Lane`], which takes a place of its lane at its
//! end when the place comes after the run's last one, and a `BTreeMap` for the places that
//! come earlier (a shorter lease or ttl than the one before, or a clock that stepped back). A place put in a run costs a push onto a
//! queue instead of a tree's insert, and so does the common way out: the
//! oldest done record dropped from a run's front, a pending place taken out by the complete
//! that follows its reserve at a run's back. A place taken out of a run's middle leaves a
//! hole, dropped when it reaches an end and swept out when holes outnumber places. Every
//! place is in exactly one run or the tree, so what the index answers is what a tree alone
//! would answer (a model test holds the two together).

use std::collections::{BTreeMap, VecDeque};

/// Which run a place tries first: a record's places come in order within each lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lane {
    /// A pending record's place: its reserve's (or renewal's) time plus the lease.
    Pending,
    /// A done record's place: its completion's time plus the ttl.
    Done,
}

const RUNS: usize = 2;

/// Values `V` by a unique, ordered place `O` (a time, then a version to break ties).
pub(super) struct ExpiryIndex<O, V> {
    runs: [Run<O, V>; RUNS],
    /// The places that fit no run.
    tree: BTreeMap<O, V>,
}

/// Places in increasing order, each with its value, or a hole where one was taken out. Its
/// first and last elements are never holes.
struct Run<O, V> {
    places: VecDeque<(O, Option<V>)>,
    holes: usize,
}

impl<O: Ord, V> Run<O, V> {
    fn new() -> Self {
        Self {
            places: VecDeque::new(),
            holes: 0,
        }
    }

    fn last(&self) -> Option<&O> {
        self.places.back().map(|(place, _)| place)
    }

    fn first(&self) -> Option<&O> {
        self.places.front().map(|(place, _)| place)
    }

    /// Takes out the value at `place`, if the run holds it.
    fn remove(&mut self, place: &O) -> Option<V> {
        // A complete takes out the place its reserve put last, and making room the first.
        let at = match (self.places.back(), self.places.front()) {
            (Some((last, _)), _) if last == place => self.places.len() - 1,
            (_, Some((first, _))) if first == place => 0,
            _ => self.places.binary_search_by(|(p, _)| p.cmp(place)).ok()?,
        };
        let value = self.places.get_mut(at)?.1.take()?;
        self.holes += 1;
        self.trim();
        if self.holes > 64 && self.holes > self.places.len() / 2 {
            self.places.retain(|(_, value)| value.is_some());
            self.holes = 0;
        }
        Some(value)
    }

    /// Drops the holes at either end.
    fn trim(&mut self) {
        while self.places.back().is_some_and(|(_, value)| value.is_none()) {
            self.places.pop_back();
            self.holes -= 1;
        }
        while self
            .places
            .front()
            .is_some_and(|(_, value)| value.is_none())
        {
            self.places.pop_front();
            self.holes -= 1;
        }
    }

    fn pop_first(&mut self) -> Option<(O, V)> {
        let (place, value) = self.places.pop_front()?;
        self.trim();
        Some((place, value?))
    }
}

impl<O: Ord, V> ExpiryIndex<O, V> {
    pub(super) fn new() -> Self {
        Self {
            runs: std::array::from_fn(|_| Run::new()),
            tree: BTreeMap::new(),
        }
    }

    /// Puts `value` at `place`, which no other value holds: at the end of `lane`'s run when
    /// it comes after the run's last place, else in the tree.
    pub(super) fn insert(&mut self, place: O, value: V, lane: Lane) {
        let run = &mut self.runs[lane as usize];
        if run.last().is_none_or(|last| *last < place) {
            run.places.push_back((place, Some(value)));
        } else {
            self.tree.insert(place, value);
        }
    }

    /// Takes out the value at `place`, if one is there.
    pub(super) fn remove(&mut self, place: &O) -> Option<V> {
        for run in &mut self.runs {
            let holds = run
                .first()
                .zip(run.last())
                .is_some_and(|(first, last)| first <= place && place <= last);
            if holds && let Some(value) = run.remove(place) {
                return Some(value);
            }
        }
        self.tree.remove(place)
    }

    /// Takes out the earliest place and its value, when `due` says that place is due.
    pub(super) fn pop_first_if(&mut self, due: impl Fn(&O) -> bool) -> Option<(O, V)> {
        // The earliest place is the first of a run or of the tree.
        let mut earliest: Option<(&O, Option<usize>)> =
            self.tree.first_key_value().map(|(place, _)| (place, None));
        for (i, run) in self.runs.iter().enumerate() {
            if let Some(first) = run.first()
                && earliest.is_none_or(|(e, _)| first < e)
            {
                earliest = Some((first, Some(i)));
            }
        }
        let (place, from) = earliest?;
        if !due(place) {
            return None;
        }
        match from {
            Some(i) => self.runs[i].pop_first(),
            None => self.tree.pop_first(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::{ExpiryIndex, Lane};

    type Place = (u64, u64);
    type Model = BTreeMap<Place, Arc<str>>;

    /// A xorshift generator: the same operations on every run.
    fn generator(mut state: u64) -> impl FnMut(u64) -> u64 {
        move |bound| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        }
    }

    /// What must hold after every operation: each run in increasing order with no hole at
    /// either end and its holes counted (looked at in full every 64th call, being slow).
    fn check(index: &ExpiryIndex<Place, Arc<str>>, full: bool) {
        for run in &index.runs {
            let places = &run.places;
            assert!(places.front().is_none_or(|(_, key)| key.is_some()));
            assert!(places.back().is_none_or(|(_, key)| key.is_some()));
            if full {
                assert!(
                    places
                        .iter()
                        .zip(places.iter().skip(1))
                        .all(|(a, b)| a.0 < b.0)
                );
                let holes = places.iter().filter(|(_, key)| key.is_none()).count();
                assert_eq!(run.holes, holes);
            }
        }
    }

    /// The places the runs hold, and their holes.
    fn counts(index: &ExpiryIndex<Place, Arc<str>>) -> (usize, usize) {
        let holes: usize = index.runs.iter().map(|run| run.holes).sum();
        let len: usize = index.runs.iter().map(|run| run.places.len()).sum();
        (len - holes, holes)
    }

    /// The paths the operations took, so a test can say each was taken.
    #[derive(Default, Debug)]
    struct Paths {
        put_in_runs: usize,
        removed_from_runs: usize,
        holes_left: usize,
        many_holes: usize,
        popped: usize,
    }

    /// Both hold the index and its model, and count the paths taken.
    struct Pair {
        index: ExpiryIndex<Place, Arc<str>>,
        model: Model,
        paths: Paths,
        operations: usize,
    }

    impl Pair {
        fn new() -> Self {
            Self {
                index: ExpiryIndex::new(),
                model: Model::new(),
                paths: Paths::default(),
                operations: 0,
            }
        }

        /// Checks the index after an operation (in full every 64th).
        fn verify(&mut self) {
            self.operations += 1;
            check(&self.index, self.operations.is_multiple_of(64));
        }

        fn insert(&mut self, place: Place, lane: Lane) {
            let before = counts(&self.index).0;
            let key: Arc<str> = Arc::from(format!("k{}", place.1));
            self.index.insert(place, Arc::clone(&key), lane);
            assert!(self.model.insert(place, key).is_none());
            self.paths.put_in_runs += usize::from(counts(&self.index).0 > before);
            self.verify();
        }

        fn remove(&mut self, place: Place) {
            let (in_runs, holes) = counts(&self.index);
            let holes_by_run = self.index.runs.each_ref().map(|run| run.holes);
            assert_eq!(self.index.remove(&place), self.model.remove(&place));
            self.verify();
            let (in_runs_after, holes_after) = counts(&self.index);
            if in_runs_after < in_runs {
                self.paths.removed_from_runs += 1;
                self.paths.holes_left += usize::from(holes_after > holes);
            }
            // Holes never outnumber a run's places for long: more than 64 of them, and more
            // than half the run, are swept out by the removal that makes them so.
            for (run, before) in self.index.runs.iter().zip(holes_by_run) {
                assert!(run.holes <= 64 || 2 * run.holes <= run.places.len());
                self.paths.many_holes += usize::from(before > 64 && run.holes < before);
            }
        }

        /// Pops a place due by `now` from both; answers the place popped.
        fn pop(&mut self, now: u64) -> Option<Place> {
            let due = |p: &Place| p.0 <= now;
            let place = self.model.keys().next().copied().filter(due);
            let expected = place.and_then(|p| self.model.remove_entry(&p));
            assert_eq!(self.index.pop_first_if(due), expected);
            self.paths.popped += usize::from(place.is_some());
            self.verify();
            place
        }
    }

    /// The index against a plain `BTreeMap` under random operations: inserts of places near
    /// the newest and far from it in either lane (most fit no run), removals of the newest,
    /// of random and of absent places, and pops of due places. Each answer must be the map's.
    #[test]
    fn answers_as_an_ordered_map_would() {
        let mut next = generator(0x2545_f491_4f6c_dd1d);
        let mut pair = Pair::new();
        let mut placed: Vec<Place> = Vec::new();
        for version in 0..20_000 {
            match next(50) {
                0..=21 => {
                    let time = if next(4) == 0 {
                        next(1_000)
                    } else {
                        900 + next(100)
                    };
                    let lane = if next(2) == 0 {
                        Lane::Pending
                    } else {
                        Lane::Done
                    };
                    pair.insert((time, version), lane);
                    placed.push((time, version));
                }
                22..=45 if !placed.is_empty() => {
                    let newest = placed.len().saturating_sub(32);
                    let i = if next(3) > 0 {
                        newest + next((placed.len() - newest) as u64) as usize
                    } else {
                        next(placed.len() as u64) as usize
                    };
                    pair.remove(placed.swap_remove(i));
                }
                46 | 47 => pair.remove((next(1_000), u64::MAX)),
                _ => {
                    if let Some(popped) = pair.pop(next(1_000)) {
                        placed.retain(|p| *p != popped);
                    }
                }
            }
        }
        let paths = &pair.paths;
        assert!(
            paths.removed_from_runs > 100 && paths.popped > 100,
            "{paths:?}"
        );
    }

    /// The same against a store's pattern: a clock that moves on, pending places at the
    /// clock plus a lease, done places (completing a pending one, mostly the newest) at the
    /// clock plus a ttl, now and then a shorter lease or ttl (into the tree), random
    /// removals (records dropped or rewritten) and pops of what the clock has passed. Most
    /// places go into runs, holes are left and swept, and every answer is the map's.
    #[test]
    fn answers_as_an_ordered_map_would_for_reserves_and_completes() {
        const LEASE: u64 = 300;
        const TTL: u64 = 5_000;
        let mut next = generator(0x9e37_79b9_7f4a_7c15);
        let mut pair = Pair::new();
        let (mut pending, mut done): (Vec<Place>, Vec<Place>) = (Vec::new(), Vec::new());
        let mut now = 0;
        for version in 0..40_000 {
            now += next(2);
            // The last quarter drops records at random (an admin forgetting them), so holes
            // outnumber a run's places and are swept.
            if version == 30_000 {
                check(&pair.index, true);
                let (in_runs, held) = (counts(&pair.index).0, pair.model.len());
                assert!(in_runs > held / 2, "{in_runs} of {held} in runs");
            }
            let op = if version < 30_000 { next(40) } else { 32 };
            match op {
                0..=15 => {
                    let lease = if next(50) == 0 { next(LEASE) } else { LEASE };
                    pair.insert((now + lease, version), Lane::Pending);
                    pending.push((now + lease, version));
                }
                16..=31 if !pending.is_empty() => {
                    // A complete: mostly of the newest reserve, as one send at a time makes.
                    let i = if next(4) > 0 {
                        pending.len() - 1
                    } else {
                        next(pending.len() as u64) as usize
                    };
                    pair.remove(pending.swap_remove(i));
                    let ttl = if next(50) == 0 { next(TTL) } else { TTL };
                    pair.insert((now + ttl, version), Lane::Done);
                    done.push((now + ttl, version));
                }
                32..=34 if !done.is_empty() => {
                    pair.remove(done.swap_remove(next(done.len() as u64) as usize));
                }
                35 => pair.remove((now, u64::MAX)),
                _ => {
                    while let Some(popped) = pair.pop(now) {
                        pending.retain(|p| *p != popped);
                        done.retain(|p| *p != popped);
                    }
                }
            }
        }
        check(&pair.index, true);
        let paths = &pair.paths;
        assert!(paths.put_in_runs > 20_000, "{paths:?}");
        assert!(paths.removed_from_runs > 10_000, "{paths:?}");
        assert!(paths.holes_left > 500 && paths.many_holes > 0, "{paths:?}");
        assert!(paths.popped > 1_000, "{paths:?}");
    }
}
