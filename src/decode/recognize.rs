//! `asrforge recognize`: decodes a test list with a trained checkpoint, as
//! WeNet's `recognize.py`, writing `{result_dir}/{mode}/text` (`key text`
//! lines, tokens mapped back through the symbol table, `▁` → space) for
//! each of the modes `ctc_greedy_search`, `ctc_prefix_beam_search`,
//! `attention` and `attention_rescoring`.
//!
//! The test data get the config's features without perturbation,
//! augmentation, shuffling, sorting or dither, no length filter, and static
//! batches of `--batch_size`. An utterance longer than the model's
//! positional table, or too short to give one encoder frame (fewer feature
//! frames than the subsampling reads, so nothing to decode or stream), is
//! skipped, counted and reported (key and reason) and every other utterance
//! is decoded. The model runs in eval mode under no_grad.
//! Hypotheses are written in the order of the test list (a batch is ordered
//! longest first inside). A progress bar shows utterances done (of the
//! list's, for a raw list), utterances/s and the ETA on a terminal.
//!
//! `--blank_penalty` is subtracted from the CTC blank logit before the
//! log-softmax, as WeNet's `ASRModel.ctc_logprobs` does (wenet/transformer/
//! asr_model.py: `logits[:, :, blank_id] -= blank_penalty`, applied only when
//! the penalty is > 0), for the CTC modes and the n-best of attention rescoring.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::autograd;
use crate::data::config::DataConfig;
use crate::data::list::{parse_raw_line, DataList, ListFormat};
use crate::data::loader::{DataLoader, LoaderConf};
use crate::data::process::Processor;
use crate::data::tokenizer::{bpe_text, SymbolTable, SPACE};
use crate::data::Batch;
use crate::decode::attention::{attention_beam_search_joint, attention_rescoring};
use crate::decode::beam::{BeamOptions, CtcJoint};
use crate::decode::ctc::{ctc_greedy_search, ctc_prefix_beam_search, Hypothesis};
use crate::decode::ctc_prefix::CtcRows;
use crate::decode::progress;
use crate::error::{Error, Result};
use crate::models::config::{apply_override, load_yaml};
use crate::models::mask::ChunkRequest;
use crate::models::{load_checkpoint, AsrModel, ModelConfig};
use crate::nn::Module;
use crate::ops;
use crate::tensor::{DType, Device, Rng};

/// The decoding modes, by WeNet's names.
pub const MODES: &[&str] = &["ctc_greedy_search", "ctc_prefix_beam_search", "attention", "attention_rescoring"];

