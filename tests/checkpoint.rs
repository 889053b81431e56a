//! Safetensors checkpoints: a bitwise round trip, and errors that name the
//! missing key, the extra key, the wrong shape or the corrupt header.

use asrforge::models::checkpoint::{infos_path, read_infos};
use asrforge::models::{config::ModelConfig, load_checkpoint, load_prefixes, save_checkpoint, AsrModel};
use asrforge::nn::Module;
use asrforge::tensor::{DType, Device, Rng, Tensor};
use std::path::PathBuf;

fn tiny(seed: u64) -> AsrModel {
    let root: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml")).unwrap()).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    AsrModel::new(&cfg, DType::F32, &mut Rng::new(seed)).unwrap()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("asrforge-ckpt-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bits(m: &dyn Module) -> Vec<(String, Vec<u8>)> {
    m.state_dict()
        .into_iter()
        .map(|e| {
            let s = e.tensor.to_cpu_storage().unwrap();
            let b = match s {
                asrforge::backend::cpu::CpuStorage::F32(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
                asrforge::backend::cpu::CpuStorage::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                other => panic!("unexpected dtype {:?}", other.dtype()),
            };
            (e.name, b)
        })
        .collect()
}

/// Writes a safetensors file from (key, shape, f32 data) triples.
fn write_raw(path: &std::path::Path, entries: &[(String, Vec<usize>, Vec<u8>, safetensors::Dtype)]) {
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        entries.iter().map(|(k, s, b, d)| (k.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn raw_entries(m: &dyn Module) -> Vec<(String, Vec<usize>, Vec<u8>, safetensors::Dtype)> {
    bits(m)
        .into_iter()
        .zip(m.state_dict())
        .map(|((k, b), e)| {
            let d = if e.tensor.dtype() == DType::I64 { safetensors::Dtype::I64 } else { safetensors::Dtype::F32 };
            (k, e.tensor.dims().to_vec(), b, d)
        })
        .collect()
}

#[test]
fn save_load_round_trip_is_bitwise() {
    let d = dir("roundtrip");
    let a = tiny(1);
    // Move the batch-norm statistics so buffers differ from their initial values.
    let feats = Tensor::randn([2, 30, 80], 0.0, 1.0, DType::F32, &mut Rng::new(9), &Device::Cpu).unwrap();
    let tg = Tensor::from_vec(vec![1i64, 2, 3, -1], [2, 2], &Device::Cpu).unwrap();
    a.forward(&feats, &[30, 25], &tg, &[2, 1]).unwrap();
    asrforge::autograd::clear_tape();
    let path = d.join("epoch_1.safetensors");
    let infos: serde_yaml_ng::Value = serde_yaml_ng::from_str("epoch: 1\nstep: 120\nlr: 0.002\ncv_loss: 12.5\n").unwrap();
    save_checkpoint(&a, &path, &infos).unwrap();
    assert_eq!(infos_path(&path), d.join("epoch_1.yaml"));
    assert_eq!(read_infos(&path).unwrap(), infos);
    // No temp files are left beside the checkpoint.
    let names: Vec<String> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 2, "{names:?}");

    let b = tiny(2);
    assert_ne!(bits(&a), bits(&b));
    let rep = load_checkpoint(&b, &path, true).unwrap();
    assert!(rep.missing.is_empty() && rep.unexpected.is_empty());
    assert_eq!(rep.loaded.len(), a.state_dict().len());
    assert_eq!(bits(&a), bits(&b));
    let nbt = b.state_dict().into_iter().find(|e| e.name.ends_with("norm.num_batches_tracked")).unwrap();
    assert_eq!(nbt.tensor.to_vec::<i64>().unwrap(), vec![1]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn load_errors_name_the_offending_key() {
    let d = dir("errors");
    let m = tiny(3);
    let good = raw_entries(&m);
    let before = bits(&m);

    let p = d.join("missing.safetensors");
    write_raw(&p, &good.iter().filter(|e| e.0 != "encoder.after_norm.bias").cloned().collect::<Vec<_>>());
    let e = load_checkpoint(&m, &p, true).unwrap_err().to_string();
    assert!(e.contains("missing keys [\"encoder.after_norm.bias\"]"), "{e}");
    let rep = load_checkpoint(&m, &p, false).unwrap();
    assert_eq!(rep.missing, vec!["encoder.after_norm.bias".to_string()]);

    let p = d.join("extra.safetensors");
    let mut extra = good.clone();
    extra.push(("encoder.bogus.weight".into(), vec![2], vec![0; 8], safetensors::Dtype::F32));
    write_raw(&p, &extra);
    let e = load_checkpoint(&m, &p, true).unwrap_err().to_string();
    assert!(e.contains("unexpected keys [\"encoder.bogus.weight\"]"), "{e}");

    let p = d.join("shape.safetensors");
    let mut wrong = good.clone();
    let i = wrong.iter().position(|e| e.0 == "ctc.ctc_lo.bias").unwrap();
    wrong[i] = ("ctc.ctc_lo.bias".into(), vec![63], vec![0; 63 * 4], safetensors::Dtype::F32);
    write_raw(&p, &wrong);
    let e = load_checkpoint(&m, &p, false).unwrap_err().to_string();
    assert!(e.contains("key ctc.ctc_lo.bias: expected shape 64, found 63"), "{e}");

    let p = d.join("corrupt.safetensors");
    let mut bytes = std::fs::read(d.join("extra.safetensors")).unwrap();
    // The JSON header starts right after its 8-byte length.
    bytes[8] = b'!';
    std::fs::write(&p, &bytes).unwrap();
    let e = load_checkpoint(&m, &p, false).unwrap_err().to_string();
    assert!(e.contains("corrupt.safetensors") && e.contains("corrupt header"), "{e}");

    let e = load_checkpoint(&m, &d.join("absent.safetensors"), true).unwrap_err().to_string();
    assert!(e.contains("absent.safetensors"), "{e}");
    // Failed loads leave the model untouched.
    assert_eq!(bits(&m), before);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn load_by_prefix_takes_only_those_modules() {
    let d = dir("prefix");
    let (a, b) = (tiny(4), tiny(5));
    let p = d.join("a.safetensors");
    save_checkpoint(&a, &p, &serde_yaml_ng::Value::Null).unwrap();
    let before = bits(&b);
    let rep = load_prefixes(&b, &p, &["encoder.".to_string()]).unwrap();
    assert!(rep.loaded.iter().all(|k| k.starts_with("encoder.")) && !rep.loaded.is_empty());
    for (((k, x), (_, y)), (_, old)) in bits(&a).into_iter().zip(bits(&b)).zip(before) {
        if k.starts_with("encoder.") {
            assert_eq!(x, y, "{k} is loaded");
        } else {
            assert_eq!(y, old, "{k} is kept");
        }
    }
    assert_ne!(bits(&a), bits(&b), "the decoder still differs");
    let e = load_prefixes(&b, &p, &["joint.".to_string()]).unwrap_err().to_string();
    assert!(e.contains("joint."), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn positional_tables_may_be_absent_from_older_checkpoints() {
    let d = dir("nope");
    let m = tiny(6);
    let p = d.join("old.safetensors");
    write_raw(&p, &raw_entries(&m).into_iter().filter(|e| !e.0.ends_with(".pe")).collect::<Vec<_>>());
    let rep = load_checkpoint(&m, &p, true).unwrap();
    assert!(rep.missing.is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}
