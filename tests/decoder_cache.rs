//! The decoder's per-layer cache: feeding tokens one step at a time gives the
//! same next-token scores as recomputing the whole prefix, for pre- and
//! post-norm decoders, for the right-to-left decoder of a BiTransformer, per
//! row over different encoder outputs, and after the rows are reordered.

use asrforge::autograd::no_grad;
use asrforge::models::{AsrModel, ModelConfig, TransformerDecoder};
use asrforge::nn::Module;
use asrforge::ops;
use asrforge::tensor::{DType, Rng};
use asrforge::{Device, Tensor};

fn model(edit: impl FnOnce(&mut serde_yaml_ng::Value), seed: u64) -> AsrModel {
    let mut root: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml")).unwrap()).unwrap();
    edit(&mut root);
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let mut m = AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(seed)).unwrap();
    m.train(false);
    m
}

fn set(root: &mut serde_yaml_ng::Value, section: &str, key: &str, v: serde_yaml_ng::Value) {
    root[section][key] = v;
}

/// Log-probabilities (rows × V) of the token after each full prefix, recomputed from scratch.
fn full(dec: &TransformerDecoder, mem: &Tensor, lens: &[usize], prefixes: &[Vec<i64>]) -> Vec<f64> {
    let (n, l) = (prefixes.len(), prefixes[0].len());
    let ys = Tensor::from_vec(prefixes.concat(), [n, l], &Device::Cpu).unwrap();
    let logits = dec.forward(mem, lens, &ys, &vec![l; n]).unwrap();
    ops::log_softmax(&ops::narrow(&logits, 1, l - 1, 1).unwrap()).unwrap().to_f64_vec().unwrap()
}

fn assert_close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    // f32 activations: the cached and the recomputed paths round differently.
    assert!(worst < 2e-5, "{what}: max |cached - full| = {worst}");
}

