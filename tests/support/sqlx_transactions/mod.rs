//! Claims and outbox messages written inside the caller's own sqlx transaction, one suite
//! every database runs (the [`cases`], through [`sqlx_transactions_suite!`] and a
//! [`Database`] of the test file's), and the [`Shop`] each case gets: an application with an
//! orders table and its sqlx pool, and a claim store and an outbox on tables of its own.

use std::future::Future;

use sqlx::pool::PoolOptions;
use sqlx::{Pool, Transaction};

use super::stores::{backend_url, unique};
use tower_idempotency::Message;
use tower_idempotency::outbox::{Enqueued, Outbox};
use tower_idempotency::store::{Claim, Store, StoreError, WaitingClaim};

pub mod cases;

/// A connection of database `D`'s sqlx driver, or the one a sqlx transaction holds.
pub type Connection<D> = <<D as Database>::Sqlx as sqlx::Database>::Connection;

/// One database's side of the [`cases`]: its sqlx driver, its claim store, the two sqlx
/// entry points of the crate, and the few statements of the application that its dialect
/// writes. Each test file implements it for its database and runs the suite with
/// [`sqlx_transactions_suite!`].
pub trait Database: 'static {
    /// The variable that names the server's URL (see [`backend_url`]).
    const URL_VAR: &'static str;

    /// The sqlx driver of the application.
    type Sqlx: sqlx::Database;

    /// The claim store on this database.
    type Store: Store + Clone + 'static;

    /// A store on `table` at `url`, not migrated.
    async fn store(url: &str, table: &str) -> Self::Store;

    /// Creates the store's table.
    async fn migrate(store: &Self::Store);

    /// The claims that wait for their send.
    async fn claims(store: &Self::Store) -> Vec<WaitingClaim>;

    /// The store's table.
    fn table_name(store: &Self::Store) -> &str;

    /// Writes `claim` in the transaction `conn` holds (`claim_in_sqlx`). Its future is `Send`:
    /// a user's handler that claims is spawned.
    fn claim_in_sqlx<'a>(
        store: &'a Self::Store,
        conn: &'a mut Connection<Self>,
        claim: &'a Claim,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// Enqueues `message` in the transaction `conn` holds (`enqueue_sqlx` and its kin).
    async fn enqueue_sqlx(
        outbox: &Outbox,
        conn: &mut Connection<Self>,
        message: &Message,
    ) -> Result<Enqueued, StoreError>;

    /// Enqueues `message` in a committed transaction of the outbox's own driver, the route
    /// of a caller without sqlx.
    async fn enqueue_natively(
        url: &str,
        outbox: &Outbox,
        message: &Message,
    ) -> Result<Enqueued, StoreError>;

    /// The statement that creates the application's `orders` table (`id`, `state`), which
    /// rolls back with the rest of a transaction.
    fn create_orders(orders: &str) -> String;

    /// Runs the application's `sql` on `conn`.
    fn execute<'a>(
        conn: &'a mut Connection<Self>,
        sql: &'a str,
    ) -> impl Future<Output = ()> + Send + 'a;

    /// The one count `sql` selects.
    async fn count(conn: &mut Connection<Self>, sql: &str) -> i64;

    /// Drops the test's own `table`, as its last step.
    async fn drop_table(url: &str, table: &str);
}

/// The methods of a [`Database`] that read the same on every database, written once: inside
/// `impl Database for ..`, for the claim store `$store` (whose inherent API every SQL store
/// shares) and the sqlx connection `$conn`.
// Only the sqlx transactions' test binary implements a database; the rest compile this too.
#[allow(unused_macros)]
macro_rules! same_on_every_database {
    ($store:ty, $conn:ty) => {
        type Store = $store;

        async fn store(url: &str, table: &str) -> $store {
            <$store>::connect(url)
                .await
                .expect("connect")
                .table(table)
                .expect("valid table name")
        }

        async fn migrate(store: &$store) {
            store.migrate().await.expect("migrate");
        }

        async fn claims(store: &$store) -> Vec<::tower_idempotency::store::WaitingClaim> {
            store.claims(10).await.expect("claims")
        }

        fn table_name(store: &$store) -> &str {
            store.table_name()
        }

        fn claim_in_sqlx<'a>(
            store: &'a $store,
            conn: &'a mut $conn,
            claim: &'a ::tower_idempotency::store::Claim,
        ) -> impl ::std::future::Future<
            Output = Result<bool, ::tower_idempotency::store::StoreError>,
        > + Send
        + 'a {
            store.claim_in_sqlx(conn, claim)
        }

        fn execute<'a>(
            conn: &'a mut $conn,
            sql: &'a str,
        ) -> impl ::std::future::Future<Output = ()> + Send + 'a {
            async move {
                ::sqlx::query(sql)
                    .execute(conn)
                    .await
                    .expect("the application's statement runs");
            }
        }

        async fn count(conn: &mut $conn, sql: &str) -> i64 {
            ::sqlx::query_scalar(sql)
                .fetch_one(conn)
                .await
                .expect("count")
        }
    };
}
#[allow(unused_imports)]
pub(crate) use same_on_every_database;

