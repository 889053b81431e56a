//! The CPU buffer pool: a freed tensor's buffer is reused (zeroed), and a
//! request that finds none frees pooled buffers only past the high-water
//! mark of live bytes, which keeps peak memory from rising.

use asrforge::backend::cpu::pool::{self, MIN_BYTES};
use asrforge::{Device, Tensor};

/// One test: the f64 shelf and the high-water mark are process-wide.
#[test]
fn freed_buffers_are_reused_zeroed_and_evicted_past_the_high_water_mark() {
    pool::clear::<f64>();
    let n = MIN_BYTES / 8 + 5;
    // A tensor's storage goes back to the pool when the tensor drops.
    let t = Tensor::from_vec(vec![7.0f64; n], [n], &Device::Cpu).unwrap();
    drop(t);
    let held = pool::pooled_bytes::<f64>();
    assert!(held >= n * 8, "the dropped tensor's {} bytes are pooled, found {held}", n * 8);
    // A request up to 1/8 below the buffer's size takes it, zeroed.
    let w = pool::zeroed::<f64>(n - 3);
    assert_eq!(w.len(), n - 3);
    assert!(w.iter().all(|&x| x == 0.0), "a reused buffer comes back zeroed");
    assert_eq!(pool::pooled_bytes::<f64>(), 0, "the fitting buffer was taken");
    pool::give(w);
    // A bigger request than ever before finds no buffer: the pool is
    // emptied first, so live + pooled bytes never pass the new mark.
    let big = pool::zeroed::<f64>(4 * n);
    assert_eq!(big.len(), 4 * n);
    assert!(big.iter().all(|&x| x == 0.0));
    assert_eq!(pool::pooled_bytes::<f64>(), 0, "a miss above the high-water mark empties the pool");
    pool::give(big);
    // A request much smaller than a pooled buffer does not take it (at most 1/8 spare) ...
    let small = pool::zeroed::<f64>(n);
    assert_eq!(pool::pooled_bytes::<f64>(), 0, "live + pooled + request passed the mark, so the big buffer was freed");
    pool::give(small);
    // ... and under the mark a miss keeps what is pooled.
    let two = pool::zeroed::<f64>(2 * n);
    assert_eq!(two.len(), 2 * n);
    assert!(pool::pooled_bytes::<f64>() >= n * 8, "under the high-water mark the pooled buffer stays");
    // Small buffers are left to the allocator.
    pool::clear::<f64>();
    pool::give(vec![1.0f64; 16]);
    assert_eq!(pool::pooled_bytes::<f64>(), 0);
    drop(two);
}
