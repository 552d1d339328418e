//! A claim as one SQL statement and its parameters: claim-then-send through any driver.

/// A claim as one SQL statement and its parameters, for a transaction held by a driver the
/// store does not take (diesel, or any other): run it with your business rows, and after the
/// commit the layer's send takes the claim, exactly as with the store's own `claim_in`.
///
/// From `PostgresStore::claim_statement` (feature `postgres`), `SqliteStore::claim_statement`
/// (feature `sqlite`) or `MySqlStore::claim_statement` (feature `mysql`). The statement writes
/// the row the store's `claim_in` writes, under a token drawn when it was made: run each
/// statement once (make another for another claim).
///
/// Bind [`params`](Self::params) in order (`$1`…`$4` on PostgreSQL, `?1`…`?4` on SQLite,
/// the seven `?` on MySQL), each with the type its [`ClaimParam`] names, and execute it: it
/// writes one row when it claims the key, and none when a live record already holds it (a
/// send under way or done, or another claim). On PostgreSQL and SQLite the count of rows
/// written (diesel's `execute`, sqlx's `rows_affected`) is 1 when it claimed the key, 0 when
/// not; MySQL counts its statement differently (its `claim_statement` says how). The
/// statement returns no rows.
///
/// With diesel (2.4 here, on SQLite; `PgConnection` and `MysqlConnection` alike), `sql_query`
/// binds them:
///
/// ```no_run
/// use diesel::prelude::*;
/// use diesel::sql_types::{BigInt, Binary, Text};
/// use tower_idempotency::store::{Claim, ClaimParam};
/// use tower_idempotency::SqliteStore;
///
/// # fn run(store: SqliteStore, claim: Claim, conn: &mut SqliteConnection) -> QueryResult<()> {
/// let statement = store.claim_statement(&claim);
/// // In the transaction that writes your business rows:
/// let claimed = conn.immediate_transaction(|conn| {
///     let mut query = diesel::sql_query(statement.sql()).into_boxed();
///     for param in statement.params() {
///         query = match param {
///             ClaimParam::Text(text) => query.bind::<Text, _>(text),
///             ClaimParam::Bytes(bytes) => query.bind::<Binary, _>(bytes),
///             ClaimParam::BigInt(n) => query.bind::<BigInt, _>(*n),
///             _ => unreachable!("a claim binds text, bytes and integers"),
///         };
///     }
///     QueryResult::Ok(query.execute(conn)? == 1)
/// })?;
/// # let _ = claimed; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ClaimStatement {
    sql: String,
    params: Vec<ClaimParam>,
}

/// One parameter of a [`ClaimStatement`], and the SQL type to bind it as.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimParam {
    /// Bind as text (diesel's `sql_types::Text`, a `&str` or `String` elsewhere).
    Text(String),
    /// Bind as bytes (diesel's `sql_types::Binary`: `bytea` on PostgreSQL, a BLOB on SQLite,
    /// a binary string on MySQL).
    Bytes(Vec<u8>),
    /// Bind as a 64-bit integer (diesel's `sql_types::BigInt`, an `i64` elsewhere).
    BigInt(i64),
}

impl ClaimStatement {
    /// A statement and its parameters, in order.
    pub(crate) fn new(sql: String, params: impl Into<Vec<ClaimParam>>) -> Self {
        Self {
            sql,
            params: params.into(),
        }
    }

    /// The SQL text.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// The parameters, in order: the key (text), the claim's token, the message's
    /// fingerprint (32 bytes) and the claim's ttl in milliseconds (integer). The token is
    /// text (a UUID the statement casts) on PostgreSQL, 16 bytes on SQLite and MySQL. On
    /// MySQL the token, fingerprint and ttl follow a second time, as its `?` placeholders
    /// name them twice.
    pub fn params(&self) -> &[ClaimParam] {
        &self.params
    }
}
