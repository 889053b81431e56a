//! Exact resume: a run resumed from a mid-epoch `step_N` or an `epoch_N`
//! checkpoint reproduces the uninterrupted run's per-step losses bitwise
//! (dropout on, shuffling on), with the schedule and the loss scaler restored.

mod train_common;

use asrforge::train::{run_train, StepReport};

fn bits(h: &[StepReport]) -> Vec<(u64, u64, u64, u64)> {
    h.iter().map(|r| (r.step, r.loss.to_bits(), r.lr.to_bits(), r.grad_norm.to_bits())).collect()
}

/// Drops utterances too short for their transcript (CTC needs a frame per token).
fn ratio() -> Vec<String> {
    vec!["dataset_conf.filter_conf.max_output_input_ratio 0.1".into()]
}

fn check(name: &str, amp: bool) {
    let dir = train_common::tmpdir(name);
    let mut full = train_common::setup(&dir, 8, &train_common::tiny_yaml(0.1, 2, 3, "save_interval: 2\n"));
    full.use_amp = amp;
    full.override_config = ratio();
    let a = run_train(&full).expect("uninterrupted run");
    // 6 of the 8 utterances pass the filter: 3 batches of 2 per epoch.
    assert_eq!(a.history.len(), 9, "3 epochs of 3 batches");
    let losses: Vec<f64> = a.history.iter().map(|r| r.loss).collect();
    assert!(losses.windows(2).any(|w| w[0] != w[1]));

    // step_4 is mid-epoch: epoch 1 after 1 of its 3 batches.
    let mut mid = train_common::args(&dir, "resume_mid");
    mid.use_amp = amp;
    mid.override_config = ratio();
    mid.checkpoint = Some(full.model_dir.join("step_4.safetensors"));
    let b = run_train(&mid).expect("resumed run");
    assert_eq!(b.history.first().map(|r| r.step), Some(5));
    assert_eq!(bits(&b.history), bits(&a.history[4..]), "steps 5..9 equal bitwise");

    let mut ep = train_common::args(&dir, "resume_epoch");
    ep.use_amp = amp;
    ep.override_config = ratio();
    ep.checkpoint = Some(full.model_dir.join("epoch_0.safetensors"));
    let c = run_train(&ep).expect("resumed from epoch_0");
    assert_eq!(bits(&c.history), bits(&a.history[3..]), "steps 4..9 equal bitwise");
    if amp {
        let (sa, sc) = (a.scaler.as_ref().unwrap(), c.scaler.as_ref().unwrap());
        assert_eq!((sa.scale, sa.growth_tracker), (sc.scale, sc.growth_tracker));
        // With fp16 autocast a scaled gradient can overflow half and skip a
        // step (GradScaler's semantics): the tracker counts the clean steps
        // since the last skip, and each skip halved the initial 2^16.
        let clean_tail = a.history.iter().rev().take_while(|r| !r.skipped).count() as u64;
        let skips = a.history.iter().filter(|r| r.skipped).count() as i32;
        assert_eq!(sa.growth_tracker, clean_tail);
        assert_eq!(sa.scale, 65536.0 * 0.5f64.powi(skips));
        assert!(clean_tail > 0, "the run ends with clean steps: {:?}", a.history);
    }
    // The final models are identical too.
    let pa: Vec<Vec<f32>> = a.engine.parameters().iter().map(|(_, p)| p.to_vec::<f32>().unwrap()).collect();
    let pb: Vec<Vec<f32>> = b.engine.parameters().iter().map(|(_, p)| p.to_vec::<f32>().unwrap()).collect();
    assert!(pa == pb, "final parameters equal bitwise");
}

#[test]
fn resume_mid_epoch_and_from_epoch_is_bitwise_exact() {
    check("train-resume", false);
}

#[test]
fn resume_with_amp_scaler_is_bitwise_exact() {
    check("train-resume-amp", true);
}

