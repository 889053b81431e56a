//! `run_train` (the real pipeline: init_distributed, the DDP engine, the
//! join group, cv reduction, rank-0 files) in 3 worker processes on
//! 127.0.0.1:
//! - ranks whose data lists give 5, 7 and 9 batches all stop after 5 in the
//!   same step, well within the timeout, and the next epoch runs;
//! - the cv loss reduced across ranks equals one process's cv loss over
//!   the whole cv list, with the same checkpoint;
//! - only rank 0 writes the model files, the YAML and TensorBoard;
//! - a worker killed with SIGKILL mid-epoch makes the others fail within the
//!   join timeout (+ a few s), naming the dead rank.

mod dist_common;
mod train_common;

use asrforge::engine::SingleProcess;
use asrforge::nn::Module;
use asrforge::train::{
    init_dataset_and_dataloader, init_model, init_optimizer_and_scheduler, parse_train_config, read_config, run_train, DistInfo, Executor, ExecutorParts,
    Resume,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Lines of the corpus with a one-token transcript (every one fits CTC).
fn good_lines(dir: &Path, n: usize) -> Vec<String> {
    let all: Vec<String> = std::fs::read_to_string(dir.join("data.list")).unwrap().lines().map(str::to_string).collect();
    all.into_iter().enumerate().filter(|(i, _)| i % 5 == 0).map(|(_, l)| l).cycle().take(n).collect()
}

/// A corpus in `dir` and per-rank train lists: rank r reads a list of
/// 3·counts[r] lines and keeps (partitioned by index) counts[r] of them.
fn prepare(name: &str, counts: &[usize], cv: usize, max_epoch: u64, extra: &str) -> train_common::TempDir {
    let dir = train_common::tmpdir(name);
    train_common::setup(&dir, 5 * 27, &train_common::tiny_yaml(0.0, 1, max_epoch, extra));
    let world = counts.len();
    for (r, &n) in counts.iter().enumerate() {
        std::fs::write(dir.join(format!("train{r}.list")), good_lines(&dir, world * n).join("\n") + "\n").unwrap();
    }
    std::fs::write(dir.join("cv.list"), good_lines(&dir, cv).join("\n") + "\n").unwrap();
    dir
}

fn worker_args(dir: &Path, rank: usize, timeout: u64) -> asrforge::train::TrainArgs {
    let mut a = train_common::args(dir, "exp");
    a.train_data = dir.join(format!("train{rank}.list"));
    a.cv_data = dir.join("cv.list");
    a.timeout = timeout;
    a
}

fn param_bits(m: &dyn Module) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (_, p) in m.named_parameters() {
        p.to_vec::<f32>().unwrap().iter().for_each(|x| x.to_bits().hash(&mut h));
    }
    h.finish()
}

fn train_worker(w: &dist_common::Worker) {
    let dir = PathBuf::from(std::env::var("JOB_DIR").unwrap());
    let timeout: u64 = std::env::var("JOB_TIMEOUT").unwrap().parse().unwrap();
    let mut args = worker_args(&dir, w.rank, timeout);
    if let Ok(ck) = std::env::var("JOB_RESUME") {
        args.checkpoint = Some(dir.join("exp").join(ck));
        args.model_dir = dir.join("resumed");
        args.tensorboard_dir = dir.join("resumed").join("tb");
    }
    let t0 = Instant::now();
    let e = run_train(&args).unwrap_or_else(|e| panic!("rank {}: {e}", w.rank));
    let bits: Vec<String> = e.history.iter().map(|r| format!("{}:{:x}:{:x}:{:x}", r.step, r.loss.to_bits(), r.lr.to_bits(), r.grad_norm.to_bits())).collect();
    println!("BITS {}", bits.join(","));
    println!("SECS {:.3}", t0.elapsed().as_secs_f64());
    println!("STEPS {}", e.history.iter().map(|r| r.step.to_string()).collect::<Vec<_>>().join(","));
    println!("POS {} {} {}", e.position.epoch, e.position.batches, e.position.step);
    println!("PARAMS {:016x}", param_bits(&e.model));
}

