//! `RedisStore` (feature `redis`): to be written.

/// Placeholder until the Redis store lands.
#[derive(Debug)]
pub struct RedisStore;
