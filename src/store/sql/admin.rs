//! The [`StoreAdmin`](crate::store::admin::StoreAdmin) plumbing the SQL stores share: each
//! backend's [`SqlAdmin`] operations, bounded by [`impl_store_admin!`].

use std::future::Future;

use super::SqlOperations;
use crate::store::StoreError;
use crate::store::admin::{AdminOutcome, Cursor, Force, Inspected, Page, Resolution};

/// One SQL backend's operator operations, each one attempt on the server, unbounded:
/// [`impl_store_admin!`] bounds each by the store's timeout.
pub(crate) trait SqlAdmin: SqlOperations {
    /// Reads the record that holds `key`.
    fn inspect_once(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Inspected>, StoreError>> + Send;

    /// Deletes the record of `key` unless a live send holds it (or `force`).
    fn forget_once(
        &self,
        key: &str,
        force: Force,
    ) -> impl Future<Output = Result<AdminOutcome, StoreError>> + Send;

    /// Settles `key` as `resolution` says unless a live send holds it (or `force`).
    fn resolve_once(
        &self,
        key: &str,
        resolution: &Resolution,
        force: Force,
    ) -> impl Future<Output = Result<AdminOutcome, StoreError>> + Send;

    /// Reads the page of records after `after`, at most `limit` of them.
    fn list_once(
        &self,
        after: Option<&Cursor>,
        limit: usize,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send;
}

/// Writes `impl StoreAdmin` for a [`SqlAdmin`] backend, each operation bounded by the store's
/// timeout; the attributes given (the impl's doc comment) go on the impl.
macro_rules! impl_store_admin {
    ($(#[$attr:meta])* $store:ty) => {
        const _: () = {
            use futures_util::future::BoxFuture;

            use $crate::store::StoreError;
            use $crate::store::admin::{
                AdminOutcome, Cursor, Force, Inspected, Page, Resolution, StoreAdmin,
            };
            use $crate::store::sql::{SqlAdmin, SqlOperations};

            $(#[$attr])*
            impl StoreAdmin for $store {
                fn inspect<'a>(
                    &'a self,
                    key: &'a str,
                ) -> BoxFuture<'a, Result<Option<Inspected>, StoreError>> {
                    Box::pin(self.bounded(move || self.inspect_once(key)))
                }

                fn forget<'a>(
                    &'a self,
                    key: &'a str,
                    force: Force,
                ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
                    Box::pin(self.bounded(move || self.forget_once(key, force)))
                }

                fn resolve<'a>(
                    &'a self,
                    key: &'a str,
                    resolution: &'a Resolution,
                    force: Force,
                ) -> BoxFuture<'a, Result<AdminOutcome, StoreError>> {
                    Box::pin(self.bounded(move || self.resolve_once(key, resolution, force)))
                }

                fn list<'a>(
                    &'a self,
                    after: Option<&'a Cursor>,
                    limit: usize,
                ) -> BoxFuture<'a, Result<Page, StoreError>> {
                    Box::pin(self.bounded(move || self.list_once(after, limit)))
                }
            }
        };
    };
}

pub(crate) use impl_store_admin;
