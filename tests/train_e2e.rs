//! End to end on the CPU: a tiny model overfits a handful of synthetic
//! utterances, with checkpoints, the resolved config and TensorBoard scalars.

mod train_common;

use asrforge::train::run_train;
use asrforge::train::tensorboard::read_scalars;

#[test]
fn tiny_model_overfits_four_utterances() {
    let dir = train_common::tmpdir("train-e2e");
    let mut args = train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 4, 60, ""));
    args.override_config = vec!["max_epoch 120".into(), "optim_conf.lr 0.01".into()];
    let t0 = std::time::Instant::now();
    let exec = run_train(&args).expect("training runs");
    let secs = t0.elapsed().as_secs_f64();
    let h = &exec.history;
    assert_eq!(h.len(), 120, "one step per epoch of one batch");
    let (first, last) = (h[0].loss, h[h.len() - 1].loss);
    eprintln!("loss {first} -> {last} in {secs:.1} s");
    assert!(last * 10.0 < first, "loss fell only from {first} to {last}");
    assert_eq!(exec.skipped_steps, 0);
    for f in ["init.safetensors", "init.yaml", "epoch_0.safetensors", "epoch_119.yaml", "epoch_119.state.safetensors", "train.yaml"] {
        assert!(args.model_dir.join(f).exists(), "{f} written");
    }
    let saved: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(args.model_dir.join("train.yaml")).unwrap()).unwrap();
    assert_eq!(saved["input_dim"].as_u64(), Some(20));
    assert_eq!(saved["output_dim"].as_u64(), Some(9));
    let infos: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(args.model_dir.join("epoch_119.yaml")).unwrap()).unwrap();
    assert_eq!(infos["epoch"].as_u64(), Some(119));
    assert_eq!(infos["step"].as_u64(), Some(120));
    assert!(infos["cv_loss"].as_f64().unwrap() < first / 5.0);
    assert!(args.tensorboard_dir.join("exp").is_dir(), "the run goes to tensorboard_dir/<basename of model_dir>");
    // final.safetensors (WeNet's final.pt) holds the last epoch's weights, byte for byte.
    let tensors = |f: &str| {
        let bytes = std::fs::read(args.model_dir.join(f)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut v: Vec<(String, Vec<u8>)> = st.tensors().into_iter().map(|(k, t)| (k, t.data().to_vec())).collect();
        v.sort();
        v
    };
    assert_eq!(tensors("final.safetensors"), tensors("epoch_119.safetensors"));
    let fin: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(args.model_dir.join("final.yaml")).unwrap()).unwrap();
    assert_eq!((fin["tag"].as_str(), fin["step"].as_u64()), (Some("final"), Some(120)));
    let scalars = read_scalars(train_common::event_file(&args.tensorboard_dir)).unwrap();
    // WeNet's tag names, in tensorboard_dir/<basename of model_dir>.
    for tag in ["train/train_loss", "train/loss_ctc", "train/loss_att", "train/th_accuracy", "train/grad_norm", "train/lr_0", "train/loss_scale"] {
        assert_eq!(scalars.iter().filter(|(t, _, _)| t == tag).count(), 120, "{tag} per step");
    }
    for tag in ["epoch/cv_loss", "epoch/cv_loss_att", "epoch/cv_acc", "epoch/lr_0"] {
        assert_eq!(scalars.iter().filter(|(t, _, _)| t == tag).count(), 120, "{tag} per epoch");
    }
    let loss1 = scalars.iter().find(|(t, s, _)| t == "train/train_loss" && *s == 1).unwrap().2;
    assert_eq!(loss1, first as f32);
    // Train accuracy is the decoder's token accuracy: a fraction, rising as the model overfits.
    let acc: Vec<f32> = scalars.iter().filter(|(t, _, _)| t == "train/th_accuracy").map(|x| x.2).collect();
    assert!(acc.iter().all(|a| (0.0..=1.0).contains(a)) && acc[acc.len() - 1] > acc[0] + 0.3, "{:?} .. {:?}", acc[0], acc[acc.len() - 1]);

    // The first loss against the loss of a model that predicts every symbol
    // with probability 1/V, computed here from the batch alone: per
    // utterance, attention cross-entropy (L+1)·ln V over its tokens and
    // <eos> (lsm_weight 0), CTC T'·ln V − ln N with T' = ((T−1)/2−1)/2 the
    // frames left by conv2d subsampling (WeNet's Conv2dSubsampling4) and N
    // the number of CTC alignments of the label in T' frames; mixed with
    // ctc_weight 0.3 and divided by the batch (length_normalized_loss false).
    let (train, _) = asrforge::train::init_dataset_and_dataloader(&args, &exec.cfg, &asrforge::train::DistInfo::single()).unwrap();
    let b = train.resume(0, 0).next().expect("the first batch");
    assert_eq!(b.len(), 4, "one batch of the four utterances");
    let ln_v = 9f64.ln();
    let lmax = b.target.dims()[1];
    let tg = b.target.to_vec::<i64>().unwrap();
    let (mut ctc, mut att) = (0.0, 0.0);
    for i in 0..b.len() {
        let t = ((b.feats_lengths[i] - 1) / 2 - 1) / 2;
        let label = &tg[i * lmax..i * lmax + b.target_lengths[i]];
        ctc += t as f64 * ln_v - ctc_alignments(label, t).ln();
        att += (label.len() + 1) as f64 * ln_v;
    }
    let uniform = (0.3 * ctc + 0.7 * att) / b.len() as f64;
    eprintln!("first loss {first}, uniform-prediction loss {uniform} ({:+.2}%)", 100.0 * (first - uniform) / uniform);
    // A freshly initialised model is close to uniform but not exactly: any
    // spread of its logits raises the expected cross-entropy (by about
    // var/2 per symbol), never lowers it on average. The bound leaves that
    // room while a loss normalised by tokens instead of the batch (÷3.5 on
    // the attention part here) or summed instead of averaged (×4) is far out.
    assert!(first > 0.95 * uniform && first < 1.25 * uniform, "first loss {first} vs uniform-prediction loss {uniform}");
}

/// The number of CTC alignments (paths through blank-interleaved `label`
/// with the usual skip rule) of `label` in `t` frames.
fn ctc_alignments(label: &[i64], t: usize) -> f64 {
    let ext: Vec<i64> = std::iter::once(-1).chain(label.iter().flat_map(|&l| [l, -1])).collect();
    let s = ext.len();
    let mut a = vec![0.0f64; s];
    a[0] = 1.0;
    if s > 1 {
        a[1] = 1.0;
    }
    for _ in 1..t {
        let prev = a.clone();
        for j in 0..s {
            let mut x = prev[j];
            if j >= 1 {
                x += prev[j - 1];
            }
            if j >= 2 && ext[j] != -1 && ext[j] != ext[j - 2] {
                x += prev[j - 2];
            }
            a[j] = x;
        }
    }
    a[s - 1] + if s > 1 { a[s - 2] } else { 0.0 }
}