/// Steps `steps` random tokens through the cache and checks every step against recomputation.
fn check_decoder(dec: &TransformerDecoder, seed: u64) {
    let mut rng = Rng::new(seed);
    let (n, t, d, vocab) = (3, 11, 64, dec.output_layer.out_features());
    let mem = Tensor::randn([n, t, d], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap();
    // Different valid lengths per row exercise the memory mask.
    let lens = [11, 7, 4];
    let mut prefixes: Vec<Vec<i64>> = (0..n).map(|_| vec![(vocab - 1) as i64]).collect();
    let mut cache = no_grad(|| dec.init_cache(&mem, &lens)).unwrap();
    let mut draw = 17u64.wrapping_add(seed);
    for step in 0..6 {
        let last: Vec<i64> = prefixes.iter().map(|p| *p.last().unwrap()).collect();
        let got = no_grad(|| ops::log_softmax(&dec.forward_step(&last, &mut cache)?)).unwrap().to_f64_vec().unwrap();
        let want = no_grad(|| Ok::<_, asrforge::Error>(full(dec, &mem, &lens, &prefixes))).unwrap();
        assert_close(&got, &want, &format!("step {step}"));
        assert_eq!(cache.len(), step + 1);
        for p in prefixes.iter_mut() {
            draw = draw.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            p.push(((draw >> 33) % vocab as u64) as i64);
        }
    }
    // Reordered rows (a beam keeping its survivors' parents) continue as their prefixes would.
    let order = [2usize, 0, 0, 1];
    let cache2 = cache.select(&order).unwrap();
    let mut cache2 = cache2;
    let prefixes2: Vec<Vec<i64>> = order.iter().map(|&r| prefixes[r].clone()).collect();
    let mem2 = ops::index_select(&mem, 0, &Tensor::from_vec(order.iter().map(|&r| r as i64).collect::<Vec<_>>(), [4], &Device::Cpu).unwrap()).unwrap();
    let lens2: Vec<usize> = order.iter().map(|&r| lens[r]).collect();
    let last: Vec<i64> = prefixes2.iter().map(|p| *p.last().unwrap()).collect();
    let got = no_grad(|| ops::log_softmax(&dec.forward_step(&last, &mut cache2)?)).unwrap().to_f64_vec().unwrap();
    let want = no_grad(|| Ok::<_, asrforge::Error>(full(dec, &mem2, &lens2, &prefixes2))).unwrap();
    assert_close(&got, &want, "after select");
    assert!(cache.select(&[3]).unwrap_err().to_string().contains("below 3"));
    assert!(no_grad(|| dec.forward_step(&[1, 2], &mut cache)).unwrap_err().to_string().contains("one per cache row"));
}

#[test]
fn cached_steps_equal_full_prefix_recomputation_pre_norm() {
    let m = model(|_| {}, 5);
    check_decoder(m.decoder.left(), 1);
}

#[test]
fn cached_steps_equal_full_prefix_recomputation_post_norm() {
    let m = model(|r| set(r, "decoder_conf", "normalize_before", false.into()), 6);
    check_decoder(m.decoder.left(), 2);
}

#[test]
fn right_to_left_decoder_uses_the_same_cache() {
    let m = model(
        |r| {
            r["decoder"] = "bitransformer".into();
            set(r, "decoder_conf", "r_num_blocks", 1.into());
        },
        7,
    );
    let right = m.decoder.right().expect("a bidirectional decoder");
    assert_eq!(right.decoders.len(), 1);
    check_decoder(right, 3);
    check_decoder(m.decoder.left(), 4);
}

/// The three ways the decoder scores a transcript agree: the cached steps of
/// beam search, the full-prefix recomputation of attention rescoring
/// (`decoder_logits`), and the teacher-forced training forward (the
/// attention loss of `AsrModel::forward` with no label smoothing, which is
/// `−Σ log p(y_j | <sos> y_<j) − log p(<eos> | <sos> y)` summed over a padded
/// batch and divided by its size).
#[test]
fn cached_scores_equal_rescoring_and_the_training_forward() {
    let mut m = model(|_| {}, 9);
    m.ctc_weight = 0.0;
    m.lsm_weight = 0.0;
    m.length_normalized_loss = false;
    let mut rng = Rng::new(21);
    let (t, f) = (60, 80);
    let feats = Tensor::randn([2, t, f], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap();
    // Different feature lengths and transcript lengths: both paddings are exercised.
    let feats_lens = [60usize, 41];
    let hyps: [Vec<i64>; 2] = [vec![5, 9, 9, 2, 40, 17, 3], vec![12, 7, 33]];
    let mut target = vec![-1i64; 2 * 7];
    for (b, h) in hyps.iter().enumerate() {
        target[b * 7..b * 7 + h.len()].copy_from_slice(h);
    }
    let target = Tensor::from_vec(target, [2, 7], &Device::Cpu).unwrap();
    let (loss, enc, enc_lens) = no_grad(|| {
        let l = m.forward(&feats, &feats_lens, &target, &[7, 3])?;
        let (e, el) = m.encode(&feats, &feats_lens)?;
        Ok::<_, asrforge::Error>((l.loss.to_f64_vec()?[0], e, el))
    })
    .unwrap();
    let eos = m.eos;
    let mut total = 0.0;
    for (b, h) in hyps.iter().enumerate() {
        let e = ops::narrow(&ops::narrow(&enc, 0, b, 1).unwrap(), 1, 0, enc_lens[b]).unwrap();
        // Cached steps, one position at a time.
        let dec = m.decoder.left();
        let mut cache = no_grad(|| dec.init_cache(&e, &[enc_lens[b]])).unwrap();
        let mut cached = 0.0;
        let mut fed = m.sos as i64;
        for &want in h.iter().chain([&(eos as i64)]) {
            let lp = no_grad(|| ops::log_softmax(&dec.forward_step(&[fed], &mut cache)?)).unwrap().to_f64_vec().unwrap();
            cached += lp[want as usize];
            fed = want;
        }
        // Full prefix, as attention rescoring computes it.
        let (logits, _) = no_grad(|| m.decoder_logits(&e, &[enc_lens[b]], std::slice::from_ref(h))).unwrap();
        let v = logits.dims()[2];
        let rows = no_grad(|| ops::log_softmax(&logits)).unwrap().to_f64_vec().unwrap();
        let toks: Vec<usize> = h.iter().map(|&k| k as usize).collect();
        let rescored = asrforge::decode::attention::sequence_score(&rows, v, &toks, eos, false).unwrap();
        assert!((cached - rescored).abs() < 1e-4, "row {b}: cached {cached} vs rescoring {rescored}");
        assert!(cached < 0.0 && cached.is_finite());
        total += rescored;
    }
    let from_training = -loss * 2.0;
    assert!((total - from_training).abs() < 1e-4 * total.abs().max(1.0), "Σ rescoring scores {total} vs −loss·B {from_training}");
}