#[test]
fn uneven_ranks_end_each_epoch_together_and_cv_is_reduced() {
    if let Some(w) = dist_common::worker() {
        train_worker(&w);
        return;
    }
    const TIMEOUT: u64 = 60;
    let dir = prepare("dist-join", &[5, 7, 9], 10, 2, "");
    let extra = [("JOB_DIR", dir.display().to_string()), ("JOB_TIMEOUT", TIMEOUT.to_string())];
    let rs = dist_common::run_ok("uneven_ranks_end_each_epoch_together_and_cv_is_reduced", 3, &extra);
    for r in &rs {
        let secs: f64 = r.lines_with("SECS ").pop().unwrap().parse().unwrap();
        println!("rank {}: {secs:.1} s for 2 epochs, steps {}", r.rank, r.lines_with("STEPS ").pop().unwrap());
        assert!(secs < TIMEOUT as f64 / 2.0, "rank {} took {secs} s: it waited instead of stopping with the others", r.rank);
        // 5 steps per epoch on every rank (the first rank to run out had 5 batches), 2 epochs.
        assert_eq!(r.lines_with("STEPS ").pop().unwrap(), "1,2,3,4,5,6,7,8,9,10", "rank {}", r.rank);
        assert_eq!(r.lines_with("POS ").pop().unwrap(), "2 0 10", "rank {}: finished both epochs", r.rank);
        let uneven = r.stderr().matches("Detected uneven workload distribution").count();
        // Rank 0 has no batch left in either epoch; ranks 1 and 2 still do, and say so once per epoch.
        assert_eq!(uneven, if r.rank == 0 { 0 } else { 2 }, "rank {} stderr:\n{}", r.rank, r.stderr());
    }
    let params: Vec<String> = rs.iter().map(|r| r.lines_with("PARAMS ").pop().unwrap()).collect();
    assert!(params.iter().all(|p| *p == params[0]), "every rank ends with the same parameters: {params:?}");

    // Only rank 0 wrote: one TensorBoard file; the checkpoints of init and both epochs, and final (WeNet's final.pt).
    let exp = dir.join("exp");
    train_common::event_file(&exp.join("tb"));
    let mut files: Vec<String> =
        std::fs::read_dir(&exp).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|f| f != "tb").collect();
    files.sort();
    let want: Vec<String> = ["epoch_0", "epoch_1", "init"]
        .iter()
        .flat_map(|t| [format!("{t}.safetensors"), format!("{t}.state.safetensors"), format!("{t}.yaml")])
        .chain(["train.yaml".to_string(), "final.safetensors".to_string(), "final.yaml".to_string()])
        .collect();
    let mut want = want;
    want.sort();
    assert_eq!(files, want);

    // The cv loss rank 0 saved (reduced over the 3 ranks' parts of the cv
    // list) against one process over the whole list with that checkpoint.
    let infos = asrforge::models::checkpoint::read_infos(&exp.join("epoch_0.safetensors")).unwrap();
    let reduced = infos["cv_loss"].as_f64().unwrap();
    let mut args = worker_args(&dir, 0, TIMEOUT);
    args.checkpoint = Some(exp.join("epoch_0.safetensors"));
    let root = read_config(&exp.join("train.yaml"), &[]).unwrap();
    let cfg = parse_train_config(&root).unwrap();
    let (_, cv_loader) = init_dataset_and_dataloader(&args, &cfg, &DistInfo::single()).unwrap();
    let (model, _) = init_model(&args, &cfg).unwrap();
    let optim = init_optimizer_and_scheduler(&cfg, &Resume::default()).unwrap();
    let engine = SingleProcess::new(model.named_parameters(), optim.adam).unwrap();
    let mut one = Executor::new(ExecutorParts::new(model, Box::new(engine), optim, cfg));
    let cv = one.cv(&cv_loader).unwrap();
    println!("cv loss: reduced over 3 ranks {reduced}, one process over the whole list {}", cv.loss);
    assert_eq!(cv.utts, 10);
    assert!(((reduced - cv.loss) / cv.loss).abs() < 1e-6, "cv loss {reduced} vs {}", cv.loss);
}

