//! One optimizer step on hand-made batches: gradient accumulation equals a
//! larger batch, clipping bounds the global norm, a NaN gradient skips the
//! step (counted, parameters untouched), config overrides, and atomic
//! checkpoints.

mod train_common;

use asrforge::data::batch::pad;
use asrforge::data::{Batch, Sample};
use asrforge::models::{AsrModel, ModelConfig};
use asrforge::nn::Module;
use asrforge::tensor::{DType, Rng};
use asrforge::train::{init_optimizer_and_scheduler, parse_train_config, read_config, Executor, ExecutorParts, Resume, SingleProcess};

fn sample(i: usize, frames: usize) -> Sample {
    let mut r = Rng::new(100 + i as u64);
    let feats: Vec<f32> = r.normal(frames * 20).into_iter().map(|x| x as f32).collect();
    Sample { key: format!("u{i}"), feats, frames, dim: 20, label: (0..3).map(|k| 3 + ((i + k) % 5) as i64).collect() }
}

fn executor(extra: &str) -> Executor {
    let yaml = format!("input_dim: 20\noutput_dim: 9\n{}", train_common::tiny_yaml(0.0, 2, 1, extra));
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let cfg = parse_train_config(&root).unwrap();
    let (mcfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let model = AsrModel::new(&mcfg, DType::F32, &mut Rng::new(1)).unwrap();
    let params = model.named_parameters();
    let optim = init_optimizer_and_scheduler(&cfg, &Resume::default()).unwrap();
    let engine = SingleProcess::new(params, optim.adam).unwrap();
    Executor::new(ExecutorParts::new(model, Box::new(engine), optim, cfg))
}

fn grads(e: &Executor) -> Vec<f64> {
    e.engine.parameters().iter().flat_map(|(_, p)| p.grad().map(|g| g.to_f64_vec().unwrap()).unwrap_or_default()).collect()
}

/// Adam's step count, as the engine would save it.
fn adam_step(e: &Executor) -> u64 {
    e.engine.optimizer_state().unwrap().step
}

fn batch(ids: &[usize]) -> Batch {
    pad(ids.iter().map(|&i| sample(i, 40)).collect()).unwrap()
}

#[test]
fn accum_two_batches_equals_one_double_batch() {
    let mut big = executor("");
    big.train_batch(&batch(&[0, 1, 2, 3])).unwrap();
    let gb = grads(&big);
    let mut acc = executor("");
    acc.cfg.accum_grad = 2;
    acc.train_batch(&batch(&[0, 1])).unwrap();
    assert!(!acc.step_due());
    acc.train_batch(&batch(&[2, 3])).unwrap();
    assert!(acc.step_due());
    let ga = grads(&acc);
    assert_eq!(ga.len(), gb.len());
    let diff: f64 = ga.iter().zip(&gb).map(|(a, b)| (a - b).powi(2)).sum::<f64>().sqrt();
    let norm: f64 = gb.iter().map(|b| b * b).sum::<f64>().sqrt();
    assert!(norm > 1e-3, "gradients are not trivial: {norm}");
    assert!(diff / norm < 1e-5, "relative difference {}", diff / norm);
    // And the steps that follow agree.
    let (rb, ra) = (big.optimizer_step().unwrap(), acc.optimizer_step().unwrap());
    assert!(((rb.grad_norm - ra.grad_norm) / rb.grad_norm).abs() < 1e-5);
    assert!(((rb.loss - ra.loss) / rb.loss).abs() < 1e-5, "{} vs {}", rb.loss, ra.loss);
}

#[test]
fn clipping_bounds_the_global_norm() {
    let mut e = executor("");
    e.cfg.grad_clip = 0.01;
    e.train_batch(&batch(&[0, 1])).unwrap();
    let before: f64 = grads(&e).iter().map(|g| g * g).sum::<f64>().sqrt();
    assert!(before > 0.01);
    // Check the clipped norm by clipping a copy of the gradients the same way.
    let params = e.engine.parameters().to_vec();
    let norm = asrforge::optim::clip_grad_norm(&params, 0.01).unwrap();
    assert!((norm - before).abs() < 1e-9 * before);
    let after: f64 = grads(&e).iter().map(|g| g * g).sum::<f64>().sqrt();
    assert!((after - 0.01).abs() < 1e-6, "clipped norm {after}");
    let r = e.optimizer_step().unwrap();
    assert!(!r.skipped);
    assert!((r.grad_norm - 0.01).abs() < 1e-6, "step reports the norm before its own clipping: {}", r.grad_norm);
    assert!(grads(&e).is_empty() || grads(&e).iter().all(|g| *g == 0.0), "gradients cleared");
}

#[test]
fn nan_gradient_skips_the_step() {
    let mut e = executor("");
    e.train_batch(&batch(&[0, 1])).unwrap();
    let params = e.engine.parameters().to_vec();
    let before: Vec<Vec<f32>> = params.iter().map(|(_, p)| p.to_vec::<f32>().unwrap()).collect();
    let (name, p) = &params[3];
    let g = p.grad().expect("has a gradient");
    let mut v = g.to_vec::<f32>().unwrap();
    v[0] = f32::NAN;
    p.set_grad(Some(asrforge::Tensor::from_vec(v, g.dims().to_vec(), &asrforge::Device::Cpu).unwrap())).unwrap();
    let r = e.optimizer_step().unwrap();
    assert!(r.skipped, "NaN in {name} skips");
    assert!(r.grad_norm.is_nan());
    assert_eq!(e.skipped_steps, 1);
    assert_eq!(adam_step(&e), 0, "Adam did not step");
    assert_eq!(e.optim.scheduler.steps(), 1, "the schedule advances as WeNet's does");
    let after: Vec<Vec<f32>> = params.iter().map(|(_, p)| p.to_vec::<f32>().unwrap()).collect();
    assert!(before == after, "parameters untouched");
    // The next clean step goes through.
    e.train_batch(&batch(&[2, 3])).unwrap();
    let r = e.optimizer_step().unwrap();
    assert!(!r.skipped && r.grad_norm.is_finite());
    assert_eq!(adam_step(&e), 1);
}

#[test]
fn nan_with_amp_backs_off_the_scale() {
    let mut e = executor("");
    e.scaler = Some(asrforge::optim::GradScaler::new(Default::default()));
    e.train_batch(&batch(&[0, 1])).unwrap();
    let (_, p) = &e.engine.parameters()[0];
    let g = p.grad().unwrap();
    let mut v = g.to_vec::<f32>().unwrap();
    v[1] = f32::INFINITY;
    p.set_grad(Some(asrforge::Tensor::from_vec(v, g.dims().to_vec(), &asrforge::Device::Cpu).unwrap())).unwrap();
    let r = e.optimizer_step().unwrap();
    assert!(r.skipped);
    assert_eq!(e.scaler.as_ref().unwrap().scale, 32768.0);
    assert_eq!(adam_step(&e), 0);
}

#[test]
fn overrides_apply_and_bad_ones_name_the_key() {
    let dir = train_common::tmpdir("train-override");
    std::fs::write(dir.join("t.yaml"), train_common::tiny_yaml(0.0, 2, 1, "")).unwrap();
    let p = dir.join("t.yaml");
    let root =
        read_config(&p, &["encoder_conf.num_blocks 3".into(), "optim_conf.lr 0.1".into(), "accum_grad 4".into(), "dataset_conf.shuffle false".into()]).unwrap();
    assert_eq!(root["encoder_conf"]["num_blocks"].as_u64(), Some(3));
    let cfg = parse_train_config(&root).unwrap();
    assert_eq!(cfg.accum_grad, 4);
    assert!(!cfg.data.dataset_conf.shuffle);
    assert_eq!(root["optim_conf"]["lr"].as_f64(), Some(0.1));
    let e = read_config(&p, &["encoder_conf.nope 3".into()]).unwrap_err().to_string();
    assert_eq!(e, "config key `encoder_conf.nope`: no such key in the config");
    let e = read_config(&p, &["accum_grad two".into()]).unwrap_err().to_string();
    assert_eq!(e, "config key `accum_grad`: cannot replace integer 1 with string \"two\"");
    let e = read_config(&p, &["accum_grad".into()]).unwrap_err().to_string();
    assert!(e.contains("expected an override of the form"), "{e}");
    let root = read_config(&p, &["accum_grad 0".into()]).unwrap();
    assert_eq!(parse_train_config(&root).unwrap_err().to_string(), "config key `accum_grad`: expected >= 1, found 0");
}

#[test]
fn interrupted_write_leaves_the_previous_checkpoint_loadable() {
    let dir = train_common::tmpdir("train-atomic");
    let mut e = executor("");
    e.model_dir = dir.to_path_buf();
    let path = e.save("epoch_0", 0, Some(1.5)).unwrap();
    let want: Vec<Vec<f32>> = e.engine.parameters().iter().map(|(_, p)| p.to_vec::<f32>().unwrap()).collect();
    // A crash mid-write leaves a partial temp file beside the checkpoint.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(dir.join(".epoch_0.safetensors.tmp.99999"), &bytes[..bytes.len() / 3]).unwrap();
    let fresh = executor("");
    asrforge::models::load_checkpoint(&fresh.model, &path, true).expect("previous checkpoint loads");
    let got: Vec<Vec<f32>> = fresh.engine.parameters().iter().map(|(_, p)| p.to_vec::<f32>().unwrap()).collect();
    assert!(want == got);
    let st = asrforge::train::checkpoint::load_state(&asrforge::train::checkpoint::state_path(&path)).unwrap();
    assert_eq!(st.optimizer[0].tensors.len(), 2 * want.len());
    let infos = asrforge::models::checkpoint::read_infos(&path).unwrap();
    assert_eq!(infos["cv_loss"].as_f64(), Some(1.5));
    assert_eq!(infos["tag"].as_str(), Some("epoch_0"));
    assert_eq!(infos["config"]["accum_grad"].as_u64(), Some(1));
    // No temp file of our own is left behind.
    let tmp: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|x| x.ok())
        .filter(|x| x.file_name().to_string_lossy().contains(".tmp.") && !x.file_name().to_string_lossy().ends_with("99999"))
        .collect();
    assert!(tmp.is_empty());
    // A truncated state file is a clear error naming it.
    let sp = dir.join("cut.state.safetensors");
    std::fs::write(&sp, &std::fs::read(asrforge::train::checkpoint::state_path(&path)).unwrap()[..20]).unwrap();
    let err = asrforge::train::checkpoint::load_state(&sp).unwrap_err().to_string();
    assert!(err.contains("cut.state.safetensors") && err.contains("not a valid safetensors file"), "{err}");
}

