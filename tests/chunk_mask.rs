//! The encoder's chunk masks equal WeNet's `subsequent_chunk_mask` /
//! `add_optional_chunk_mask` element for element (masks written out by hand
//! from WeNet's definition and its docstring example), and the dynamic draw
//! follows WeNet's rule.

use asrforge::models::mask::{
    add_optional_chunk_mask, choose_chunk, chunk_attention_mask, dynamic_chunk_from_draws, subsequent_chunk_mask, Chunk, ChunkConfig, ChunkRequest,
};
use asrforge::tensor::{rng, Rng};

/// Parses rows of 0/1 characters (1 = may attend).
fn rows(s: &[&str]) -> Vec<bool> {
    s.iter().flat_map(|r| r.chars().map(|c| c == '1')).collect()
}

#[test]
fn subsequent_chunk_mask_matches_hand_written_masks() {
    // WeNet's docstring example: subsequent_chunk_mask(4, 2).
    assert_eq!(subsequent_chunk_mask(4, 2, -1).unwrap(), rows(&["1100", "1100", "1111", "1111"]));
    // Size 5, chunk 2 (a partial last chunk), all left chunks.
    assert_eq!(subsequent_chunk_mask(5, 2, -1).unwrap(), rows(&["11000", "11000", "11110", "11110", "11111"]));
    // Size 7, chunk 3, one left chunk.
    assert_eq!(subsequent_chunk_mask(7, 3, 1).unwrap(), rows(&["1110000", "1110000", "1110000", "1111110", "1111110", "1111110", "0001111"]));
    // Size 6, chunk 2, no left chunk: block diagonal.
    assert_eq!(subsequent_chunk_mask(6, 2, 0).unwrap(), rows(&["110000", "110000", "001100", "001100", "000011", "000011"]));
    // Chunk 1 with all left chunks is the causal (lower-triangular) mask.
    assert_eq!(subsequent_chunk_mask(4, 1, -1).unwrap(), rows(&["1000", "1100", "1110", "1111"]));
    // A chunk at least the size is full context.
    assert_eq!(subsequent_chunk_mask(3, 5, -1).unwrap(), vec![true; 9]);
    // Size 8, chunk 2, two left chunks.
    assert_eq!(
        subsequent_chunk_mask(8, 2, 2).unwrap(),
        rows(&["11000000", "11000000", "11110000", "11110000", "11111100", "11111100", "00111111", "00111111"])
    );
    assert!(subsequent_chunk_mask(3, 0, -1).unwrap_err().to_string().contains("chunk size >= 1, found 0"));
}

#[test]
fn batch_mask_is_the_chunk_mask_and_the_padding_mask() {
    // Lengths 5 and 3 over 5 frames, chunk 2, all left: WeNet's masks & chunk_masks.
    let m = chunk_attention_mask(&[5, 3], 5, Some(Chunk { size: 2, num_left_chunks: -1 })).unwrap();
    assert_eq!(m.tensor().unwrap().dims(), &[2, 1, 5, 5]);
    let allowed: Vec<bool> = m.tensor().unwrap().to_vec::<u8>().unwrap().iter().map(|&x| x == 0).collect();
    let want = [rows(&["11000", "11000", "11110", "11110", "11111"]), rows(&["11000", "11000", "11100", "11100", "11100"])].concat();
    assert_eq!(allowed, want);
    // No chunk: the key padding mask alone (B, 1, 1, T).
    let m = chunk_attention_mask(&[5, 3], 5, None).unwrap();
    assert_eq!(m.tensor().unwrap().dims(), &[2, 1, 1, 5]);
    assert_eq!(m.tensor().unwrap().to_vec::<u8>().unwrap(), vec![0, 0, 0, 0, 0, 0, 0, 0, 1, 1]);
}

