//! The norm fusion across blocks (`residual::chain_into`): in a stack whose
//! blocks end without a norm of their own (a transformer encoder, the
//! decoders) each block's last residual add goes into the next block's
//! first norm (or the stack's final norm). The loss and every gradient
//! equal the composition's in f64, with dropout on (the same masks) and
//! with activation checkpointing. The fusion switch is process-wide, so
//! this is the file's only test.

mod common;

use asrforge::autograd::backward;
use asrforge::models::{config::ModelConfig, AsrModel};
use asrforge::nn::Module;
use asrforge::ops::fusion::{self, Fusion};
use asrforge::tensor::{DType, Device, Rng, Tensor};
use common::TINY_F64_YAML;

#[test]
fn norm_fusion_across_blocks_gives_the_compositions_loss_and_gradients() {
    let yaml = TINY_F64_YAML
        .replace("encoder: conformer", "encoder: transformer")
        .replace("  num_blocks: 2\n  dropout_rate: 0.0", "  num_blocks: 3\n  dropout_rate: 0.1")
        .replace(
            "  pos_enc_layer_type: rel_pos\n  selfattention_layer_type: rel_selfattn\n",
            "  pos_enc_layer_type: abs_pos\n  selfattention_layer_type: selfattn\n",
        );
    for ck in [false, true] {
        let yaml = if ck {
            yaml.replace("  num_blocks: 3\n", "  num_blocks: 3\n  gradient_checkpointing: true\n")
                .replace("  r_num_blocks: 1\n", "  r_num_blocks: 1\n  gradient_checkpointing: true\n")
        } else {
            yaml.clone()
        };
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        let (cfg, warnings) = ModelConfig::from_yaml(&v).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let m = AsrModel::with_cmvn(&cfg, None, DType::F64, &mut Rng::new(3)).unwrap();
        assert_eq!(m.encoder.gradient_checkpointing, ck);
        let mut rng = Rng::new(common::fresh_seed());
        let feats = Tensor::randn([2, 23, 9], 0.0, 1.0, DType::F64, &mut rng, &Device::Cpu).unwrap();
        let target = Tensor::from_vec(vec![1i64, 2, 3, 4, -1, -1], [2, 3], &Device::Cpu).unwrap();
        let run = |on: bool| {
            fusion::set_enabled(if on { &[Fusion::Norm] } else { &[] });
            asrforge::tensor::rng::manual_seed(7);
            m.zero_grad();
            let loss = m.forward(&feats, &[23, 17], &target, &[3, 1]).unwrap().loss;
            backward(&loss).unwrap();
            fusion::set_enabled(&[]);
            let g: Vec<Vec<f64>> = m.parameters().iter().map(|p| p.grad().map(|g| g.to_f64_vec().unwrap()).unwrap_or_default()).collect();
            (loss.to_scalar().unwrap(), g)
        };
        let ((lc, gc), (lf, gf)) = (run(false), run(true));
        assert!((lc - lf).abs() <= 1e-12 * lc.abs(), "checkpointing {ck}: loss {lf} fused vs {lc} composed");
        let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
        for ((name, a), b) in names.iter().zip(&gf).zip(&gc) {
            assert_eq!(a.len(), b.len(), "{name}");
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= 1e-10 * y.abs().max(1e-3), "checkpointing {ck}: {name}: {x} fused vs {y} composed");
            }
        }
    }
}
