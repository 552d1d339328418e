//! [`KeptOutcome`]: an outcome as [`MemoryStore`](super::MemoryStore) keeps it, in
//! about half the room of an [`Outcome`].

use crate::outcome::{Kept, Outcome, Receipt};

/// An outcome in the memory store: a record holds one for as long as its ttl, so the common
/// case (a receipt as the layer keeps it: an id and a transport) is kept in one boxed slice
/// without spare capacity, and anything else as given.
pub(super) enum KeptOutcome {
    /// A receipt that names no accepted address nor any accepted position, and is not marked
    /// replayed. Its id and transport are one allocation, the id first (`id_len` bytes),
    /// then the transport: one allocation less per record to make, free and keep a header
    /// for, and 24 bytes in the record.
    Receipt { text: Box<str>, id_len: u32 },
    /// Any other outcome (a failure of unknown delivery, a receipt with accepted recipients
    /// by position or by address, an id longer than `u32::MAX` bytes), exactly as given.
    Other(Box<Outcome>),
}

// Each byte here is a byte of every record in the map's table.
const _: () = assert!(std::mem::size_of::<Option<KeptOutcome>>() == 24);

impl KeptOutcome {
    pub(super) fn of(outcome: &Outcome) -> Self {
        match &outcome.0 {
            Kept::Sent {
                receipt,
                accepted_at,
            } if receipt.accepted.is_empty() && accepted_at.is_empty() && !receipt.replayed => {
                match u32::try_from(receipt.id.len()) {
                    Ok(id_len) => Self::Receipt {
                        text: [receipt.id.as_str(), receipt.transport.as_str()]
                            .concat()
                            .into_boxed_str(),
                        id_len,
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
            Self::Receipt { text, id_len } => {
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
                    accepted_at: Vec::new(),
                })
            }
            Self::Other(outcome) => Outcome::clone(outcome),
        }
    }
}
