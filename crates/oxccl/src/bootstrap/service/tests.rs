//! Tests of the service: hellos, offers, the mailbox, probe answers.

use super::*;
use crate::wait::{PeerState, MAX_REST};
use oxccl_core::contract::CallKind;

fn sig(seq: u64, kind: CallKind) -> Sig {
    Sig { seq, kind, dtype: 7, op: Sig::NO_OP, root: 0, count: 4 }
}

#[test]
fn a_groups_later_calls_go_with_its_probe_answers_only() {
    let p = Progress::default();
    // A group of three collectives, numbered 5, 6, 7.
    p.group_rest([sig(6, CallKind::AllReduce), sig(7, CallKind::Broadcast)].into_iter());
    p.begin(&sig(5, CallKind::AllReduce));
    let st = p.snapshot();
    assert_eq!(st.calls().map(|s| s.seq).collect::<Vec<_>>(), [5, 6, 7]);
    let (nonce, back) = PeerState::decode(&st.encode(99)).unwrap();
    assert_eq!((nonce, &back), (99, &st));
    // Idle, and then in a later single call: the old list is not this call's.
    p.end(8);
    assert!(p.snapshot().rest.is_empty());
    p.begin(&sig(8, CallKind::Gather));
    assert_eq!(p.snapshot().calls().count(), 1);
    // Answers list at most MAX_REST later calls, and a longer list does not decode.
    let long = PeerState { rest: vec![sig(1, CallKind::AllGather); MAX_REST + 3], ..st };
    let (_, cut) = PeerState::decode(&long.encode(1)).unwrap();
    assert_eq!(cut.rest.len(), MAX_REST);
    let mut w = Writer::new();
    w.u64(1).u8(1);
    for x in [0u64; 4] {
        w.u64(x);
    }
    w.u32(MAX_REST as u32 + 1);
    let e = PeerState::decode(&w.finish()).unwrap_err();
    assert!(e.to_string().contains("at most 64"), "{e}");
}

#[test]
fn a_mismatch_found_a_call_late_is_told_with_this_ranks_call_of_that_number() {
    let p = Progress::default();
    let root = |seq, root| Sig { root, ..sig(seq, CallKind::Broadcast) };
    p.begin(&root(1, 1));
    p.end(2);
    p.begin(&sig(2, CallKind::AllReduce));
    // A peer still in call #1 with root 0: the divergence is call #1's, root 1 against root 0.
    assert_eq!(p.mismatch_with(sig(2, CallKind::AllReduce), root(1, 0)), root(1, 1));
    // A peer in this very call, or whose call #1 was this rank's: the current call is told.
    assert_eq!(p.mismatch_with(sig(2, CallKind::AllReduce), root(2, 0)), sig(2, CallKind::AllReduce));
    assert_eq!(p.mismatch_with(sig(2, CallKind::AllReduce), root(1, 1)), sig(2, CallKind::AllReduce));
    // Beyond the remembered calls (or never made): the current call is told.
    for s in 3..8 {
        p.begin(&sig(s, CallKind::AllReduce));
    }
    assert_eq!(p.earlier(1), None);
    assert_eq!(p.mismatch_with(sig(7, CallKind::AllReduce), root(1, 0)), sig(7, CallKind::AllReduce));
    assert_eq!(p.earlier(6), Some(sig(6, CallKind::AllReduce)));
}