#[test]
fn chunk_choice_follows_wenet_rules() {
    let dynamic = ChunkConfig { use_dynamic_chunk: true, use_dynamic_left_chunk: false, static_chunk_size: 0, max_chunk_size: 25 };
    let mut r = Rng::new(1);
    // Decoding: < 0 full context, > 0 that chunk with the given left chunks.
    assert_eq!(choose_chunk(&dynamic, ChunkRequest { decoding_chunk_size: -1, num_decoding_left_chunks: 2 }, 40, &mut r), None);
    assert_eq!(
        choose_chunk(&dynamic, ChunkRequest { decoding_chunk_size: 16, num_decoding_left_chunks: 2 }, 40, &mut r),
        Some(Chunk { size: 16, num_left_chunks: 2 })
    );
    // Static: the static size with the decoding left chunks, whatever the request's size.
    let stat = ChunkConfig { use_dynamic_chunk: false, use_dynamic_left_chunk: false, static_chunk_size: 8, max_chunk_size: 25 };
    assert_eq!(choose_chunk(&stat, ChunkRequest::TRAIN, 40, &mut r), Some(Chunk { size: 8, num_left_chunks: -1 }));
    assert_eq!(
        choose_chunk(&stat, ChunkRequest { decoding_chunk_size: 4, num_decoding_left_chunks: 3 }, 40, &mut r),
        Some(Chunk { size: 8, num_left_chunks: 3 })
    );
    // Neither: full context.
    assert_eq!(choose_chunk(&ChunkConfig::default(), ChunkRequest::TRAIN, 40, &mut r), None);

    // The draw r in 1..max_len: full context above max_len/2, else r % 25 + 1.
    assert_eq!(dynamic_chunk_from_draws(100, 25, 51, None), None);
    assert_eq!(dynamic_chunk_from_draws(100, 25, 50, None), Some(Chunk { size: 1, num_left_chunks: -1 }));
    assert_eq!(dynamic_chunk_from_draws(100, 25, 24, None), Some(Chunk { size: 25, num_left_chunks: -1 }));
    assert_eq!(dynamic_chunk_from_draws(100, 25, 25, None), Some(Chunk { size: 1, num_left_chunks: -1 }));
    assert_eq!(dynamic_chunk_from_draws(100, 25, 3, None), Some(Chunk { size: 4, num_left_chunks: -1 }));
    // Odd max_len: 7 // 2 = 3, so r = 3 is still a chunk (size 4) and r = 4 is full.
    assert_eq!(dynamic_chunk_from_draws(7, 25, 3, None), Some(Chunk { size: 4, num_left_chunks: -1 }));
    assert_eq!(dynamic_chunk_from_draws(7, 25, 4, None), None);
    // Dynamic left chunks: uniform in 0..(max_len-1)//chunk; (100-1)//4 = 24.
    assert_eq!(dynamic_chunk_from_draws(100, 25, 3, Some(0.0)), Some(Chunk { size: 4, num_left_chunks: 0 }));
    assert_eq!(dynamic_chunk_from_draws(100, 25, 3, Some(0.999_999)), Some(Chunk { size: 4, num_left_chunks: 23 }));
    assert_eq!(dynamic_chunk_from_draws(100, 25, 3, Some(0.5)), Some(Chunk { size: 4, num_left_chunks: 12 }));
    // A conv2d6 encoder draws up to 100 / 6 = 16 frames.
    assert_eq!(dynamic_chunk_from_draws(100, 16, 16, None), Some(Chunk { size: 1, num_left_chunks: -1 }));
}

#[test]
fn dynamic_draws_cover_full_context_about_half_the_time_and_chunks_1_to_25() {
    let cfg = ChunkConfig { use_dynamic_chunk: true, use_dynamic_left_chunk: true, static_chunk_size: 0, max_chunk_size: 25 };
    let mut r = Rng::new(7);
    let (n, max_len) = (20_000, 200);
    let mut full = 0;
    let mut seen = [0usize; 26];
    for _ in 0..n {
        match choose_chunk(&cfg, ChunkRequest::TRAIN, max_len, &mut r) {
            None => full += 1,
            Some(c) => {
                assert!((1..=25).contains(&c.size), "{c:?}");
                assert!(c.num_left_chunks >= 0 && (c.num_left_chunks as usize) < (max_len - 1) / c.size, "{c:?}");
                seen[c.size] += 1;
            }
        }
    }
    // r uniform in 1..200: full when r > 100, so 99 of the 199 values.
    let p = full as f64 / n as f64;
    let want = 99.0 / 199.0;
    // Binomial standard deviation is about 0.0035; allow 5 of them.
    assert!((p - want).abs() < 0.018, "full-context fraction {p}, expected {want}");
    assert!(seen[1..].iter().all(|&c| c > 0), "every chunk size 1..=25 is drawn: {seen:?}");
}

