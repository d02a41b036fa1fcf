//! The collective matrix over shared memory: world sizes 1, 2, 3, 4, 5, 8; every collective,
//! data type, valid operator, placement and root; counts 0, 1, 7 and 1 Mi + 3.

use oxccl_testkit::matrixrun::{launch_matrix, rank_main};
use std::time::Duration;

oxccl_testkit::test_scope!();

#[test]
fn matrix_shm() {
    if let Some(ctx) = oxccl_testkit::child("matrix_shm") {
        return rank_main(ctx);
    }
    let sizes: Vec<usize> = std::env::var("OXCCL_TEST_SIZES")
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|_| vec![1, 2, 3, 4, 5, 8]);
    for p in sizes {
        launch_matrix("matrix_shm", "matrix_shm", p, &[], Duration::from_secs(900));
    }
}
