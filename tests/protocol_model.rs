//! A model check of the send protocol: every interleaving of reserve, send, complete, release,
//! lease extension, lease expiry, store faults, owner crashes, settlement retries and repeats,
//! explored exhaustively for small bounds.
//!
//! The property is the crate's guarantee: **a key reaches the provider twice only if an owner
//! crashed after the provider accepted, and its lease then passed.** The checker proves it for
//! the protocol as the layer runs it (settlements retried until the lease is about to end,
//! leases renewed while a send or its settlement runs, a maximum hold on a send that never
//! ends), and finds the counterexample as soon as settlement retries or lease renewal are
//! switched off, or store faults outlast the renewal window.
//!
//! The model is deliberately small and explicit rather than a library: one key, a few senders
//! (a job that runs several times), a discrete clock. Each action below names the code it
//! stands for.
//!
//! | action | stands for |
//! |---|---|
//! | `Arrive` | a send reaching the layer: `Store::reserve` (may fault; a fault's write may land with its reply lost) |
//! | `ProviderAnswers` | the inner service answering: accepted, certainly not sent, or unknown |
//! | `MaxHold` | the layer giving up on an inner future that never ends: the key is kept as unknown |
//! | `Settle` | `Store::complete` / `Store::release` after the send, retried on faults until the lease is about to end |
//! | `Renew` | `Store::extend` while the send or its settlement runs, fenced by the token |
//! | `Crash` | the process dies: no settlement, no renewal |
//! | `Tick` | time passes; only when no due action is left (retries and renewals run on time) |
//!
//! With the re-send options the model grows a provider that deduplicates on the key for
//! a window from the first message it took (Resend), and two layer options: a re-send window
//! (`provider_window`: a repeat of a kept unknown outcome, or a takeover, whose first attempt
//! by the store's clock is younger than it is sent again under the same key, `Store::retake`)
//! and a verification service asked on a takeover (`verify_takeovers`: answers the truth or
//! unknown). There the property is stronger: **a key never makes two provider messages**, a
//! crash included, as long as the layer's window is no longer than the provider's.
//!
//! | action | stands for |
//! |---|---|
//! | `Arrive` on a kept unknown outcome inside the window | `Store::retake`, then a send under the same key |
//! | `Arrive` on a pending record past its lease | `Reservation::TakenOver`: re-send inside the window, else ask the verifier (`ArriveUnverified`: it cannot tell) |

use std::collections::{HashMap, VecDeque};

/// The bounds and the switches of one exploration.
#[derive(Clone, Copy, Debug)]
struct Model {
    senders: usize,
    lease: u8,
    /// A renewal is due when this many ticks or fewer are left of the lease.
    renew_margin: u8,
    /// A failed settlement is retried while more than this many ticks are left.
    settle_margin: u8,
    /// The layer gives up on a send after this many ticks (`None`: never).
    max_hold: Option<u8>,
    horizon: u8,
    faults: u8,
    crashes: u8,
    settle_retries: bool,
    renewal: bool,
    /// `provider_window`: the layer re-sends while the first attempt is younger than this.
    layer_window: Option<u8>,
    /// `verify_takeovers`: a takeover asks a verifier that answers the truth or unknown.
    verifier: bool,
    /// The provider deduplicates on the key this long after the first message it took.
    provider_dedup: Option<u8>,
}

impl Model {
    /// The protocol as the layer runs it: a job that sends one key twice, a renewal due in
    /// the last three fifths of the lease, room for two store faults and one crash.
    fn as_built() -> Self {
        Self {
            senders: 2,
            lease: 5,
            renew_margin: 3,
            settle_margin: 1,
            max_hold: Some(7),
            horizon: 10,
            faults: 2,
            crashes: 1,
            settle_retries: true,
            renewal: true,
            layer_window: None,
            verifier: false,
            provider_dedup: None,
        }
    }