#[test]
fn the_batch_draw_uses_the_default_generator_reproducibly() {
    let cfg = ChunkConfig { use_dynamic_chunk: true, use_dynamic_left_chunk: false, static_chunk_size: 0, max_chunk_size: 25 };
    rng::manual_seed(123);
    let a: Vec<_> = (0..20).map(|_| add_optional_chunk_mask(&cfg, ChunkRequest::TRAIN, &[30, 20], 30).unwrap().0).collect();
    rng::manual_seed(123);
    let b: Vec<_> = (0..20).map(|_| add_optional_chunk_mask(&cfg, ChunkRequest::TRAIN, &[30, 20], 30).unwrap().0).collect();
    assert_eq!(a, b);
    assert!(a.iter().any(Option::is_none) && a.iter().any(Option::is_some), "{a:?}");
}

/// Every mask kind the model builds carries the fused kernels' rule for the
/// same mask (so the fused path reads no tensor): attention through the
/// rule equals attention through the tensor (the CPU reference of both) for
/// key padding, the decoder's causal padding and WeNet's chunk masks (all,
/// some and no left chunks, a partial last chunk, a sequence of length 1),
/// on random q, k, v where one changed mask element would move the output.
#[test]
fn every_mask_kinds_rule_is_its_tensor() {
    use asrforge::nn::AttentionMask;
    use asrforge::ops::{self, FlashMask};
    use asrforge::tensor::{DType, Device, Tensor};
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut rng = Rng::new(seed);
    let (b, t, h, d) = (3, 11, 2, 4);
    let lens = [11usize, 6, 1];
    let mut kinds: Vec<(String, AttentionMask)> = vec![
        ("key padding".into(), AttentionMask::key_padding(&lens, t).unwrap()),
        ("causal padding".into(), AttentionMask::causal_padding(&lens, t).unwrap()),
    ];
    for (size, left) in [(4, -1), (4, 1), (3, 0), (1, -1), (20, -1)] {
        kinds.push((format!("chunk {size} left {left}"), chunk_attention_mask(&lens, t, Some(Chunk { size, num_left_chunks: left })).unwrap()));
    }
    let mut x = || Tensor::randn([b, t, h, d], 0.0, 1.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
    let (q, k, v) = (x(), x(), x());
    for (what, m) in &kinds {
        let rule = m.rule().cloned().unwrap_or_else(|| panic!("{what}: a mask kind of the model without a rule"));
        assert!(rule.mask.is_none(), "{what}: the rule carries no tensor");
        let by_rule = ops::flash_attention(&q, &k, &v, None, &rule, 0.0, false).unwrap().to_f64_vec().unwrap();
        let dense = FlashMask { mask: Some(m.tensor().unwrap()), ..Default::default() };
        let by_tensor = ops::flash_attention(&q, &k, &v, None, &dense, 0.0, false).unwrap().to_f64_vec().unwrap();
        for (i, (a, w)) in by_rule.iter().zip(&by_tensor).enumerate() {
            assert!(!a.is_nan() && (a - w).abs() <= 1e-12 * w.abs().max(1.0), "{what}: element {i}: {a} by the rule vs {w} by the tensor (seed {seed})");
        }
        // The fused path's view of the mask is the rule on the CPU.
        let flash = m.flash_on(&Device::Cpu).unwrap();
        assert!(flash.mask.is_none() && flash.key_lengths == rule.key_lengths && flash.chunk == rule.chunk && flash.causal == rule.causal, "{what}");
    }
    // A mask given as a tensor has no rule: the fused path reads the tensor.
    let given = AttentionMask::new(kinds[0].1.tensor().unwrap());
    assert!(given.rule().is_none() && given.flash_on(&Device::Cpu).unwrap().mask.is_some());
}
