//! [`KeptOutcome`]: an outcome as [`MemoryStore`](super::MemoryStore) keeps it, in
//! about half the room of an [`Outcome`].

use crate::outcome::{Kept, Outcome, Receipt};

/// An outcome in the memory store: a record holds one for as long as its ttl, so the common
/// case (a receipt as the layer keeps it: an id, a transport, accepted recipients by
/// position) is kept in boxed slices without spare capacity, and anything else as given.
pub(super) enum KeptOutcome {
    /// A receipt that names no accepted address and is not marked replayed.
    Receipt {
        id: Box<str>,
        transport: Box<str>,
        accepted_at: Box<[u32]>,
    },
    /// Any other outcome (a failure of unknown delivery, a receipt given by hand that names
    /// its accepted addresses), exactly as given.
    Other(Box<Outcome>),
}

impl KeptOutcome {
    pub(super) fn of(outcome: &Outcome) -> Self {
        match &outcome.0 {
            Kept::Sent {
                receipt,
                accepted_at,
            } if receipt.accepted.is_empty() && !receipt.replayed => Self::Receipt {
                id: receipt.id.as_str().into(),
                transport: receipt.transport.as_str().into(),
                accepted_at: accepted_at.as_slice().into(),
            },
            _ => Self::Other(Box::new(outcome.clone())),
        }
    }

    /// The outcome as it was given.
    pub(super) fn outcome(&self) -> Outcome {
        match self {
            Self::Receipt {
                id,
                transport,
                accepted_at,
            } => Outcome(Kept::Sent {
                receipt: Receipt {
                    id: id.as_ref().into(),
                    transport: transport.as_ref().into(),
                    accepted: Vec::new(),
                    replayed: false,
                },
                accepted_at: accepted_at.to_vec(),
            }),
            Self::Other(outcome) => Outcome::clone(outcome),
        }
    }
}