    /// As built, with a provider that deduplicates for longer than the horizon (Resend's
    /// 24 hours), the layer's window inside it, and a verification service.
    fn with_resends() -> Self {
        Self {
            layer_window: Some(4),
            verifier: true,
            provider_dedup: Some(24),
            ..Self::as_built()
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Record {
    Free,
    /// `first`: when the first attempt under the key began, by the store's clock.
    Pending {
        token: u8,
        expiry: u8,
        first: u8,
    },
    Done {
        token: u8,
        unknown: bool,
        first: Option<u8>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Finish {
    Complete,
    CompleteUnknown,
    Release,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Phase {
    Idle,
    Sending { since: u8 },
    Settling { finish: Finish, retry_at: u8 },
    Finished,
    Crashed { after_accept: bool },
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Sender {
    phase: Phase,
    /// The provider took this sender's message.
    took: bool,
    /// When this sender believes its lease ends.
    deadline: u8,
    /// Whether its renewal still runs, and when it may next try.
    renewing: bool,
    renew_at: u8,
}

/// At most this many senders; unused slots stay finished.
const MAX_SENDERS: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct State {
    now: u8,
    record: Record,
    senders: [Sender; MAX_SENDERS],
    /// Requests the provider took (a deduplicated one included).
    accepted: u8,
    /// Messages the provider made of them: a deduplicated request makes none.
    messages: u8,
    /// When the provider took the first message under the key.
    provider_took_at: Option<u8>,
    /// A verifier's answer settled a takeover as delivered, with no send.
    verified_delivered: bool,
    /// The key held the provider's receipt at some point.
    receipt_kept: bool,
    /// A send started after that.
    sent_after_receipt: bool,
    faults_left: u8,
    crashes_left: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Action {
    Arrive(usize),
    ArriveUnverified(usize),
    ArriveFaulted(usize),
    ArriveReplyLost(usize),
    ProviderAccepts(usize),
    ProviderRefuses(usize),
    ProviderUnknown(usize, bool),
    MaxHold(usize, bool),
    Settle(usize),
    SettleFaulted(usize),
    SettleReplyLost(usize),
    Renew(usize),
    RenewFaulted(usize),
    Crash(usize),
    Tick,
}

impl State {
    fn initial(model: &Model) -> Self {
        Self {
            now: 0,
            record: Record::Free,
            senders: std::array::from_fn(|i| Sender {
                phase: if i < model.senders {
                    Phase::Idle
                } else {
                    Phase::Finished
                },
                took: false,
                deadline: 0,
                renewing: false,
                renew_at: 0,
            }),
            accepted: 0,
            messages: 0,
            provider_took_at: None,
            verified_delivered: false,
            receipt_kept: false,
            sent_after_receipt: false,
            faults_left: model.faults,
            crashes_left: model.crashes,
        }
    }

    /// The guarantee: a second acceptance needs an owner that crashed after its message was
    /// accepted (its lease then passed, or nobody could have reserved again).
    fn guarantee_holds(&self) -> bool {
        self.accepted < 2
            || self
                .senders
                .iter()
                .any(|s| matches!(s.phase, Phase::Crashed { after_accept: true }))
    }

    fn token(i: usize) -> u8 {
        u8::try_from(i + 1).unwrap_or(u8::MAX)
    }

    fn reservable(&self) -> bool {
        match self.record {
            Record::Free => true,
            Record::Pending { expiry, .. } => expiry <= self.now,
            Record::Done { .. } => false, // the ttl outlives the horizon
        }
    }

    /// `reserve` of a free or expired key: a takeover of a pending record keeps its first
    /// attempt (one message per key in this model), anything else starts one now.
    fn reserve(&mut self, i: usize, model: &Model) {
        let expiry = self.now.saturating_add(model.lease);
        let first = match self.record {
            Record::Pending { first, .. } => first,
            _ => self.now,
        };
        self.record = Record::Pending {
            token: Self::token(i),
            expiry,
            first,
        };
    }

    /// Whether a first attempt at `first` is inside the layer's re-send window.
    fn inside_window(&self, first: u8, model: &Model) -> bool {
        model
            .layer_window
            .is_some_and(|w| self.now < first.saturating_add(w))
    }

    /// The provider takes a request under the key: a new message unless it deduplicates.
    fn provider_takes(&mut self, i: usize, model: &Model) {
        self.accepted += 1;
        self.senders[i].took = true;
        let dedups = matches!(
            (model.provider_dedup, self.provider_took_at),
            (Some(p), Some(at)) if self.now < at.saturating_add(p)
        );
        if !dedups {
            self.messages += 1;
            self.provider_took_at = Some(self.now);
        }
    }

    /// `complete`: written when the token holds the key or nothing live does; fenced
    /// otherwise. The token's own record keeps its first attempt.
    fn complete(&mut self, i: usize, unknown: bool) {
        let me = Self::token(i);
        let (writes, first) = match self.record {
            Record::Free => (true, None),
            Record::Pending {
                token,
                expiry,
                first,
            } => (
                token == me || expiry <= self.now,
                (token == me).then_some(first),
            ),
            Record::Done { token, first, .. } => (token == me, first),
        };
        if writes {
            self.record = Record::Done {
                token: me,
                unknown,
                first,
            };
            self.receipt_kept |= !unknown;
        }
    }

    /// `release`: frees the key only while the token holds it pending.
    fn release(&mut self, i: usize) {
        if let Record::Pending { token, .. } = self.record
            && token == Self::token(i)
        {
            self.record = Record::Free;
        }
    }

    /// `extend`: only the live holder's lease is extended.
    fn extend(&mut self, i: usize, model: &Model) -> bool {
        match self.record {
            Record::Pending {
                token,
                expiry,
                first,
            } if token == Self::token(i) && expiry > self.now => {
                let expiry = self.now.saturating_add(model.lease);
                self.record = Record::Pending {
                    token,
                    expiry,
                    first,
                };
                self.senders[i].deadline = expiry;
                true
            }
            _ => false,
        }
    }

    fn settle_due(&self, i: usize) -> bool {
        matches!(self.senders[i].phase, Phase::Settling { retry_at, .. } if retry_at <= self.now)
    }

    fn renew_due(&self, i: usize, model: &Model) -> bool {
        let s = &self.senders[i];
        matches!(s.phase, Phase::Sending { .. } | Phase::Settling { .. })
            && s.renewing
            && s.renew_at <= self.now
            && self.now.saturating_add(model.renew_margin) >= s.deadline
    }

    fn hold_over(&self, i: usize, model: &Model) -> bool {
        match (self.senders[i].phase, model.max_hold) {
            (Phase::Sending { since }, Some(max)) => self.now >= since.saturating_add(max),
            _ => false,
        }
    }

    /// Due actions run before time passes: a retry or a renewal is never late.
    fn anything_due(&self, model: &Model) -> bool {
        (0..self.senders.len())
            .any(|i| self.settle_due(i) || self.renew_due(i, model) || self.hold_over(i, model))
    }

    /// After a failed settlement: retry next tick while the lease has room, else give up.
    fn after_settle_fault(&mut self, i: usize, finish: Finish, model: &Model) {
        let s = &mut self.senders[i];
        if model.settle_retries && self.now.saturating_add(model.settle_margin) < s.deadline {
            s.phase = Phase::Settling {
                finish,
                retry_at: self.now + 1,
            };
        } else {
            s.phase = Phase::Finished;
            s.renewing = false;
        }
    }

    fn apply_settle(&mut self, i: usize, finish: Finish) {
        match finish {
            Finish::Complete => self.complete(i, false),
            Finish::CompleteUnknown => self.complete(i, true),
            Finish::Release => self.release(i),
        }
    }

    /// A send arriving: reserve, take back a kept unknown outcome inside the window, or take
    /// over a pending record past its lease and decide as the layer does; `verifier_knows`
    /// says whether a verifier asked answers the truth (else it cannot tell).
    fn arrive(&mut self, i: usize, model: &Model, verifier_knows: bool) {
        let send = |s: &mut State| {
            s.sent_after_receipt |= s.receipt_kept;
            s.senders[i] = Sender {
                phase: Phase::Sending { since: s.now },
                took: false,
                deadline: s.now.saturating_add(model.lease),
                renewing: model.renewal,
                renew_at: s.now,
            };
        };
        match self.record {
            Record::Free => {
                self.reserve(i, model);
                send(self);
            }
            Record::Pending { expiry, first, .. } if expiry <= self.now => {
                // `Reservation::TakenOver`.
                self.reserve(i, model);
                if self.inside_window(first, model) || !model.verifier {
                    send(self);
                } else if !verifier_knows {
                    self.complete(i, true); // idempotency.unverified: kept, not sent
                    self.senders[i].phase = Phase::Finished;
                } else if self.provider_took_at.is_some() {
                    self.complete(i, false); // the provider's receipt, not sent
                    self.verified_delivered = true;
                    self.senders[i].phase = Phase::Finished;
                } else {
                    send(self);
                }
            }
            Record::Done {
                unknown: true,
                first: Some(first),
                ..
            } if self.inside_window(first, model) => {
                // `Store::retake`: pending again, the first attempt kept.
                self.record = Record::Pending {
                    token: Self::token(i),
                    expiry: self.now.saturating_add(model.lease),
                    first,
                };
                send(self);
            }
            // in_flight or replayed: not sent.
            _ => self.senders[i].phase = Phase::Finished,
        }
    }

    fn successors(&self, model: &Model) -> Vec<(Action, State)> {
        let mut out = Vec::new();
        let mut push = |action: Action, f: &dyn Fn(&mut State)| {
            let mut next = *self;
            f(&mut next);
            out.push((action, next));
        };
        for i in 0..self.senders.len() {
            let sender = self.senders[i];
            match sender.phase {
                Phase::Idle => {
                    push(Action::Arrive(i), &|s| s.arrive(i, model, true));
                    if model.verifier && s_takeover_asks(self, model) {
                        push(Action::ArriveUnverified(i), &|s| s.arrive(i, model, false));
                    }
                    if self.faults_left > 0 {
                        push(Action::ArriveFaulted(i), &|s| {
                            s.faults_left -= 1;
                            s.senders[i].phase = Phase::Finished; // store_failed: not sent
                        });
                        push(Action::ArriveReplyLost(i), &|s| {
                            s.faults_left -= 1;
                            if s.reservable() {
                                s.reserve(i, model); // held until its lease passes
                            }
                            s.senders[i].phase = Phase::Finished;
                        });
                    }
                }
                Phase::Sending { .. } => {
                    let settling = |finish| Phase::Settling {
                        finish,
                        retry_at: self.now,
                    };
                    push(Action::ProviderAccepts(i), &|s| {
                        s.provider_takes(i, model);
                        s.senders[i].phase = settling(Finish::Complete);
                    });
                    push(Action::ProviderRefuses(i), &|s| {
                        s.senders[i].phase = settling(Finish::Release);
                    });
                    for took in [false, true] {
                        push(Action::ProviderUnknown(i, took), &|s| {
                            if took {
                                s.provider_takes(i, model);
                            }
                            s.senders[i].phase = settling(Finish::CompleteUnknown);
                        });
                    }
                    if self.hold_over(i, model) {
                        for took in [false, true] {
                            push(Action::MaxHold(i, took), &|s| {
                                if took {
                                    s.provider_takes(i, model);
                                }
                                s.senders[i].phase = settling(Finish::CompleteUnknown);
                            });
                        }
                    }
                }
                Phase::Settling { finish, .. } if self.settle_due(i) => {
                    push(Action::Settle(i), &|s| {
                        s.apply_settle(i, finish);
                        s.senders[i].phase = Phase::Finished;
                        s.senders[i].renewing = false;
                    });
                    if self.faults_left > 0 {
                        push(Action::SettleFaulted(i), &|s| {
                            s.faults_left -= 1;
                            s.after_settle_fault(i, finish, model);
                        });
                        push(Action::SettleReplyLost(i), &|s| {
                            s.faults_left -= 1;
                            s.apply_settle(i, finish);
                            s.after_settle_fault(i, finish, model);
                        });
                    }
                }
                _ => {}
            }
            if self.renew_due(i, model) {
                push(Action::Renew(i), &|s| {
                    if !s.extend(i, model) {
                        s.senders[i].renewing = false; // lease lost: counted and warned
                    }
                });
                if self.faults_left > 0 {
                    push(Action::RenewFaulted(i), &|s| {
                        s.faults_left -= 1;
                        s.senders[i].renew_at = s.now + 1;
                    });
                }
            }
            if self.crashes_left > 0
                && matches!(sender.phase, Phase::Sending { .. } | Phase::Settling { .. })
            {
                push(Action::Crash(i), &|s| {
                    s.crashes_left -= 1;
                    let after_accept = s.senders[i].took;
                    s.senders[i].phase = Phase::Crashed { after_accept };
                    s.senders[i].renewing = false;
                });
            }
        }
        if self.now < model.horizon && !self.anything_due(model) {
            push(Action::Tick, &|s| s.now += 1);
        }
        out
    }
}

/// Whether an arrival now takes over a pending record and asks the verifier.
fn s_takeover_asks(state: &State, model: &Model) -> bool {
    matches!(state.record, Record::Pending { expiry, first, .. }
        if expiry <= state.now && !state.inside_window(first, model))
}

/// What an exhaustive exploration found.
struct Report {
    states: usize,
    /// The shortest path to a state that breaks the guarantee, if one is reachable.
    counterexample: Option<Vec<(Action, State)>>,
    /// Whether some reachable state has two acceptances (after an owner crash).
    second_send_after_crash_reachable: bool,
    /// Whether some reachable state has exactly one acceptance and every sender finished.
    single_delivery_reachable: bool,
    /// Whether the provider deduplicated a re-send in some reachable state.
    deduplicated_resend_reachable: bool,
    /// Whether a verifier settled a takeover as delivered in some reachable state.
    verified_delivered_reachable: bool,
}

/// With the re-send options: the provider never makes two messages of one key.
fn one_message(state: &State) -> bool {
    state.messages < 2
}

fn explore(model: &Model) -> Report {
    explore_for(model, State::guarantee_holds)
}

fn explore_for(model: &Model, holds: fn(&State) -> bool) -> Report {
    let start = State::initial(model);
    let mut parent: HashMap<State, Option<(State, Action)>> = HashMap::new();
    parent.insert(start, None);
    let mut queue = VecDeque::from([start]);
    let mut report = Report {
        states: 0,
        counterexample: None,
        second_send_after_crash_reachable: false,
        single_delivery_reachable: false,
        deduplicated_resend_reachable: false,
        verified_delivered_reachable: false,
    };
    while let Some(state) = queue.pop_front() {
        report.states += 1;
        if !holds(&state) {
            report.counterexample = Some(path_to(&parent, state));
            return report;
        }
        if state.accepted >= 2 {
            report.second_send_after_crash_reachable = true;
        }
        report.deduplicated_resend_reachable |= state.accepted > state.messages;
        report.verified_delivered_reachable |= state.verified_delivered;
        if state.accepted == 1
            && state
                .senders
                .iter()
                .all(|s| matches!(s.phase, Phase::Finished))
        {
            report.single_delivery_reachable = true;
        }
        for (action, next) in state.successors(model) {
            if let std::collections::hash_map::Entry::Vacant(entry) = parent.entry(next) {
                entry.insert(Some((state, action)));
                queue.push_back(next);
            }
        }
    }
    report
}

fn path_to(parent: &HashMap<State, Option<(State, Action)>>, end: State) -> Vec<(Action, State)> {
    let mut path = Vec::new();
    let mut current = end;
    while let Some(Some((previous, action))) = parent.get(&current) {
        path.push((*action, current));
        current = *previous;
    }
    path.reverse();
    path
}

fn describe(path: &[(Action, State)]) -> String {
    path.iter()
        .map(|(action, state)| {
            format!(
                "t={} {action:?} -> record {:?}, accepted {}, messages {}",
                state.now, state.record, state.accepted, state.messages
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn actions(path: &[(Action, State)]) -> Vec<Action> {
    path.iter().map(|(a, _)| *a).collect()
}

#[test]
fn a_key_reaches_the_provider_twice_only_after_an_owner_crash() {
    let report = explore(&Model::as_built());
    if let Some(path) = &report.counterexample {
        panic!("the guarantee broke:\n{}", describe(path));
    }
    // Not vacuous: the model does reach one delivery, and a second one after a crash.
    assert!(report.single_delivery_reachable);
    assert!(report.second_send_after_crash_reachable);
    assert!(
        report.states > 100_000,
        "explored only {} states",
        report.states
    );
}

#[test]
fn with_no_crash_a_key_reaches_the_provider_at_most_once() {
    let model = Model {
        crashes: 0,
        ..Model::as_built()
    };
    let report = explore(&model);
    assert!(report.counterexample.is_none());
    assert!(!report.second_send_after_crash_reachable);
    assert!(report.single_delivery_reachable);
}

#[test]
fn without_settlement_retries_one_store_fault_sends_twice() {
    let model = Model {
        settle_retries: false,
        faults: 1,
        crashes: 0,
        ..Model::as_built()
    };
    let path = explore(&model)
        .counterexample
        .expect("a lost complete lets the message go again");
    let steps = actions(&path);
    assert!(
        steps
            .iter()
            .any(|a| matches!(a, Action::SettleFaulted(_) | Action::SettleReplyLost(_))),
        "{}",
        describe(&path)
    );
    assert!(!steps.iter().any(|a| matches!(a, Action::Crash(_))));
}

#[test]
fn without_renewal_a_send_that_outlives_its_lease_lets_a_repeat_in() {
    let model = Model {
        renewal: false,
        faults: 0,
        crashes: 0,
        ..Model::as_built()
    };
    let path = explore(&model)
        .counterexample
        .expect("a slow send loses its key to a repeat");
    let steps = actions(&path);
    assert!(!steps.iter().any(|a| matches!(a, Action::Crash(_))));
    let arrivals = steps
        .iter()
        .filter(|a| matches!(a, Action::Arrive(_)))
        .count();
    assert!(arrivals >= 2, "{}", describe(&path));
}

#[test]
fn store_faults_that_outlast_the_renewal_window_are_the_limit() {
    // Three faults in a row fill the renewal window (renewals are due in the last three
    // ticks): the guarantee assumes store outages shorter than that. The docs say so.
    let model = Model {
        faults: 3,
        crashes: 0,
        ..Model::as_built()
    };
    let path = explore(&model)
        .counterexample
        .expect("an outage longer than the renewal window loses the lease");
    assert!(
        actions(&path)
            .iter()
            .filter(|a| matches!(a, Action::RenewFaulted(_)))
            .count()
            >= 1,
        "{}",
        describe(&path)
    );
}

#[test]
fn with_the_window_and_a_verifier_a_key_never_makes_two_provider_messages() {
    // A crash after the provider took the message included: inside the window the re-send is
    // deduplicated by the provider, outside it the verifier is asked before any send.
    let report = explore_for(&Model::with_resends(), one_message);
    if let Some(path) = &report.counterexample {
        panic!("two provider messages:\n{}", describe(path));
    }
    // Not vacuous: re-sends happen and are deduplicated, and verified takeovers send nothing.
    assert!(report.single_delivery_reachable);
    assert!(report.deduplicated_resend_reachable);
    assert!(report.verified_delivered_reachable);
    assert!(
        report.second_send_after_crash_reachable,
        "re-sends reach the provider"
    );
}

#[test]
fn a_delivered_key_is_never_sent_again() {
    // The seed's reconciliation claim: once the key holds the provider's receipt (kept by a
    // send, or by a verifier after a takeover), no send starts under it again.
    let report = explore_for(&Model::with_resends(), |s| !s.sent_after_receipt);
    if let Some(path) = &report.counterexample {
        panic!("a send after the receipt was kept:\n{}", describe(path));
    }
    assert!(report.verified_delivered_reachable);
}

#[test]
fn without_a_verifier_a_takeover_outside_the_window_sends_a_second_message() {
    // A provider that forgets the key before the crashed holder's lease passes, and no
    // re-send window: a takeover is the only way to a second send.
    let model = Model {
        verifier: false,
        layer_window: None,
        provider_dedup: Some(3),
        ..Model::with_resends()
    };
    let path = explore_for(&model, one_message)
        .counterexample
        .expect("the one duplicate the guarantee allows");
    // With the verifier, the same provider and windows make no duplicate.
    let verified = Model {
        verifier: true,
        ..model
    };
    if let Some(path) = explore_for(&verified, one_message).counterexample {
        panic!("with a verifier:\n{}", describe(&path));
    }
    assert!(
        actions(&path).iter().any(|a| matches!(a, Action::Crash(_))),
        "{}",
        describe(&path)
    );
}

#[test]
fn a_re_send_must_reach_the_provider_inside_its_window() {
    // Found by this checker: a layer window as long as the provider's is not enough. The
    // window bounds when a re-send starts; the provider counts from its first message to
    // when the re-send arrives. So the layer's window must leave, below the provider's, the
    // longest a send takes (its timeout, at most the maximum hold). The docs say so.
    let model = Model {
        layer_window: Some(1),
        provider_dedup: Some(1),
        crashes: 0,
        faults: 0,
        ..Model::with_resends()
    };
    let path = explore_for(&model, one_message)
        .counterexample
        .expect("a re-send that arrives after the provider's window");
    assert!(
        actions(&path).iter().any(|a| matches!(a, Action::Tick)),
        "{}",
        describe(&path)
    );
}

#[test]
fn a_layer_window_longer_than_the_providers_sends_twice() {
    // The docs' rule: the window the layer re-sends in must be no longer than the one the
    // provider deduplicates in.
    let model = Model {
        layer_window: Some(8),
        provider_dedup: Some(2),
        crashes: 0,
        ..Model::with_resends()
    };
    let path = explore_for(&model, one_message)
        .counterexample
        .expect("a re-send after the provider forgot the key");
    assert!(
        !actions(&path).iter().any(|a| matches!(a, Action::Crash(_))),
        "{}",
        describe(&path)
    );
}