#[test]
fn ddp_resumes_mid_epoch_bitwise_on_every_rank() {
    if let Some(w) = dist_common::worker() {
        train_worker(&w);
        return;
    }
    // Dropout on, uneven ranks (4 and 6 batches: 4 steps an epoch), a checkpoint every 3 steps.
    let dir = prepare("dist-resume", &[4, 6], 4, 2, "save_interval: 3\n");
    std::fs::write(dir.join("train.yaml"), train_common::tiny_yaml(0.1, 1, 2, "save_interval: 3\n")).unwrap();
    let test = "ddp_resumes_mid_epoch_bitwise_on_every_rank";
    let base = [("JOB_DIR", dir.display().to_string()), ("JOB_TIMEOUT", "60".to_string())];
    let full = dist_common::run_ok(test, 2, &base);
    let mut extra = base.to_vec();
    extra.push(("JOB_RESUME", "step_3.safetensors".to_string()));
    let resumed = dist_common::run_ok(test, 2, &extra);
    for (a, b) in full.iter().zip(&resumed) {
        let (fa, fb) = (a.lines_with("BITS ").pop().unwrap(), b.lines_with("BITS ").pop().unwrap());
        let fa: Vec<&str> = fa.split(',').collect();
        let fb: Vec<&str> = fb.split(',').collect();
        assert_eq!(fa.len(), 8, "rank {}: 2 epochs of 4 steps", a.rank);
        assert_eq!(fb, fa[3..], "rank {}: steps 4..8 of the resumed run equal the uninterrupted run bitwise (loss, lr, grad norm)", a.rank);
        assert_eq!(a.lines_with("PARAMS ").pop(), b.lines_with("PARAMS ").pop(), "rank {}: final parameters equal", a.rank);
    }
    let st = asrforge::train::checkpoint::load_state(&dir.join("exp").join("step_3.state.safetensors")).unwrap();
    assert_eq!(st.rank_rngs.len(), 2, "every rank's generator is saved");
    assert_ne!(st.rank_rngs[0], st.rank_rngs[1], "the ranks drew different amounts of dropout noise");
}

#[test]
fn a_killed_worker_makes_the_others_fail_naming_it() {
    if let Some(w) = dist_common::worker() {
        train_worker(&w);
        return;
    }
    const TIMEOUT: u64 = 10;
    let dir = prepare("dist-kill", &[40, 40, 40], 6, 1, "save_interval: 2\n");
    let extra = [("JOB_DIR", dir.display().to_string()), ("JOB_TIMEOUT", TIMEOUT.to_string())];
    let mut children = dist_common::start_workers("a_killed_worker_makes_the_others_fail_naming_it", 3, &extra, &|_| Vec::new());
    // Wait until training is under way (rank 0 saved step 2 of 40), then kill rank 2.
    wait_for_step_2(&dir.join("exp"));
    children[2].1.kill().unwrap();
    let killed = Instant::now();
    let victim = children.remove(2).1.wait_with_output().unwrap();
    assert!(!victim.status.success());
    for (rank, child) in children {
        let out = child.wait_with_output().unwrap();
        let secs = killed.elapsed().as_secs_f64();
        let err = String::from_utf8_lossy(&out.stderr);
        println!("rank {rank}: exited {:?} {secs:.1} s after the kill: {}", out.status, err.lines().filter(|l| l.contains("rank 2")).last().unwrap_or(""));
        assert!(!out.status.success(), "rank {rank} must fail");
        assert!(secs < (TIMEOUT + 5) as f64, "rank {rank} took {secs} s");
        assert!(err.contains("rank 2"), "rank {rank} names the dead rank:\n{err}");
        assert!(!dir.join("exp").join("epoch_0.yaml").exists(), "the epoch did not finish");
    }
}

/// The pids of `launcher`'s children, by their `RANK`.
fn workers_of(launcher: u32) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(launcher) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let rank = env.split(|b| *b == 0).find_map(|kv| std::str::from_utf8(kv).ok()?.strip_prefix("RANK=")?.parse().ok());
        if let Some(r) = rank {
            out.push((r, pid));
        }
    }
    out.sort();
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

