//! [`KeptOutcome`]: an outcome as [`MemoryStore`](super::MemoryStore) keeps it, in
//! about half the room of an [`Outcome`].

use crate::outcome::{Kept, Outcome, Receipt};

/// An outcome in the memory store: a record holds one for as long as its ttl, so the common
/// case (a receipt as the layer keeps it: an id, a transport, accepted recipients by
/// position) is kept in boxed slices without spare capacity, and anything else as given.
pub(super) enum KeptOutcome {
    /// A receipt that names no accepted address and is not marked replayed. Its id and
    /// transport are one allocation, the id first (`id_len` bytes), then the transport: one
    /// allocation less per record to make, free and keep a header for.
    Receipt {
        text: Box<str>,
        id_len: u32,
        accepted_at: Box<[u32]>,
    },
    /// Any other outcome (a failure of unknown delivery, a receipt given by hand that names
    /// its accepted addresses, an id longer than `u32::MAX` bytes), exactly as given.
    Other(Box<Outcome>),
}

impl KeptOutcome {
    pub(super) fn of(outcome: &Outcome) -> Self {
        match &outcome.0 {
            Kept::Sent {
                receipt,
                accepted_at,
            } if receipt.accepted.is_empty() && !receipt.replayed => {
                match u32::try_from(receipt.id.len()) {
                    Ok(id_len) => Self::Receipt {
                        text: [receipt.id.as_str(), receipt.transport.as_str()]
                            .concat()
                            .into_boxed_str(),
                        id_len,
                        accepted_at: accepted_at.as_slice().into(),
                    },
                    Err(_) => Self::Other(Box::new(outcome.clone())),
                }
            }
            _ => Self::Other(Box::new(outcome.clone())),
        }
    }

    /// The outcome as it was given.
    pub(super) fn outcome(&self) -> Outcome {
        match self {
            Self::Receipt {
                text,
                id_len,
                accepted_at,
            } => {
                // `id_len` is the length of the id this text begins with, so a char boundary;
                // were it not, the whole text would be the id rather than a panic.
                let (id, transport) = usize::try_from(*id_len)
                    .ok()
                    .and_then(|at| text.split_at_checked(at))
                    .unwrap_or((text, ""));
                Outcome(Kept::Sent {
                    receipt: Receipt {
                        id: id.into(),
                        transport: transport.into(),
                        accepted: Vec::new(),
                        replayed: false,
                    },
                    accepted_at: accepted_at.to_vec(),
                })
            }
            Self::Other(outcome) => Outcome::clone(outcome),
        }
    }
}