/// Arguments of `recognize` (WeNet's recognize.py flags).
#[derive(Args, Debug, Clone)]
pub struct RecognizeArgs {
    /// The train.yaml of the model.
    #[arg(long)]
    pub config: PathBuf,
    /// Overrides a config key, e.g. "decoder_conf.num_blocks 2" (repeatable).
    #[arg(long = "override_config", value_name = "KEY VALUE")]
    pub override_config: Vec<String>,
    /// The test data list.
    #[arg(long = "test_data", alias = "test-data")]
    pub test_data: PathBuf,
    /// `raw` or `shard`.
    #[arg(long = "data_type", alias = "data-type", default_value = "raw")]
    pub data_type: String,
    /// The checkpoint (safetensors) to decode with.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Beam size of prefix beam search, attention beam search and the rescoring n-best.
    #[arg(long = "beam_size", alias = "beam-size", default_value_t = 10)]
    pub beam_size: usize,
    /// Utterances per batch.
    #[arg(long = "batch_size", alias = "batch-size", default_value_t = 16)]
    pub batch_size: usize,
    /// Length penalty of attention beam search: the final score is `score / len^length_penalty` (WeNet's).
    #[arg(long = "length_penalty", alias = "penalty", default_value_t = 0.0)]
    pub penalty: f64,
    /// Subtracted from the CTC blank logit before the log-softmax (WeNet's `--blank_penalty`).
    #[arg(long = "blank_penalty", alias = "blank-penalty", default_value_t = 0.0, allow_hyphen_values = true)]
    pub blank_penalty: f64,
    /// Decoding precision: fp32, fp16 or bf16 (half precision needs the GPU).
    #[arg(long = "dtype", default_value = "fp32")]
    pub dtype: String,
    /// Directory of the results; each mode writes `{result_dir}/{mode}/text`.
    #[arg(long = "result_dir", alias = "result-dir")]
    pub result_dir: PathBuf,
    /// Decoding modes, space separated.
    #[arg(long = "modes", alias = "mode", num_args = 1.., required = true)]
    pub modes: Vec<String>,
    /// Weight of the CTC score in attention rescoring.
    #[arg(long = "ctc_weight", alias = "ctc-weight", default_value_t = 0.0)]
    pub ctc_weight: f64,
    /// Weight of CTC prefix scores in `attention` beam search (joint CTC/attention
    /// decoding); 0, the default, is WeNet's attention-only search.
    #[arg(long = "attention_ctc_weight", alias = "attention-ctc-weight", default_value_t = 0.0)]
    pub attention_ctc_weight: f64,
    /// Weight of the right-to-left decoder in attention rescoring.
    #[arg(long = "reverse_weight", alias = "reverse-weight", default_value_t = 0.0)]
    pub reverse_weight: f64,
    /// Chunk size (output frames) of chunked decoding; -1 is full context.
    #[arg(long = "decoding_chunk_size", alias = "decoding-chunk-size", default_value_t = -1, allow_hyphen_values = true)]
    pub decoding_chunk_size: i64,
    /// Left chunks each chunk sees when decoding by chunks; -1 is all.
    #[arg(long = "num_decoding_left_chunks", alias = "num-decoding-left-chunks", default_value_t = -1, allow_hyphen_values = true)]
    pub num_decoding_left_chunks: i64,
    /// Encode chunk by chunk with the attention and convolution caches, as a streaming runtime does.
    #[arg(long = "simulate_streaming", alias = "simulate-streaming")]
    pub simulate_streaming: bool,
    /// The symbol table (units.txt); defaults to the config's tokenizer_conf.symbol_table_path.
    #[arg(long = "symbol_table", alias = "dict")]
    pub symbol_table: Option<PathBuf>,
    /// `cpu` or `cuda` (the GPU numbered LOCAL_RANK, 0 by default).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Feature threads.
    #[arg(long = "num_workers", alias = "num-workers", default_value_t = 1)]
    pub num_workers: usize,
}

/// Maps token ids back to text: tokens joined (with spaces in word mode), `▁` → space, trimmed.
pub struct Detokenizer {
    tokens: HashMap<usize, String>,
    join: &'static str,
    bpe: bool,
}

impl Detokenizer {
    /// From a symbol table; `words` joins tokens with spaces.
    pub fn new(table: &SymbolTable, words: bool) -> Detokenizer {
        let tokens = table.entries().filter(|(_, i)| *i >= 0).map(|(t, i)| (i as usize, t.to_string())).collect();
        Detokenizer { tokens, join: if words { " " } else { "" }, bpe: false }
    }

    /// For `tokenizer: bpe`: pieces joined, `▁` → space, trimmed (WeNet's BpeTokenizer).
    pub fn bpe(table: &SymbolTable) -> Detokenizer {
        Detokenizer { bpe: true, ..Detokenizer::new(table, false) }
    }

    /// The text of `ids`; an id missing from the table is an error naming it.
    pub fn text(&self, ids: &[usize]) -> Result<String> {
        let parts = ids
            .iter()
            .map(|i| {
                self.tokens
                    .get(i)
                    .map(String::as_str)
                    .ok_or_else(|| Error::invalid("recognize", format!("token id {i} is not in the symbol table ({} entries)", self.tokens.len())))
            })
            .collect::<Result<Vec<&str>>>()?;
        if self.bpe {
            return Ok(bpe_text(&parts));
        }
        Ok(parts.join(self.join).replace(SPACE, " ").split_whitespace().collect::<Vec<_>>().join(" "))
    }
}

