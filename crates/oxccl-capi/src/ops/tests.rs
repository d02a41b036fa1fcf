//! Tests of the staged path: device buffers are mirrored by range and direction.

use super::staged::*;
use super::*;
use oxccl::{DataType, Rank, ReduceOp};

fn call(kind: Kind, send: usize, recv: usize, send_len: usize, recv_len: usize, in_place: bool) -> Call {
    Call {
        func: "test",
        kind,
        dtype: DataType::F32,
        send: send as *const u8,
        recv: recv as *mut u8,
        send_len,
        recv_len,
        in_place,
        count: 0,
        premul: None,
        stream: 0,
    }
}

/// Which device ranges a call mirrors and which way each is copied: in-place layouts are
/// one range copied both ways (pointers inside it at their offsets), inputs are copied in
/// only, outputs back only, and host buffers and empty ranges not at all.
#[test]
fn device_buffers_are_mirrored_by_range_and_direction() {
    // In-place AllGather, rank 1 of 4, 256 bytes per rank: one 1 KiB range at recvbuff.
    let c = call(Kind::AllGather, 0x1100, 0x1000, 256, 1024, true);
    let v = spans(&c, true, true);
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].start, v[0].len, v[0].input, v[0].output), (0x1000, 1024, true, true));
    assert!(v[0].send && v[0].recv);
    // In-place ReduceScatter: the range is the larger send buffer.
    let c = call(Kind::ReduceScatter(ReduceOp::Sum), 0x2000, 0x2200, 1024, 256, true);
    let v = spans(&c, true, true);
    assert_eq!((v[0].start, v[0].len), (0x2000, 1024));
    // Out of place, both on the device: input in, output back.
    let c = call(Kind::AllReduce(ReduceOp::Max), 0x3000, 0x9000, 64, 64, false);
    let v = spans(&c, true, true);
    assert_eq!(v.len(), 2);
    assert_eq!((v[0].start, v[0].input, v[0].output, v[0].send), (0x3000, true, false, true));
    assert_eq!((v[1].start, v[1].input, v[1].output, v[1].recv), (0x9000, false, true, true));
    // Device input, host output: only the input is mirrored.
    let v = spans(&c, true, false);
    assert_eq!(v.len(), 1);
    assert!(v[0].send && !v[0].recv);
    // A non-root Reduce has no output range; a Recv no input range.
    let c = call(Kind::Reduce(ReduceOp::Sum, Rank::new(0)), 0x3000, 0x9000, 64, 0, false);
    assert_eq!(spans(&c, true, true).len(), 1);
    let c = call(Kind::Recv(Rank::new(0)), 0, 0x9000, 0, 64, false);
    let v = spans(&c, true, true);
    assert_eq!(v.len(), 1);
    assert!(v[0].recv && v[0].output && !v[0].input);
    // Host memory everywhere: nothing.
    let c = call(Kind::AllToAll, 0x3000, 0x9000, 64, 64, false);
    assert!(spans(&c, false, false).is_empty());
}
