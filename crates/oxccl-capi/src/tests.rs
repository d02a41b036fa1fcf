//! Tests of the entry points' helpers: unique ids, configs, error strings.

use super::*;
use crate::entry::guard;
use oxccl::UniqueId;

#[test]
fn a_panic_becomes_internal_error_with_its_message() {
    let code = guard("ncclTestEntry", || panic!("boom at the boundary"));
    assert_eq!(code, INTERNAL_ERROR);
    // SAFETY: ncclGetLastError returns a NUL-terminated string owned by this thread.
    let msg =
        unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }.to_string_lossy().into_owned();
    assert!(msg.contains("ncclTestEntry") && msg.contains("boom at the boundary"), "{msg}");
}

#[test]
fn unique_ids_round_trip_and_garbage_is_refused() {
    for root in ["127.0.0.1:4242", "[::1]:65535"] {
        let id = UniqueId { root: root.parse().unwrap(), secret: [7; 32] };
        let back = decode_id(&encode_id(&id), "commId").unwrap();
        assert_eq!((back.root, back.secret), (id.root, id.secret));
    }
    let e = decode_id(&ncclUniqueId { internal: [0; 128] }, "commId").unwrap_err();
    assert_eq!(e.code, fail::INVALID_ARGUMENT);
    assert!(e.msg.contains("commId"), "{}", e.msg);
}

#[test]
fn result_codes_of_oxccl_errors() {
    use oxccl::Error;
    let r = Rank::new(1);
    assert_eq!(fail::code_of(&Error::Aborted { rank: r }), fail::INVALID_USAGE);
    assert_eq!(fail::code_of(&Error::Internal("x".into())), INTERNAL_ERROR);
    let t = Error::Timeout {
        rank: r,
        op: "x".into(),
        after: Duration::from_secs(1),
        waiting_for: vec![],
        detail: String::new(),
    };
    assert_eq!(fail::code_of(&t), fail::REMOTE_ERROR);
    let io = Error::Io { rank: r, op: "x", peer: None, source: std::io::Error::other("x") };
    assert_eq!(fail::code_of(&io), fail::SYSTEM_ERROR);
}
use std::time::Duration;
