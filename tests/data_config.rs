//! Reading dataset_conf from a WeNet train.yaml.

use asrforge::data::config::DataConfig;

const WENET_YAML: &str = r#"
encoder: conformer
encoder_conf:
    output_size: 256
    attention_heads: 4
dataset_conf:
    filter_conf:
        max_length: 40960
        min_length: 0
        token_max_length: 200
        token_min_length: 1
    resample_conf:
        resample_rate: 16000
    speed_perturb: true
    fbank_conf:
        num_mel_bins: 80
        frame_shift: 10
        frame_length: 25
        dither: 1.0
    spec_aug: true
    spec_aug_conf:
        num_t_mask: 2
        num_f_mask: 2
        max_t: 50
        max_f: 10
    shuffle: true
    shuffle_conf:
        shuffle_size: 1500
    sort: true
    sort_conf:
        sort_size: 500  # sort_size should be less than shuffle_size
    batch_conf:
        batch_type: 'dynamic'
        max_frames_in_batch: 12000
tokenizer: char
tokenizer_conf:
  symbol_table_path: 'data/dict/lang_char.txt'
  split_with_space: false
grad_clip: 5
max_epoch: 240
"#;

#[test]
fn wenet_train_yaml_is_read() {
    let c = DataConfig::from_yaml_str(WENET_YAML, "train.yaml").unwrap();
    let d = &c.dataset_conf;
    assert_eq!(d.filter_conf.max_length, 40960.0);
    assert_eq!(d.filter_conf.min_length, 0.0);
    assert_eq!(d.filter_conf.max_output_input_ratio, 1.0, "WeNet's default");
    assert_eq!(d.fbank_conf.num_mel_bins, 80);
    assert_eq!(d.fbank_conf.dither, 1.0);
    assert!(d.speed_perturb && d.spec_aug && !d.spec_sub);
    assert_eq!(d.spec_aug_conf.max_t, 50);
    assert_eq!(d.shuffle_conf.shuffle_size, 1500);
    assert_eq!(d.sort_conf.sort_size, 500);
    assert_eq!(d.batch_conf.batch_type, "dynamic");
    assert_eq!(d.batch_conf.max_frames_in_batch, 12000);
    assert_eq!(c.tokenizer.as_deref(), Some("char"));
    assert_eq!(c.tokenizer_conf.symbol_table_path.as_deref(), Some("data/dict/lang_char.txt"));
    let cv = d.for_cv();
    assert!(!cv.speed_perturb && !cv.spec_aug && !cv.shuffle && !cv.list_shuffle);
    assert_eq!(cv.fbank_conf.dither, 0.0);
    assert!(cv.sort, "cv keeps sorting");
}

#[test]
fn bad_values_name_the_field() {
    let e = DataConfig::from_yaml_str("dataset_conf:\n  batch_conf:\n    batch_size: 0\n", "t.yaml").unwrap_err().to_string();
    assert!(e.contains("t.yaml") && e.contains("batch_size") && e.contains("found 0"), "{e}");
    let e = DataConfig::from_yaml_str("dataset_conf:\n  feats_type: mfcc\n", "t.yaml").unwrap_err().to_string();
    assert!(e.contains("`mfcc`"), "{e}");
    let e = DataConfig::from_yaml_str("dataset_conf: [1, 2", "t.yaml").unwrap_err().to_string();
    assert!(e.contains("invalid YAML"), "{e}");
}
