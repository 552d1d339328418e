//! placeholder
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod fingerprint;
pub mod layer;
pub mod message;
pub mod outcome;
pub mod store;

pub use fingerprint::{Fingerprint, Fingerprinted};
pub use layer::{Idempotency, IdempotencyLayer, IdempotencyLayerBuilder};
pub use message::{Attachment, Envelope, IdempotencyKey, Message, MessageBuilder, RawMessage};
pub use outcome::{BoxError, Category, Outcome, Receipt, SendError, counts_against_provider};
pub use store::{MemoryStore, Store, StoreError};