#[test]
fn warmup_schedule_is_restored_on_resume() {
    let dir = train_common::tmpdir("train-resume-lr");
    let full = train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 2, 2, "save_interval: 1\n"));
    let a = run_train(&full).expect("run");
    let state = asrforge::train::checkpoint::load_state(&full.model_dir.join("step_3.state.safetensors")).unwrap();
    assert_eq!(state.scheduler_steps, 3);
    assert_eq!(state.optimizer[0].step, 3);
    assert_eq!(state.position.step, 3);
    assert_eq!((state.position.epoch, state.position.batches), (1, 1));
    let mut r = train_common::args(&dir, "r");
    r.checkpoint = Some(full.model_dir.join("step_3.safetensors"));
    let b = run_train(&r).expect("resume");
    // WarmupLR at n = 4 with warmup 10: base · 10^0.5 · 4 · 10^-1.5.
    let want = 0.005 * 10f64.sqrt() * 4.0 * 10f64.powf(-1.5);
    assert!((b.history[0].lr - want).abs() < 1e-15, "lr {} vs {want}", b.history[0].lr);
    assert_eq!(b.history[0].lr.to_bits(), a.history[3].lr.to_bits());
}

#[test]
fn checkpoint_without_state_continues_after_its_epoch() {
    let dir = train_common::tmpdir("train-resume-nostate");
    let full = train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 2, 2, ""));
    let a = run_train(&full).expect("run");
    std::fs::remove_file(full.model_dir.join("epoch_0.state.safetensors")).unwrap();
    let mut r = train_common::args(&dir, "r");
    r.checkpoint = Some(full.model_dir.join("epoch_0.safetensors"));
    let b = run_train(&r).expect("resume");
    assert_eq!(b.history.len(), a.history.len() / 2, "only epoch 1 is trained");
    assert_eq!(b.history[0].step, a.history[a.history.len() / 2].step);
    // The schedule continues from the step in the infos.
    assert_eq!(b.history[0].lr.to_bits(), a.history[a.history.len() / 2].lr.to_bits());
}

#[test]
fn enc_init_loads_only_the_named_prefixes() {
    use asrforge::nn::Module;
    let dir = train_common::tmpdir("train-enc-init");
    let full = train_common::setup(&dir, 4, &train_common::tiny_yaml(0.0, 2, 1, ""));
    let a = run_train(&full).expect("run");
    let mut r = train_common::args(&dir, "init");
    r.enc_init = Some(full.model_dir.join("epoch_0.safetensors"));
    r.seed = 99;
    r.override_config = vec!["max_epoch 0".into()];
    let b = run_train(&r).expect("init only");
    assert!(b.history.is_empty());
    let (pa, pb) = (a.model.named_parameters(), b.model.named_parameters());
    let same =
        |n: &str| pa.iter().zip(&pb).filter(|((k, _), _)| k.starts_with(n)).all(|((_, x), (_, y))| x.to_vec::<f32>().unwrap() == y.to_vec::<f32>().unwrap());
    assert!(same("encoder."), "encoder taken from the checkpoint");
    assert!(!same("decoder."), "decoder freshly initialised");
    assert!(r.model_dir.join("init.safetensors").exists());
}

#[test]
fn job_layout_from_torchrun_variables() {
    use asrforge::train::dist::dist_info_from;
    let env = |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
    let single = dist_info_from(&env(&[])).unwrap();
    assert_eq!((single.world_size, single.rank, single.local_rank), (1, 0, 0));
    let d = dist_info_from(&env(&[("WORLD_SIZE", "4"), ("RANK", "3"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "10.0.0.2"), ("MASTER_PORT", "29501")])).unwrap();
    assert_eq!((d.world_size, d.rank, d.local_rank, d.master_addr.as_str(), d.master_port), (4, 3, 1, "10.0.0.2", 29501));
    let e = dist_info_from(&env(&[("WORLD_SIZE", "2"), ("RANK", "2")])).unwrap_err().to_string();
    assert_eq!(e, "config key `RANK`: expected 0 <= RANK < WORLD_SIZE, found RANK 2 of WORLD_SIZE 2");
}