#[test]
fn asrforge_launch_stops_the_job_when_a_training_worker_is_killed() {
    const TIMEOUT: u64 = 10;
    let dir = prepare("dist-launch-kill", &[], 6, 1, "save_interval: 2\n");
    std::fs::write(dir.join("train.list"), good_lines(&dir, 3 * 40).join("\n") + "\n").unwrap();
    let (mut cmd, model_dir) = launch_command(&dir, 3, TIMEOUT);
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let launcher = cmd.spawn().unwrap();
    wait_for_step_2(&model_dir);
    let workers = workers_of(launcher.id());
    assert_eq!(workers.iter().map(|(r, _)| *r).collect::<Vec<_>>(), [0, 1, 2], "three workers: {workers:?}");
    assert!(std::process::Command::new("kill").args(["-KILL", &workers[2].1.to_string()]).status().unwrap().success());
    let killed = Instant::now();
    let out = launcher.wait_with_output().unwrap();
    let secs = killed.elapsed().as_secs_f64();
    let err = String::from_utf8_lossy(&out.stderr);
    println!(
        "launcher exited {:?} {secs:.1} s after the kill; {}",
        out.status,
        err.lines().filter(|l| l.contains("asrforge launch")).collect::<Vec<_>>().join(" | ")
    );
    assert!(!out.status.success());
    assert!(secs < (TIMEOUT + 5) as f64, "the launcher took {secs} s");
    // The launcher names the cause: rank 2, killed by SIGKILL (a survivor
    // that failed because rank 2 closed its connections may be reaped in the
    // same tick; a signal death is preferred as the cause).
    assert!(err.contains("asrforge launch: rank 2 (") && err.contains("killed by signal SIGKILL"), "{err}");
    assert!(err.contains("rank 2 closed its connection") || !err.contains("closed its connection"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    let left: Vec<u32> = workers.iter().map(|(_, p)| *p).filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "workers left behind: {left:?}");
    assert!(!model_dir.join("epoch_0.yaml").exists(), "killed mid-epoch");
}

/// The launcher's `train` command over `dir`'s `train.list` with `nproc`
/// workers and `--timeout` (stdin closed, stdout/stderr left to the caller),
/// and the model_dir it trains into.
fn launch_command(dir: &Path, nproc: usize, timeout: u64) -> (std::process::Command, PathBuf) {
    let a = worker_args(dir, 0, timeout);
    let port = dist_common::free_port().to_string();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_asrforge"));
    let (nproc, timeout) = (nproc.to_string(), timeout.to_string());
    cmd.args(["launch", "--nproc_per_node", &nproc, "--master_port", &port, "--grace_period", "3", "train", "--dist_backend", "gloo"]);
    cmd.args(["--num_workers", "1", "--timeout", &timeout]);
    for (flag, p) in [
        ("--config", &a.config),
        ("--model_dir", &a.model_dir),
        ("--tensorboard_dir", &a.tensorboard_dir),
        ("--train_data", &dir.join("train.list")),
        ("--cv_data", &a.cv_data),
        ("--symbol_table", &dir.join("units.txt")),
    ] {
        cmd.arg(flag).arg(p);
    }
    cmd.env_remove("ASRFORGE_RDZV_TOKEN").stdin(std::process::Stdio::null());
    (cmd, a.model_dir)
}

/// [`launch_command`] started, its output in `dir/launch.{out,err}`.
fn launch_train(dir: &Path, nproc: usize, timeout: u64) -> (std::process::Child, PathBuf) {
    let (mut cmd, model_dir) = launch_command(dir, nproc, timeout);
    cmd.stdout(std::fs::File::create(dir.join("launch.out")).unwrap()).stderr(std::fs::File::create(dir.join("launch.err")).unwrap());
    (cmd.spawn().unwrap(), model_dir)
}

/// `--fp16_grad_sync` on the command line reaches the DDP engine: a
/// 2-worker `asrforge launch ... train --fp16_grad_sync` trains its epoch,
/// and rank 0 (only) reports the engine's buckets travelling in f16, or in
/// bf16 with `--dtype bf16`. With `--train_engine deepspeed` it reaches the
/// ZeRO engine: the gradient reduce-scatter travels in f16.
#[test]
fn fp16_grad_sync_from_the_command_line_reaches_the_ddp_and_zero_engines() {
    for (extra, want) in [(&[][..], "f16"), (&["--dtype", "bf16"][..], "bf16")] {
        let dir = prepare(&format!("dist-launch-gsync-{want}"), &[], 2, 1, "");
        std::fs::write(dir.join("train.list"), good_lines(&dir, 8).join("\n") + "\n").unwrap();
        let (mut cmd, model_dir) = launch_command(&dir, 2, 30);
        let out = cmd.arg("--fp16_grad_sync").args(extra).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{want}: launch failed:\n{err}");
        let said = format!("torch_ddp: gradient buckets are all-reduced in {want} (--fp16_grad_sync)");
        assert_eq!(err.matches(&said).count(), 1, "{want}: rank 0 says it once:\n{err}");
        assert!(model_dir.join("final.safetensors").exists(), "{want}: the epoch finished:\n{err}");
    }
    let dir = prepare("dist-launch-gsync-ds", &[], 2, 1, "");
    std::fs::write(dir.join("train.list"), good_lines(&dir, 8).join("\n") + "\n").unwrap();
    std::fs::write(dir.join("ds.json"), r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}"#).unwrap();
    // With deepspeed the flag reaches the ZeRO engine's reduce-scatter
    // (f16: the JSON enables no bf16).
    let (mut cmd, model_dir) = launch_command(&dir, 2, 30);
    let out = cmd.args(["--fp16_grad_sync", "--train_engine", "deepspeed", "--deepspeed_config"]).arg(dir.join("ds.json")).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "deepspeed with --fp16_grad_sync failed:\n{err}");
    assert_eq!(err.matches("deepspeed: gradients are reduce-scattered in f16").count(), 1, "rank 0 says it once:\n{err}");
    assert!(model_dir.join("final.safetensors").exists(), "deepspeed: the epoch finished:\n{err}");
}

