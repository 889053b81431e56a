//! Helpers shared by the training tests: a tiny corpus of synthetic WAVs, its
//! units, a tiny train.yaml, and the arguments of a run over them.
#![allow(dead_code)]

#[path = "../data_common/mod.rs"]
mod data_common;

use asrforge::train::TrainArgs;
use std::path::{Path, PathBuf};

#[allow(unused_imports)]
pub use data_common::{tmpdir, TempDir};

/// A tiny conformer with every training key; `dropout` for all its dropouts.
pub fn tiny_yaml(dropout: f64, batch_size: usize, max_epoch: u64, extra: &str) -> String {
    format!(
        r#"encoder: conformer
encoder_conf:
    output_size: 32
    attention_heads: 2
    linear_units: 64
    num_blocks: 1
    dropout_rate: {dropout}
    positional_dropout_rate: {dropout}
    attention_dropout_rate: 0.0
    input_layer: conv2d
    normalize_before: true
    cnn_module_kernel: 3
    cnn_module_norm: layer_norm
    use_cnn_module: true
    activation_type: swish
    pos_enc_layer_type: rel_pos
    selfattention_layer_type: rel_selfattn
decoder: transformer
decoder_conf:
    attention_heads: 2
    linear_units: 64
    num_blocks: 1
    dropout_rate: {dropout}
    positional_dropout_rate: {dropout}
    self_attention_dropout_rate: 0.0
    src_attention_dropout_rate: 0.0
model_conf:
    ctc_weight: 0.3
    lsm_weight: 0.0
    length_normalized_loss: false
dataset_conf:
    filter_conf:
        max_length: 40960
        min_length: 0
        token_max_length: 200
        token_min_length: 1
        max_output_input_ratio: 1.0
    resample_conf:
        resample_rate: 8000
    speed_perturb: false
    fbank_conf:
        num_mel_bins: 20
        frame_shift: 10
        frame_length: 25
        dither: 0.0
    spec_aug: false
    shuffle: true
    shuffle_conf:
        shuffle_size: 10
    sort: true
    sort_conf:
        sort_size: 5
    batch_conf:
        batch_type: static
        batch_size: {batch_size}
tokenizer: char
grad_clip: 5
accum_grad: 1
max_epoch: {max_epoch}
log_interval: 1000
optim: adam
optim_conf:
    lr: 0.005
scheduler: warmuplr
scheduler_conf:
    warmup_steps: 10
{extra}"#
    )
}

/// Writes `n` utterances, `units.txt`, the train/cv lists and `train.yaml` into `dir`.
pub fn setup(dir: &Path, n: usize, yaml: &str) -> TrainArgs {
    let lines = data_common::make_corpus(dir, n, 8000);
    std::fs::write(dir.join("data.list"), lines.join("\n") + "\n").expect("write list");
    std::fs::write(dir.join("units.txt"), data_common::UNITS).expect("write units");
    std::fs::write(dir.join("train.yaml"), yaml).expect("write yaml");
    args(dir, "exp")
}

/// The arguments of a run over the corpus in `dir`, writing into `dir/{sub}`.
pub fn args(dir: &Path, sub: &str) -> TrainArgs {
    TrainArgs {
        config: dir.join("train.yaml"),
        model_dir: dir.join(sub),
        tensorboard_dir: dir.join(sub).join("tb"),
        train_data: dir.join("data.list"),
        cv_data: dir.join("data.list"),
        symbol_table: Some(dir.join("units.txt")),
        enc_init_mods: vec!["encoder.".into()],
        data_type: "raw".into(),
        num_workers: 1,
        prefetch: 4,
        dist_backend: "gloo".into(),
        train_engine: "torch_ddp".into(),
        deepspeed_save_states: "model_only".into(),
        timeout: 30,
        device: "cpu".into(),
        seed: 7,
        ..Default::default()
    }
}

/// The single event file under a TensorBoard dir.
/// The one event file of a run: TensorBoard runs live in `tensorboard_dir/<basename of model_dir>`
/// (WeNet's layout), so `dir` must hold exactly one run folder.
pub fn event_file(dir: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(dir).expect("tb dir").map(|e| e.expect("entry").path()).collect();
    assert!(runs.len() == 1 && runs[0].is_dir(), "one run folder in {}: {runs:?}", dir.display());
    let dir = runs[0].clone();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).expect("tb dir").map(|e| e.expect("entry").path()).collect();
    files.sort();
    assert_eq!(files.len(), 1, "one event file in {}", dir.display());
    files.remove(0)
}