/// Checks the flags that have a fixed set of values.
fn check_args(args: &RecognizeArgs) -> Result<()> {
    if args.device != "cpu" && args.device != "cuda" {
        return Err(Error::invalid("recognize", format!("--device: expected cpu or cuda, found `{}`", args.device)));
    }
    if args.decoding_chunk_size == 0 {
        return Err(Error::invalid("recognize", "--decoding_chunk_size: expected -1 (full context) or a chunk size >= 1, found 0"));
    }
    match args.dtype.as_str() {
        "fp32" => {}
        "fp16" | "bf16" if args.device == "cuda" => {}
        "fp16" | "bf16" => {
            return Err(Error::invalid(
                "recognize",
                format!(
                    "--dtype {}: half-precision decoding needs the GPU (--device cuda); the CPU decodes in fp32, so drop --dtype or pass --dtype fp32",
                    args.dtype
                ),
            ))
        }
        other => return Err(Error::invalid("recognize", format!("--dtype: expected fp32, fp16 or bf16, found `{other}`"))),
    }
    if !(args.blank_penalty >= 0.0 && args.blank_penalty.is_finite()) {
        return Err(Error::invalid("recognize", format!("--blank_penalty: expected a finite value >= 0, found {}", args.blank_penalty)));
    }
    if let Some(m) = args.modes.iter().find(|m| !MODES.contains(&m.as_str())) {
        return Err(Error::invalid("recognize", format!("--modes: expected some of {}, found `{m}`", MODES.join(", "))));
    }
    if !(0.0..=1.0).contains(&args.attention_ctc_weight) {
        return Err(Error::invalid("recognize", format!("--attention_ctc_weight: expected a weight in [0, 1], found {}", args.attention_ctc_weight)));
    }
    if args.beam_size == 0 || args.batch_size == 0 {
        return Err(Error::invalid("recognize", format!("expected --beam_size and --batch_size >= 1, found {} and {}", args.beam_size, args.batch_size)));
    }
    Ok(())
}

/// The model of `config`, loaded from `checkpoint` (every key required), in eval mode.
pub fn load_model(root: &serde_yaml_ng::Value, checkpoint: &Path) -> Result<AsrModel> {
    let (cfg, warnings) = ModelConfig::from_yaml(root)?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    // The checkpoint holds the CMVN statistics, so their file need not exist here.
    let mut model = AsrModel::without_cmvn_stats(&cfg, DType::F32, &mut Rng::new(0))?;
    load_checkpoint(&model, checkpoint, true)?;
    model.train(false);
    Ok(model)
}

/// One mode's results for a batch: `(key, token ids)` per utterance.
pub type ModeResults = Vec<(String, Vec<usize>)>;

/// The search settings of [`decode_batch`].
#[derive(Clone, Copy, Debug)]
pub struct DecodeOptions {
    /// Beam of prefix beam search, attention beam search and the rescoring n-best.
    pub beam_size: usize,
    /// Attention beam search's length penalty (score / len^penalty).
    pub penalty: f64,
    /// CTC weight in attention rescoring.
    pub ctc_weight: f64,
    /// Right-to-left weight in attention rescoring.
    pub reverse_weight: f64,
    /// CTC weight of joint CTC/attention beam search (0: attention only).
    pub attention_ctc_weight: f64,
    /// Subtracted from the CTC blank logit before the log-softmax.
    pub blank_penalty: f64,
    /// Chunked decoding's chunk size and left chunks (full context by default).
    pub chunk: ChunkRequest,
    /// Encode chunk by chunk with the caches.
    pub simulate_streaming: bool,
    /// The model's device: each batch is moved there before encoding.
    pub device: Device,
    /// The half type of autocast (`--dtype fp16/bf16` on the GPU), if any.
    pub autocast: Option<DType>,
}