#[test]
fn optimizer_and_scheduler_from_the_config() {
    let yaml = train_common::tiny_yaml(0.0, 2, 1, "");
    let yaml = yaml.replace("optim: adam\noptim_conf:\n    lr: 0.005\nscheduler: warmuplr\nscheduler_conf:\n    warmup_steps: 10\n", "optim: adamw\noptim_conf:\n    lr: 0.001\n    weight_decay: 0.05\nscheduler: NoamHoldAnnealing\nscheduler_conf:\n    max_steps: 100\n    warmup_ratio: 0.1\n    hold_ratio: 0.2\n    decay_rate: 0.5\n    min_lr: 0.00001\n");
    let root: serde_yaml_ng::Value = serde_yaml_ng::from_str(&format!("input_dim: 20\noutput_dim: 9\n{yaml}")).unwrap();
    let cfg = parse_train_config(&root).unwrap();
    let mut o = init_optimizer_and_scheduler(&cfg, &Resume::default()).unwrap();
    assert!(o.adam.decoupled);
    assert_eq!(o.adam.weight_decay, 0.05);
    assert_eq!(o.scheduler.lr(), 0.001 / 11.0, "warmup step 0 of 10");
    o.scheduler.set_steps(20);
    assert_eq!(o.scheduler.lr(), 0.001, "held until step 30");
    o.scheduler.set_steps(34);
    assert!((o.scheduler.lr() - 0.001 * 10f64.sqrt() / 2.0).abs() < 1e-15);
    let bad = root.clone();
    let mut bad = bad;
    bad["scheduler"] = "cosine".into();
    let e = init_optimizer_and_scheduler(&parse_train_config(&bad).unwrap(), &Resume::default()).err().unwrap().to_string();
    assert_eq!(e, "config key `scheduler`: expected warmuplr or NoamHoldAnnealing, found \"cosine\"");
}

