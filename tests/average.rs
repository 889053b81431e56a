//! `asrforge average`: the element-wise mean of saved checkpoints, integer
//! buffers floored, and which files `--val_best` / the latest-N rule pick.

#[path = "common/tempdir.rs"]
mod tempdir;

use std::path::{Path, PathBuf};

use asrforge::models::average::{average_files, list_candidates, run_average, select, AverageArgs};
use asrforge::models::{load_checkpoint, save_checkpoint, AsrModel, ModelConfig};
use asrforge::nn::Module;
use asrforge::tensor::{DType, Rng};
use asrforge::{Device, Tensor};

fn tiny(seed: u64) -> AsrModel {
    let root: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/tiny.yaml")).unwrap()).unwrap();
    let (cfg, _) = ModelConfig::from_yaml(&root).unwrap();
    AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(seed)).unwrap()
}

fn dir(name: &str) -> tempdir::TempDir {
    tempdir::TempDir::new(&format!("average-{name}"))
}

fn save(m: &AsrModel, d: &Path, stem: &str, yaml: &str) -> PathBuf {
    let p = d.join(format!("{stem}.safetensors"));
    save_checkpoint(m, &p, &serde_yaml_ng::from_str(yaml).unwrap()).unwrap();
    p
}

fn set_counts(m: &AsrModel, v: i64) -> usize {
    let mut n = 0;
    for (name, t) in m.named_buffers() {
        if name.ends_with("num_batches_tracked") {
            t.assign(&Tensor::from_vec(vec![v], t.dims().to_vec(), &Device::Cpu).unwrap()).unwrap();
            n += 1;
        }
    }
    n
}

#[test]
fn average_of_three_is_the_elementwise_mean() {
    let d = dir("mean");
    let models: Vec<AsrModel> = (1..=3).map(tiny).collect();
    // num_batches_tracked 10, 20, 31: mean 20.33 is stored as 20.
    for (m, c) in models.iter().zip([10, 20, 31]) {
        assert!(set_counts(m, c) > 0, "the tiny conformer has BatchNorm counters");
    }
    let paths: Vec<PathBuf> =
        models.iter().enumerate().map(|(i, m)| save(m, &d, &format!("epoch_{i}"), &format!("epoch: {i}\nstep: {}\ncv_loss: 1.0\n", i * 10))).collect();
    let dst = d.join("avg.safetensors");
    average_files(&paths, &dst).unwrap();
    let avg = tiny(99);
    load_checkpoint(&avg, &dst, true).unwrap();
    let sd: Vec<_> = models.iter().map(|m| m.state_dict()).collect();
    let mut checked = 0;
    for (k, e) in avg.state_dict().iter().enumerate() {
        if e.tensor.dtype().is_float() {
            let got = e.tensor.to_f64_vec().unwrap();
            let vals: Vec<Vec<f64>> = sd.iter().map(|s| s[k].tensor.to_f64_vec().unwrap()).collect();
            for (j, g) in got.iter().enumerate() {
                let want = ((vals[0][j] as f32 as f64 + vals[1][j] as f32 as f64 + vals[2][j] as f32 as f64) / 3.0) as f32;
                assert_eq!(*g as f32, want, "{} [{j}]", e.name);
            }
            checked += got.len();
        } else {
            assert_eq!(e.tensor.to_vec::<i64>().unwrap(), vec![20], "{}", e.name);
        }
    }
    assert_eq!(checked, avg.state_dict().iter().filter(|e| e.tensor.dtype().is_float()).map(|e| e.tensor.elem_count()).sum::<usize>());
    // The parameters really differ between the inputs, so the mean is not one of them.
    let p0 = sd[0].iter().find(|e| e.name == "ctc.ctc_lo.weight").unwrap().tensor.to_f64_vec().unwrap();
    let pa = avg.state_dict().into_iter().find(|e| e.name == "ctc.ctc_lo.weight").unwrap().tensor.to_f64_vec().unwrap();
    assert_ne!(p0, pa);
}

#[test]
fn val_best_picks_lowest_cv_loss_and_latest_picks_last_epochs() {
    let d = dir("select");
    let m = tiny(1);
    // epochs 0..6 with these losses; init, final and averages are never candidates.
    let losses = [9.0, 5.0, 7.0, 3.0, 8.0, 4.0, 6.0];
    for (e, l) in losses.iter().enumerate() {
        save(&m, &d, &format!("epoch_{e}"), &format!("epoch: {e}\nstep: {}\ncv_loss: {l}\ntag: epoch_{e}\n", 100 * e));
    }
    save(&m, &d, "init", "epoch: 0\ncv_loss: 0.1\n");
    save(&m, &d, "final", "epoch: 6\ncv_loss: 6.0\n");
    std::fs::copy(d.join("epoch_0.safetensors"), d.join("avg_old.safetensors")).unwrap();
    let cands = list_candidates(&d, None).unwrap();
    assert_eq!(cands.len(), 7);
    let name = |c: &asrforge::models::average::Candidate| c.path.file_stem().unwrap().to_string_lossy().into_owned();
    let best: Vec<String> = select(cands.clone(), 3, true, 0, 65536, "d").unwrap().iter().map(name).collect();
    assert_eq!(best, ["epoch_3", "epoch_5", "epoch_1"]);
    let last: Vec<String> = select(cands.clone(), 3, false, 0, 65536, "d").unwrap().iter().map(name).collect();
    assert_eq!(last, ["epoch_4", "epoch_5", "epoch_6"]);
    // Epoch bounds: only 0..=2 → best two of 9, 5, 7.
    let bounded: Vec<String> = select(cands.clone(), 2, true, 0, 2, "d").unwrap().iter().map(name).collect();
    assert_eq!(bounded, ["epoch_1", "epoch_2"]);
    let err = select(cands, 8, true, 0, 65536, "exp/x").unwrap_err().to_string();
    assert_eq!(err, "exp/x: expected 8 checkpoints with a cv_loss in their YAML in epochs 0..=65536, found 7");
}

#[test]
fn run_average_writes_the_mean_of_the_chosen_files() {
    let d = dir("run");
    let (a, b, c) = (tiny(1), tiny(2), tiny(3));
    save(&a, &d, "epoch_0", "epoch: 0\ncv_loss: 1.0\n");
    save(&b, &d, "epoch_1", "epoch: 1\ncv_loss: 9.0\n");
    save(&c, &d, "epoch_2", "epoch: 2\ncv_loss: 2.0\n");
    let dst = d.join("avg_2.safetensors");
    let args = AverageArgs { dst_model: dst.clone(), src_path: d.to_path_buf(), num: 2, val_best: true, min_epoch: 0, max_epoch: 65536 };
    let out = run_average(&args).unwrap();
    assert!(out.contains("epoch_0.safetensors (epoch 0") && out.contains("epoch_2.safetensors (epoch 2") && !out.contains("epoch_1"), "{out}");
    let avg = tiny(7);
    load_checkpoint(&avg, &dst, true).unwrap();
    let key = "decoder.output_layer.bias";
    let get = |m: &AsrModel| m.state_dict().into_iter().find(|e| e.name == key).unwrap().tensor.to_f64_vec().unwrap();
    let (va, vc, vavg) = (get(&a), get(&c), get(&avg));
    for j in 0..va.len() {
        assert_eq!(vavg[j] as f32, ((va[j] + vc[j]) / 2.0) as f32);
    }
    // Re-running with the average in the same directory does not average it in.
    assert_eq!(list_candidates(&d, None).unwrap().len(), 3);
}