/// Decodes one batch in every mode: for each mode, `(key, token ids)` per utterance.
pub fn decode_batch(model: &AsrModel, batch: &Batch, modes: &[String], opts: &DecodeOptions) -> Result<Vec<ModeResults>> {
    let DecodeOptions { beam_size, penalty, ctc_weight, reverse_weight, attention_ctc_weight, blank_penalty, chunk, simulate_streaming, device, autocast } =
        *opts;
    let batch = &batch.to_device(&device)?;
    autograd::no_grad(|| {
        ops::autocast_params(autocast, &if autocast.is_some() { model.layer_groups() } else { Vec::new() }, || {
            let (enc, enc_lens) = model.encode_with(&batch.feats, &batch.feats_lengths, chunk, simulate_streaming).map_err(|e| {
                if simulate_streaming {
                    Error::invalid("recognize", format!("streaming the batch of {}: {e}", batch.keys.join(", ")))
                } else {
                    e
                }
            })?;
            let lp = model.ctc_log_probs_with_blank_penalty(&enc, blank_penalty)?;
            let (t, v) = (lp.dims()[1], lp.dims()[2]);
            let flat: Vec<f32> = lp.to_f64_vec()?.into_iter().map(|x| x as f32).collect();
            let blank = model.ctc.blank;
            let mut out: Vec<ModeResults> = vec![Vec::with_capacity(batch.len()); modes.len()];
            for (b, key) in batch.keys.iter().enumerate() {
                let n = enc_lens[b].max(1).min(t);
                let rows = &flat[b * t * v..(b * t + n) * v];
                let enc_b = ops::narrow(&ops::narrow(&enc, 0, b, 1)?, 1, 0, n)?;
                let mut nbest: Option<Vec<Hypothesis>> = None;
                for (m, mode) in modes.iter().enumerate() {
                    let tokens = match mode.as_str() {
                        "ctc_greedy_search" => ctc_greedy_search(rows, v, blank)?.tokens,
                        "attention" => {
                            let beam = BeamOptions { beam_size, length_penalty: penalty, max_len: n, sos: model.sos, eos: model.eos };
                            let ctc =
                                (attention_ctc_weight > 0.0).then_some(CtcJoint { rows: CtcRows { rows, vocab: v, blank }, weight: attention_ctc_weight });
                            attention_beam_search_joint(model, &enc_b, n, beam, ctc)?.tokens
                        }
                        "ctc_prefix_beam_search" | "attention_rescoring" => {
                            if nbest.is_none() {
                                nbest = Some(ctc_prefix_beam_search(rows, v, blank, beam_size)?);
                            }
                            let hyps = nbest.as_deref().unwrap_or(&[]);
                            if mode == "attention_rescoring" {
                                attention_rescoring(model, &enc_b, n, hyps, ctc_weight, reverse_weight)?.tokens
                            } else {
                                hyps.first().map(|h| h.tokens.clone()).unwrap_or_default()
                            }
                        }
                        other => return Err(Error::invalid("recognize", format!("unknown mode `{other}`"))),
                    };
                    out[m].push((key.clone(), tokens));
                }
            }
            Ok(out)
        })
    })
}

/// Each key's position in a raw list (JSON or `key wav txt` lines); empty
/// for shard lists, whose keys live inside the tars (they keep loader order,
/// which is list order across batches).
fn input_order(list: &DataList) -> HashMap<String, usize> {
    let mut order = HashMap::new();
    if list.format == ListFormat::Raw {
        for (i, line) in list.lines.iter().enumerate() {
            if let Ok(u) = parse_raw_line(line, i + 1) {
                order.entry(u.key).or_insert(i);
            }
        }
    }
    order
}