/// Waits (at most 120 s) until the run in `model_dir` has saved step 2.
fn wait_for_step_2(model_dir: &Path) {
    let marker = model_dir.join("step_2.yaml");
    let t0 = Instant::now();
    while !marker.exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "training never reached step 2");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stopped_worker_fails_the_job_within_the_timeout_naming_it() {
    // SIGSTOP (not a kill): the stopped rank keeps its connections open, so
    // only the timeout of whatever collective the others wait in can end
    // the job; the step's gradient all-reduce used to wait 1800 s.
    const TIMEOUT: u64 = 10;
    let dir = prepare("dist-launch-stop", &[], 6, 1, "save_interval: 2\n");
    std::fs::write(dir.join("train.list"), good_lines(&dir, 2 * 60).join("\n") + "\n").unwrap();
    let (mut launcher, model_dir) = launch_train(&dir, 2, TIMEOUT);
    wait_for_step_2(&model_dir);
    let workers = workers_of(launcher.id());
    assert_eq!(workers.iter().map(|(r, _)| *r).collect::<Vec<_>>(), [0, 1], "two workers: {workers:?}");
    assert!(std::process::Command::new("kill").args(["-STOP", &workers[1].1.to_string()]).status().unwrap().success());
    let stopped = Instant::now();
    // Bounded wait: a job that ignores the timeout is stopped by the test, which then fails.
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break Some(s);
        }
        if stopped.elapsed() > Duration::from_secs(4 * TIMEOUT) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let secs = stopped.elapsed().as_secs_f64();
    if status.is_none() {
        for (_, pid) in &workers {
            let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        let _ = launcher.kill();
        let _ = launcher.wait();
    }
    let err = std::fs::read_to_string(dir.join("launch.err")).unwrap();
    println!("launcher exited {status:?} {secs:.1} s after SIGSTOP; {}", err.lines().filter(|l| l.contains("rank 1")).collect::<Vec<_>>().join(" | "));
    let status = status.unwrap_or_else(|| panic!("the job still ran {secs:.0} s after rank 1 stopped (--timeout {TIMEOUT}):\n{err}"));
    assert!(!status.success());
    assert!(secs < (TIMEOUT + 5) as f64, "the job took {secs} s to fail");
    assert!(err.contains("rank 1 did not answer within 10 s"), "rank 0 names the stopped rank:\n{err}");
    assert!(!err.contains("panicked") && !err.contains("stack backtrace"), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    let left: Vec<u32> = workers.iter().map(|(_, p)| *p).filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "workers left behind: {left:?}");
    assert!(!model_dir.join("epoch_0.yaml").exists(), "stopped mid-epoch");
}
