//! Takeovers that check first: a send whose reserve took its key over from a holder that
//! never settled it ([`Reservation::TakenOver`](crate::store::Reservation::TakenOver): its
//! lease passed, a crashed process) of the same message decides before it sends.
//!
//! | configured | first attempt | the send |
//! |---|---|---|
//! | [`provider_window`](super::IdempotencyLayerBuilder::provider_window) | inside the window | goes, under the same key: the provider deduplicates |
//! | [`verify_takeovers`](super::IdempotencyLayerBuilder::verify_takeovers) | otherwise | asks first: delivered keeps the receipt, no send; not sent goes; unknown keeps the key, no send |
//! | neither | | goes (the one duplicate the guarantee allows) |

use std::sync::Arc;

use tokio::time::Instant;

use super::config::Config;
use super::key::key_hash;
use super::renew::{Held, Lease};
use super::resend::inside_window;
use super::settle::{Finish, Settle};
use super::stats::bump;
use crate::outcome::{Outcome, Receipt, SendError, codes};
use crate::store::Record;
use crate::verify::{Verified, Verify};

/// What a send does after taking its key over.
pub(crate) enum Takeover {
    /// Send under the token.
    Send,
    /// Answer this, unsent; the key was settled by it.
    Answered(Result<Receipt, SendError>),
}

/// Decides a takeover of the `held` key (held since `asked_at`) from the stale `previous`
/// record. `raw_key` and `recipients` are the request's.
pub(crate) async fn after_takeover(
    config: &Arc<Config>,
    held: Held,
    previous: Record,
    raw_key: Option<String>,
    recipients: &[&str],
    asked_at: Instant,
) -> Takeover {
    let key = &held.key;
    let fingerprint = held.fingerprint;
    if previous.fingerprint != fingerprint {
        // Another message's holder crashed: this one was never sent under the key.
        return Takeover::Send;
    }
    let counters = &config.counters;
    bump(&counters.taken_over);
    if config
        .provider_window
        .is_some_and(|window| inside_window(&previous, fingerprint, window))
    {
        bump(&counters.resent);
        tracing::info!(
            namespace = %config.namespace,
            key_hash = %key_hash(key),
            "took over a send that was never settled, inside the provider's window: \
             sending again under the same key"
        );
        return Takeover::Send;
    }
    let Some(verifier) = &config.verifier else {
        tracing::info!(
            namespace = %config.namespace,
            key_hash = %key_hash(key),
            "took over a send that was never settled; no verification service: sending"
        );
        return Takeover::Send;
    };
    let question = Verify::for_key(key.as_ref(), raw_key, fingerprint);
    let answer = tokio::time::timeout(config.verify_timeout, verifier.ask(question)).await;
    let finish = match answer {
        Ok(Ok(Verified::NotSent)) => {
            bump(&counters.verified_not_sent);
            tracing::info!(
                namespace = %config.namespace,
                key_hash = %key_hash(key),
                "took over a send that was never settled; the provider never took it: sending"
            );
            return Takeover::Send;
        }
        Ok(Ok(Verified::Delivered(receipt))) => {
            bump(&counters.verified_delivered);
            tracing::info!(
                namespace = %config.namespace,
                key_hash = %key_hash(key),
                "took over a send that was never settled; the provider took it: keeping its \
                 receipt, not sending"
            );
            Ok(receipt)
        }
        other => {
            bump(&counters.verify_inconclusive);
            let why = match other {
                Ok(Ok(_)) => "the provider cannot tell".to_owned(),
                Ok(Err(error)) => format!("the verification service failed: {error}"),
                Err(_) => "the verification service did not answer in time".to_owned(),
            };
            tracing::warn!(
                namespace = %config.namespace,
                key_hash = %key_hash(key),
                code = codes::UNVERIFIED,
                why = %why,
                "took over a send that was never settled and could not verify it: the key is \
                 kept as of unknown delivery, not sent"
            );
            Err(SendError::unverified())
        }
    };
    let mut settle = Settle::new(Arc::clone(config), vec![held], Lease::new(config, asked_at));
    settle
        .run(vec![Finish::Complete(Outcome::kept(&finish, recipients))])
        .await;
    // The provider's receipt answers the caller as a replay: this call sent nothing.
    Takeover::Answered(match finish {
        Ok(receipt) => Outcome::kept(&Ok(receipt), recipients).into_replay_for(recipients),
        Err(error) => Err(error),
    })
}