/// The keys of the first skips with their reasons, for the summary.
fn skipped_keys(skips: &crate::data::SkipStats) -> String {
    let shown: Vec<String> = skips.first().iter().map(|s| format!("{} ({})", s.key, s.reason)).collect();
    let more = skips.total().saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// Runs `recognize`, returning a summary to print.
pub fn run_recognize(args: &RecognizeArgs) -> Result<String> {
    check_args(args)?;
    let mut root = load_yaml(&args.config)?;
    for o in &args.override_config {
        apply_override(&mut root, o)?;
    }
    let text =
        serde_yaml_ng::to_string(&root).map_err(|e| Error::ConfigFile { path: args.config.display().to_string(), msg: format!("cannot re-serialize: {e}") })?;
    let data_cfg = DataConfig::from_yaml_str(&text, &args.config.display().to_string())?;
    let model = load_model(&root, &args.checkpoint)?;
    let device = match args.device.as_str() {
        "cuda" => {
            // The local rank as `train` reads it (torchrun, SLURM or Open MPI variables; 0 alone).
            let rank = crate::train::dist::dist_info_from(&|k| std::env::var(k).ok())?.local_rank;
            Device::cuda(rank).map_err(|e| Error::invalid("recognize", format!("--device cuda (LOCAL_RANK {rank}): {e}")))?
        }
        _ => Device::Cpu,
    };
    crate::train::device::move_model(&model, &device)?;
    let autocast = match args.dtype.as_str() {
        "fp16" => Some(DType::F16),
        "bf16" => Some(DType::BF16),
        _ => None,
    };

    let table_path = match (&args.symbol_table, &data_cfg.tokenizer_conf.symbol_table_path) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => return Err(Error::config("tokenizer_conf.symbol_table_path", "missing, and no --symbol_table given")),
    };
    let table = SymbolTable::read(&table_path).map_err(|e| match &args.symbol_table {
        Some(_) => e,
        None => Error::config(
            "tokenizer_conf.symbol_table_path",
            format!("read from {}: {e}; relative paths are taken from the current folder, pass --symbol_table to name the units file", args.config.display()),
        ),
    })?;
    if table.len() != model.vocab_size {
        return Err(Error::Data {
            path: table_path.display().to_string(),
            msg: format!("expected {} symbols (the model's output_dim), found {}", model.vocab_size, table.len()),
        });
    }
    let words = data_cfg.tokenizer_conf.mode.as_deref() == Some("word") || (data_cfg.tokenizer_conf.mode.is_none() && data_cfg.tokenizer_conf.split_with_space);
    let detok = if data_cfg.tokenizer.as_deref() == Some("bpe") { Detokenizer::bpe(&table) } else { Detokenizer::new(&table, words) };

    let mut conf = data_cfg.dataset_conf.for_cv();
    conf.sort = false;
    conf.filter_conf.max_length = 102400.0;
    conf.filter_conf.min_length = 0.0;
    conf.filter_conf.token_max_length = 102400;
    conf.filter_conf.token_min_length = 0;
    conf.batch_conf.batch_type = "static".into();
    conf.batch_conf.batch_size = args.batch_size;
    // An utterance longer than the model's positional table is skipped and
    // reported; every other utterance is decoded and written.
    let (mcfg, _) = ModelConfig::from_yaml(&root)?;
    let processor = Processor::new(&conf, None)?.with_limits(crate::models::limits::data_limits(&mcfg));
    let list = DataList::read(&args.test_data, ListFormat::parse(&args.data_type)?)?;

    let order = input_order(&list);
    let opts = DecodeOptions {
        beam_size: args.beam_size,
        penalty: args.penalty,
        ctc_weight: args.ctc_weight,
        reverse_weight: args.reverse_weight,
        attention_ctc_weight: args.attention_ctc_weight,
        blank_penalty: args.blank_penalty,
        chunk: ChunkRequest { decoding_chunk_size: args.decoding_chunk_size, num_decoding_left_chunks: args.num_decoding_left_chunks },
        simulate_streaming: args.simulate_streaming,
        device,
        autocast,
    };
    let loader = DataLoader::new(list, processor, LoaderConf { num_workers: args.num_workers, partition: false, ..LoaderConf::default() })?;
    // A raw list's utterances are its lines; a shard list's are inside its tars.
    let bar = progress::decode_bar((!order.is_empty()).then_some(order.len()));
    // Per mode: (position in the list, key, text), sorted into list order at the end.
    let mut results: Vec<Vec<(usize, String, String)>> = vec![Vec::new(); args.modes.len()];
    let mut utts = 0usize;
    let mut epoch = loader.epoch(0);
    for batch in epoch.by_ref() {
        utts += batch.len();
        for (m, res) in decode_batch(&model, &batch, &args.modes, &opts)?.into_iter().enumerate() {
            for (key, ids) in res {
                let pos = order.get(&key).copied().unwrap_or(usize::MAX);
                results[m].push((pos, key, detok.text(&ids)?));
            }
        }
        bar.inc(batch.len() as u64);
    }
    bar.finish();
    let lines: Vec<String> = results
        .into_iter()
        .map(|mut r| {
            r.sort_by_key(|(pos, _, _)| *pos);
            r.into_iter().map(|(_, key, text)| format!("{key} {text}\n")).collect()
        })
        .collect();
    let mut summary = String::new();
    for (mode, text) in args.modes.iter().zip(&lines) {
        let dir = args.result_dir.join(mode);
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io { path: dir.display().to_string(), source })?;
        let path = dir.join("text");
        std::fs::write(&path, text).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        summary.push_str(&format!("{mode}: {utts} utterances -> {}\n", path.display()));
    }
    if let Some(s) = epoch.summary() {
        if s.skips.total() > 0 {
            summary.push_str(&format!("recognize: {} of {}: {}\n", s.skips.summary(), args.test_data.display(), skipped_keys(&s.skips)));
        }
    }
    Ok(summary)
}
