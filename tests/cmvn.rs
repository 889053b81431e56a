//! Global CMVN from WeNet's JSON statistics, inside the model.

use asrforge::models::{config::ModelConfig, AsrModel, GlobalCmvn};
use asrforge::nn::Module;
use asrforge::tensor::{DType, Device, Rng, Tensor};

#[test]
fn json_stats_give_mean_and_inverse_std() {
    let dir = std::env::temp_dir().join(format!("asrforge-cmvn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("global_cmvn");
    // Two features over 4 frames: sums 8 and −4, sums of squares 32 and 20.
    std::fs::write(&path, r#"{"mean_stat": [8.0, -4.0], "var_stat": [32.0, 20.0], "frame_num": 4}"#).unwrap();
    let c = GlobalCmvn::from_json_file(path.to_str().unwrap(), DType::F64).unwrap();
    // mean = (2, −1); var = (32/4 − 4, 20/4 − 1) = (4, 4); istd = 1/2.
    assert_eq!(c.mean.to_f64_vec().unwrap(), vec![2.0, -1.0]);
    assert_eq!(c.istd.to_f64_vec().unwrap(), vec![0.5, 0.5]);
    let x = Tensor::from_vec(vec![4.0f64, 1.0], [1, 1, 2], &Device::Cpu).unwrap();
    assert_eq!(c.forward(&x).unwrap().to_f64_vec().unwrap(), vec![1.0, 1.0]);

    let yaml = format!(
        "input_dim: 2\noutput_dim: 5\ncmvn: global_cmvn\ncmvn_conf:\n  cmvn_file: {}\n  is_json_cmvn: true\nencoder_conf:\n  output_size: 4\n  attention_heads: 1\n  linear_units: 4\n  num_blocks: 1\n  input_layer: linear\ndecoder: transformer\ndecoder_conf:\n  attention_heads: 1\n  linear_units: 4\n  num_blocks: 1\n",
        path.display()
    );
    let (cfg, _) = ModelConfig::from_yaml(&serde_yaml_ng::from_str(&yaml).unwrap()).unwrap();
    let m = AsrModel::new(&cfg, DType::F32, &mut Rng::new(0)).unwrap();
    let sd = m.state_dict();
    let istd = sd.iter().find(|e| e.name == "encoder.global_cmvn.istd").unwrap();
    assert_eq!(istd.tensor.to_vec::<f32>().unwrap(), vec![0.5, 0.5]);
    assert!(sd.iter().any(|e| e.name == "encoder.embed.out.1.weight"), "the linear input layer has its LayerNorm at out.1");

    std::fs::write(&path, r#"{"mean_stat": [1.0], "var_stat": [1.0, 2.0], "frame_num": 4}"#).unwrap();
    let e = AsrModel::new(&cfg, DType::F32, &mut Rng::new(0)).unwrap_err().to_string();
    assert!(e.contains("global_cmvn") && e.contains("one length"), "{e}");
    std::fs::remove_file(&path).unwrap();
    let e = AsrModel::new(&cfg, DType::F32, &mut Rng::new(0)).unwrap_err().to_string();
    assert!(e.contains(path.to_str().unwrap()), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
