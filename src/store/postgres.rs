//! `PostgresStore` (feature `postgres`): to be written.

/// Placeholder until the PostgreSQL store lands.
#[derive(Debug)]
pub struct PostgresStore;