/// The application a case runs on database `D`: its orders table and the sqlx pool it writes
/// with, and a claim store and an outbox on fresh tables, migrated.
pub struct Shop<D: Database> {
    pub url: String,
    pub store: D::Store,
    pub outbox: Outbox,
    /// The orders table's name.
    pub orders: String,
    pub pool: Pool<D::Sqlx>,
}

impl<D: Database> Shop<D> {
    /// See [`backend_url`] for the `Option`.
    pub async fn open() -> Option<Self> {
        let url = backend_url(D::URL_VAR)?;
        let store = D::store(&url, &unique("sqlx_claims")).await;
        D::migrate(&store).await;
        let outbox = Outbox::connect(&url)
            .await
            .expect("connect")
            .table(&unique("sqlx_outbox"))
            .expect("valid table name");
        outbox.migrate().await.expect("migrate");
        let orders = unique("sqlx_orders");
        let pool = PoolOptions::<D::Sqlx>::new()
            .max_connections(2)
            .connect(&url)
            .await
            .expect("sqlx connects");
        let mut conn = pool.acquire().await.expect("a connection");
        D::execute(&mut conn, &D::create_orders(&orders)).await;
        drop(conn);
        Some(Self {
            url,
            store,
            outbox,
            orders,
            pool,
        })
    }

    /// A transaction of the application's pool.
    pub async fn begin(&self) -> Transaction<'static, D::Sqlx> {
        self.pool.begin().await.expect("begin")
    }

    /// The statement that writes the order `ord_1`.
    pub fn order_sql(&self) -> String {
        format!("INSERT INTO {} VALUES ('ord_1', 'paid')", self.orders)
    }

    /// Writes the order `ord_1` in the transaction `conn` holds.
    pub async fn order(&self, conn: &mut Connection<D>) {
        D::execute(conn, &self.order_sql()).await;
    }

    /// How many orders are committed.
    pub async fn orders_in(&self) -> i64 {
        let mut conn = self.pool.acquire().await.expect("a connection");
        D::count(&mut conn, &format!("SELECT count(*) FROM {}", self.orders)).await
    }

    /// The claims of the shop's store that wait for their send.
    pub async fn claims(&self) -> Vec<WaitingClaim> {
        D::claims(&self.store).await
    }

    /// Closes the pool and drops the shop's tables, as the case's last step.
    pub async fn close(self) {
        self.pool.close().await;
        D::drop_table(&self.url, &self.orders).await;
        D::drop_table(&self.url, self.outbox.table_name()).await;
        D::drop_table(&self.url, D::table_name(&self.store)).await;
    }
}

/// Runs every case of [`cases`] as a test of its own in a fresh [`Shop`] on the database
/// `$db` (a [`Database`]); `#[$ignore]` marks them ignored where its server is missing.
// Only the sqlx transactions' test binary runs the suite; the rest compile this module too.
#[allow(unused_macros)]
macro_rules! sqlx_transactions_suite {
    (#[$ignore:meta] $db:ty) => {
        $crate::support::sqlx_transactions::sqlx_transactions_suite!(@cases #[$ignore] $db;
            a_sqlx_rollback_leaves_no_claim_no_outbox_row_and_no_order_and_frees_the_key,
            a_sqlx_commit_then_a_crash_before_the_send_is_sent_once_by_the_next_run,
            another_message_under_a_key_claimed_through_sqlx_is_key_reused_and_not_sent,
            a_sqlx_claim_on_a_table_never_migrated_fails_and_says_to_migrate,
            an_outbox_message_enqueued_through_sqlx_is_sent_once_by_the_worker,
        );
    };
    (@cases #[$ignore:meta] $db:ty; $($case:ident),* $(,)?) => {$(
        #[tokio::test]
        #[$ignore]
        async fn $case() {
            let Some(shop) = $crate::support::sqlx_transactions::Shop::<$db>::open().await else {
                return;
            };
            $crate::support::sqlx_transactions::cases::$case(&shop).await;
            shop.close().await;
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use sqlx_transactions_suite;