/// Every parameter and buffer of the model, as bit patterns.
fn state_bits(e: &Executor) -> Vec<(String, Vec<u64>)> {
    e.model.state_dict().iter().map(|t| (t.name.clone(), t.tensor.to_f64_vec().unwrap().iter().map(|x| x.to_bits()).collect())).collect()
}

/// A tiny conformer with BatchNorm in its convolution module, its files in
/// a folder named after `test` (tests run in parallel in one process),
/// removed when the returned guard drops.
fn batchnorm_executor(test: &str) -> (Executor, train_common::TempDir) {
    let dir = train_common::tmpdir(&format!("train-bn-{test}"));
    std::fs::write(dir.join("t.yaml"), format!("input_dim: 20\noutput_dim: 9\n{}", train_common::tiny_yaml(0.0, 2, 1, ""))).unwrap();
    let root = read_config(&dir.join("t.yaml"), &["encoder_conf.cnn_module_norm batch_norm".into()]).unwrap();
    let cfg = parse_train_config(&root).unwrap();
    let (mcfg, _) = ModelConfig::from_yaml(&root).unwrap();
    let model = AsrModel::new(&mcfg, DType::F32, &mut Rng::new(1)).unwrap();
    let optim = init_optimizer_and_scheduler(&cfg, &Resume::default()).unwrap();
    let engine = SingleProcess::new(model.named_parameters(), optim.adam).unwrap();
    (Executor::new(ExecutorParts { model_dir: dir.to_path_buf(), ..ExecutorParts::new(model, Box::new(engine), optim, cfg) }), dir)
}

