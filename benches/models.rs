//! Forward + backward on the CPU: one AISHELL-sized conformer block
//! (d = 256, 4 heads, 2048 units, kernel 15) and the whole tiny model of
//! conf/tiny.yaml.

use asrforge::autograd::backward;
use asrforge::models::config::{EncoderConfig, EncoderType, ModelConfig};
use asrforge::models::encoder::frame_pad_mask;
use asrforge::models::encoder_layer::EncoderLayer;
use asrforge::models::AsrModel;
use asrforge::nn::{AttentionMask, Module};
use asrforge::ops;
use asrforge::tensor::{DType, Device, Rng, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};

fn conformer_layer(c: &mut Criterion) {
    let (d, b, t) = (256, 4, 64);
    let f32_ = DType::F32;
    let mut rng = Rng::new(0);
    let conf = EncoderConfig {
        output_size: d,
        attention_heads: 4,
        linear_units: 2048,
        cnn_module_kernel: 15,
        ..EncoderConfig::defaults(EncoderType::Conformer).unwrap()
    };
    let layer = EncoderLayer::new(&conf, true, f32_, &mut rng).unwrap();
    let x = Tensor::randn([b, t, d], 0.0, 1.0, f32_, &mut rng, &Device::Cpu).unwrap().requires_grad_();
    let pos = Tensor::randn([1, t, d], 0.0, 1.0, f32_, &mut rng, &Device::Cpu).unwrap();
    let lens = [64, 60, 50, 40];
    let mask = AttentionMask::key_padding(&lens, t).unwrap();
    let pad = frame_pad_mask(&lens, t).unwrap();
    c.bench_function("conformer_layer_fwd_bwd_d256_b4_t64", |bch| {
        bch.iter(|| {
            let y = layer.forward(&x, Some(&mask), &pos, Some(&pad)).unwrap();
            backward(&ops::mean_all(&y).unwrap()).unwrap();
            layer.zero_grad();
        })
    });
}

fn tiny_model(c: &mut Criterion) {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml")).unwrap();
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let model = AsrModel::new(&cfg, DType::F32, &mut Rng::new(0)).unwrap();
    let mut rng = Rng::new(2);
    let (b, t) = (4, 200);
    let feats = Tensor::randn([b, t, 80], 0.0, 1.0, DType::F32, &mut rng, &Device::Cpu).unwrap();
    let fl = [200, 180, 160, 120];
    let tg: Vec<i64> = (0..b * 10).map(|i| 1 + (i as i64 % 60)).collect();
    let target = Tensor::from_vec(tg, [b, 10], &Device::Cpu).unwrap();
    let tl = [10, 9, 8, 6];
    c.bench_function("tiny_model_fwd_bwd_b4_t200", |bch| {
        bch.iter(|| {
            let l = model.forward(&feats, &fl, &target, &tl).unwrap();
            backward(&l.loss).unwrap();
            model.zero_grad();
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_secs(1)).measurement_time(std::time::Duration::from_secs(5));
    targets = conformer_layer, tiny_model
}
criterion_main!(benches);
