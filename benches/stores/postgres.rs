//! PostgreSQL store benchmark: to be written.

pub fn bench(_c: &mut criterion::Criterion) {}