#[test]
fn a_skipped_step_leaves_every_parameter_and_buffer_bitwise_as_before() {
    let (mut e, _dir) = batchnorm_executor("skipped-step");
    assert!(e.model.named_buffers().iter().any(|(n, _)| n.ends_with("running_var")), "the model has BatchNorm statistics");
    // A clean step first, so the statistics are not at their initial values.
    e.train_batch(&batch(&[0, 1])).unwrap();
    assert!(!e.optimizer_step().unwrap().skipped);
    // A huge weight right before the BatchNorm (what a huge learning rate
    // leaves): the depthwise convolution overflows to ±inf, the forward moves
    // the running statistics with NaN, the loss and gradient are NaN.
    let (_, w) = e.model.named_parameters().into_iter().find(|(n, _)| n.ends_with("conv_module.depthwise_conv.weight")).unwrap();
    let huge: Vec<f32> = w.to_vec::<f32>().unwrap().iter().map(|x| x * 1e38).collect();
    w.assign(&asrforge::Tensor::from_vec(huge, w.dims().to_vec(), &asrforge::Device::Cpu).unwrap()).unwrap();
    let before = state_bits(&e);
    e.train_batch(&batch(&[2, 3])).unwrap();
    let bl = e.last_batch().unwrap().expect("a batch was trained");
    assert!(!bl.loss.is_finite(), "loss {}", bl.loss);
    // The forward did move the statistics to non-finite values (what the step must undo).
    let moved: Vec<f64> = e.model.named_buffers().iter().filter(|(n, _)| n.contains("running_")).flat_map(|(_, t)| t.to_f64_vec().unwrap()).collect();
    assert!(moved.iter().any(|x| !x.is_finite()), "the forward left the statistics finite: this case tests nothing");
    let r = e.optimizer_step().unwrap();
    assert!(r.skipped);
    let after = state_bits(&e);
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        assert!(a == b, "{name} changed by a skipped step");
    }
    assert_eq!(before.len(), after.len());
    assert_eq!(e.skipped_steps, 1);
}

#[test]
fn a_non_finite_cv_loss_is_an_error_saying_so() {
    use asrforge::data::{DataList, DataLoader, ListFormat, LoaderConf, Processor};
    let dir = train_common::tmpdir("train-cv-nan");
    let (mut e, _dir) = batchnorm_executor("cv-nan");
    let args = train_common::setup(&dir, 4, &format!("input_dim: 20\noutput_dim: 9\n{}", train_common::tiny_yaml(0.0, 2, 1, "")));
    let tok = asrforge::data::Tokenizer::new(asrforge::data::SymbolTable::read(&dir.join("units.txt")).unwrap(), asrforge::data::TokenizeMode::Char, vec![]);
    let proc = Processor::new(&e.cfg.data.dataset_conf.for_cv(), Some(std::sync::Arc::new(tok))).unwrap();
    let loader = DataLoader::new(DataList::read(&args.cv_data, ListFormat::Raw).unwrap(), proc, LoaderConf { log: false, ..Default::default() }).unwrap();
    let clean = e.cv(&loader).unwrap();
    assert!(clean.loss.is_finite() && clean.utts == 4);
    // A NaN running variance (what a skipped NaN step used to leave) makes every cv loss NaN.
    let (_, rv) = e.model.named_buffers().into_iter().find(|(n, _)| n.ends_with("running_var")).unwrap();
    let mut v = rv.to_vec::<f32>().unwrap();
    v[0] = f32::NAN;
    rv.assign(&asrforge::Tensor::from_vec(v, rv.dims().to_vec(), &asrforge::Device::Cpu).unwrap()).unwrap();
    let err = e.cv(&loader).unwrap_err().to_string();
    assert!(err.contains("cv loss is NaN over 4 utterances") && err.contains("not saving epoch_0"), "{err}");
}
