//! The model side of a WeNet-style `train.yaml`: `input_dim`, `output_dim`,
//! `encoder`/`encoder_conf`, `decoder`/`decoder_conf`, `model_conf`,
//! `cmvn`/`cmvn_conf`, `ctc_conf`. Parsed from the whole file's YAML value:
//! the sections of other parts (dataset, optimizer, scheduler, ...) are
//! skipped silently, unknown keys produce warnings, and a wrong type is an
//! error naming the key. Defaults are WeNet's.

use super::yaml::Section;
pub use super::yaml::{apply_override, describe, load_yaml};
use crate::error::{Error, Result};
use serde_yaml_ng::Value;

/// Top-level keys that belong to other parts of the trainer.
const OTHER_PARTS: &[&str] = &[
    "dataset",
    "dataset_conf",
    "optim",
    "optim_conf",
    "scheduler",
    "scheduler_conf",
    "grad_clip",
    "accum_grad",
    "max_epoch",
    "log_interval",
    "save_interval",
    "train_engine",
    "tokenizer",
    "tokenizer_conf",
    "save_states",
    "use_amp",
    "dtype",
    "deepspeed_config",
    "ds_dtype",
    "init_infos",
    "enable_validation",
    "precision",
    "ipu_conf",
    "vocab_size",
    "ctc",
    "model_dir",
    "checkpoint",
    "tensorboard_dir",
    "train_data",
    "cv_data",
    "lora_conf",
    "use_lora",
    "seed",
    "timeout",
];

/// A pointwise nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// `x·σ(x)`.
    Swish,
    /// Exact GELU.
    Gelu,
    /// `tanh`.
    Tanh,
}

impl Activation {
    fn parse(key: &str, s: &str) -> Result<Self> {
        match s {
            "relu" => Ok(Activation::Relu),
            "swish" => Ok(Activation::Swish),
            "gelu" => Ok(Activation::Gelu),
            "tanh" => Ok(Activation::Tanh),
            _ => Err(Error::config(key, format!("expected one of relu, swish, gelu, tanh, found {s:?}"))),
        }
    }
}

/// The encoder's input layer (`input_layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputLayer {
    /// `linear`: Linear + LayerNorm + Dropout, no subsampling.
    Linear,
    /// `conv2d`: 1/4 subsampling.
    Conv2d,
    /// `conv2d6`: 1/6 subsampling.
    Conv2d6,
    /// `conv2d8`: 1/8 subsampling.
    Conv2d8,
}

/// The positional encoding (`pos_enc_layer_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PosEncType {
    /// `abs_pos`: `x·√d + PE`.
    Abs,
    /// `rel_pos`: `x·√d`, and the table for relative attention.
    Rel,
    /// `no_pos`: the input unchanged and a zero table.
    None,
}

/// Self-attention kind (`selfattention_layer_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelfAttnType {
    /// `selfattn`.
    Plain,
    /// `rel_selfattn`.
    Rel,
}

/// The normalisation in the conformer convolution module (`cnn_module_norm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvNorm {
    /// `batch_norm`.
    BatchNorm,
    /// `layer_norm`.
    LayerNorm,
}

/// Which encoder (`encoder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderType {
    /// `conformer`.
    Conformer,
    /// `transformer`.
    Transformer,
}

/// Which decoder (`decoder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderType {
    /// `transformer`.
    Transformer,
    /// `bitransformer`: left-to-right and right-to-left decoders.
    BiTransformer,
}

/// `encoder_conf`.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    /// Model dim (attention dim).
    pub output_size: usize,
    /// Attention heads.
    pub attention_heads: usize,
    /// Hidden units of the feed-forward blocks.
    pub linear_units: usize,
    /// Number of blocks.
    pub num_blocks: usize,
    /// Dropout on residual branches and inside the FFN.
    pub dropout_rate: f64,
    /// Dropout after the positional encoding.
    pub positional_dropout_rate: f64,
    /// Dropout on attention weights.
    pub attention_dropout_rate: f64,
    /// The input (subsampling) layer.
    pub input_layer: InputLayer,
    /// The positional encoding.
    pub pos_enc_layer_type: PosEncType,
    /// Pre-norm (true) or post-norm blocks.
    pub normalize_before: bool,
    /// Whether `after_norm` is applied (with pre-norm).
    pub final_norm: bool,
    /// Conformer: a second, half-weighted FFN before attention.
    pub macaron_style: bool,
    /// Conformer: the convolution module.
    pub use_cnn_module: bool,
    /// Depthwise kernel of the convolution module.
    pub cnn_module_kernel: usize,
    /// Norm inside the convolution module.
    pub cnn_module_norm: ConvNorm,
    /// Causal (left-padded) depthwise convolution.
    pub causal: bool,
    /// FFN and convolution-module activation.
    pub activation_type: Activation,
    /// Plain or relative-position self-attention.
    pub selfattention_layer_type: SelfAttnType,
    /// Recompute each block in backward instead of keeping its activations.
    pub gradient_checkpointing: bool,
    /// LayerNorm epsilon.
    pub norm_eps: f64,
    /// Epsilon of the convolution-module norm.
    pub conv_norm_eps: f64,
    /// U2 training: a chunk mask drawn per batch (WeNet's add_optional_chunk_mask).
    pub use_dynamic_chunk: bool,
    /// With `use_dynamic_chunk`: a random number of left chunks too.
    pub use_dynamic_left_chunk: bool,
    /// A fixed chunk size for training and decoding (0: none; ignored with `use_dynamic_chunk`).
    pub static_chunk_size: usize,
    /// Mask the convolution module's input and output only, as WeNet does
    /// (padded frames then leak `glu(bias)` into the depthwise conv); the
    /// default (false) also zeroes padded frames after the GLU.
    pub wenet_conv_masking: bool,
}

/// `decoder_conf`.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// Attention heads.
    pub attention_heads: usize,
    /// Hidden units of the feed-forward blocks.
    pub linear_units: usize,
    /// Number of blocks.
    pub num_blocks: usize,
    /// Blocks of the right-to-left decoder (bitransformer only).
    pub r_num_blocks: usize,
    /// Dropout on residual branches and inside the FFN.
    pub dropout_rate: f64,
    /// Dropout after the positional encoding.
    pub positional_dropout_rate: f64,
    /// Dropout on self-attention weights.
    pub self_attention_dropout_rate: f64,
    /// Dropout on cross-attention weights.
    pub src_attention_dropout_rate: f64,
    /// Pre-norm (true) or post-norm blocks.
    pub normalize_before: bool,
    /// FFN and convolution-module activation.
    pub activation_type: Activation,
    /// Recompute each block in backward instead of keeping its activations.
    pub gradient_checkpointing: bool,
    /// LayerNorm epsilon.
    pub norm_eps: f64,
}

/// `model_conf`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelOptions {
    /// Weight of the CTC loss (the attention loss gets 1 − ctc_weight).
    pub ctc_weight: f64,
    /// Label smoothing of the attention loss.
    pub lsm_weight: f64,
    /// Divide the attention loss by the token count instead of the batch size.
    pub length_normalized_loss: bool,
    /// Weight of the right-to-left decoder loss.
    pub reverse_weight: f64,
    /// Target padding id (−1).
    pub ignore_id: i64,
}

/// `cmvn: global_cmvn` with its `cmvn_conf`.
#[derive(Clone, Debug, PartialEq)]
pub struct CmvnConfig {
    /// Path of the statistics.
    pub cmvn_file: String,
    /// Whether the statistics are WeNet JSON.
    pub is_json_cmvn: bool,
}

/// Everything needed to build an [`super::AsrModel`].
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Feature dim (fbank bins).
    pub input_dim: usize,
    /// Vocabulary size.
    pub output_dim: usize,
    /// The encoder.
    pub encoder: EncoderType,
    /// Encoder options.
    pub encoder_conf: EncoderConfig,
    /// The decoder.
    pub decoder: DecoderType,
    /// Decoder options.
    pub decoder_conf: DecoderConfig,
    /// Loss options.
    pub model_conf: ModelOptions,
    /// Global CMVN, if configured.
    pub cmvn: Option<CmvnConfig>,
    /// The CTC blank id.
    pub ctc_blank_id: usize,
    /// Start-of-sentence id (`tokenizer_conf.special_tokens.<sos>`, else vocab − 1).
    pub sos: usize,
    /// End-of-sentence id (`tokenizer_conf.special_tokens.<eos>`, else vocab − 1).
    pub eos: usize,
}

impl ModelConfig {
    /// Reads the model config from a whole `train.yaml`; returns it with the warnings.
    pub fn from_yaml(root: &Value) -> Result<(ModelConfig, Vec<String>)> {
        let mut w = Vec::new();
        let mut top = Section::root(root)?;
        let output_dim = top.usize_req("output_dim")?;
        let input_dim = match top.raw("input_dim") {
            Some(_) => top.usize_req("input_dim")?,
            // WeNet's trainer fills input_dim from the fbank size.
            None => {
                let fb = root.get("dataset_conf").and_then(|d| d.get("fbank_conf")).and_then(|f| f.get("num_mel_bins")).and_then(Value::as_u64);
                fb.map(|n| n as usize).ok_or_else(|| Error::config("input_dim", "missing (and no dataset_conf.fbank_conf.num_mel_bins to take it from)"))?
            }
        };
        let encoder = match top.str_or("encoder", "conformer")?.as_str() {
            "conformer" => EncoderType::Conformer,
            "transformer" => EncoderType::Transformer,
            other => return Err(Error::config("encoder", format!("expected conformer or transformer, found {other:?}"))),
        };
        let decoder = match top.str_or("decoder", "bitransformer")?.as_str() {
            "transformer" => DecoderType::Transformer,
            "bitransformer" => DecoderType::BiTransformer,
            other => return Err(Error::config("decoder", format!("expected transformer or bitransformer, found {other:?}"))),
        };
        let model = top.str_or("model", "asr_model")?;
        if model != "asr_model" {
            return Err(Error::config("model", format!("only asr_model is supported, found {model:?}")));
        }
        let cmvn = match top.raw("cmvn").map(|v| v.as_str()) {
            None => None,
            Some(Some("global_cmvn")) => {
                let mut c = Section::of(root, "cmvn_conf")?;
                let file = c.str_or("cmvn_file", "")?;
                if file.is_empty() {
                    return Err(Error::config("cmvn_conf.cmvn_file", "missing (cmvn is global_cmvn)"));
                }
                let is_json_cmvn = c.bool_or("is_json_cmvn", true)?;
                c.finish(&[], &mut w);
                Some(CmvnConfig { cmvn_file: file, is_json_cmvn })
            }
            Some(other) => return Err(Error::config("cmvn", format!("expected global_cmvn or null, found {other:?}"))),
        };
        top.raw("cmvn_conf");
        let mut ctc = Section::of(root, "ctc_conf")?;
        let ctc_blank_id = ctc.usize_or("ctc_blank_id", 0)?;
        ctc.finish(&[], &mut w);
        top.raw("ctc_conf");
        let encoder_conf = parse_encoder(root, encoder, &mut w)?;
        top.raw("encoder_conf");
        let decoder_conf = parse_decoder(root, &mut w)?;
        top.raw("decoder_conf");
        let model_conf = parse_model_conf(root, &mut w)?;
        top.raw("model_conf");
        let special =
            |name: &str| root.get("tokenizer_conf").and_then(|t| t.get("special_tokens")).and_then(|s| s.get(name)).and_then(Value::as_u64).map(|n| n as usize);
        let last = output_dim.checked_sub(1).ok_or_else(|| Error::config("output_dim", "expected at least 1 output symbol, found 0"))?;
        let (sos, eos) = (special("<sos>").unwrap_or(last), special("<eos>").unwrap_or(last));
        for (k, id) in [("<sos>", sos), ("<eos>", eos), ("ctc_blank_id", ctc_blank_id)] {
            if id >= output_dim {
                return Err(Error::config(k, format!("id {id} is outside the vocabulary of output_dim {output_dim}")));
            }
        }
        top.finish(OTHER_PARTS, &mut w);
        let cfg = ModelConfig { input_dim, output_dim, encoder, encoder_conf, decoder, decoder_conf, model_conf, cmvn, ctc_blank_id, sos, eos };
        Ok((cfg, w))
    }
}

impl EncoderConfig {
    /// The options an empty `encoder_conf` gives an encoder of `kind` (the
    /// parser's defaults, which follow WeNet's): a starting point for
    /// building blocks in code, `EncoderConfig { output_size: 64,
    /// ..EncoderConfig::defaults(EncoderType::Conformer)? }`.
    pub fn defaults(kind: EncoderType) -> Result<EncoderConfig> {
        parse_encoder(&Value::Null, kind, &mut Vec::new())
    }
}

fn parse_encoder(root: &Value, kind: EncoderType, w: &mut Vec<String>) -> Result<EncoderConfig> {
    let conformer = kind == EncoderType::Conformer;
    let mut s = Section::of(root, "encoder_conf")?;
    let input_layer = match s.str_or("input_layer", "conv2d")?.as_str() {
        "linear" => InputLayer::Linear,
        "conv2d" => InputLayer::Conv2d,
        "conv2d6" => InputLayer::Conv2d6,
        "conv2d8" => InputLayer::Conv2d8,
        o => return Err(Error::config(s.key("input_layer"), format!("expected linear, conv2d, conv2d6 or conv2d8, found {o:?}"))),
    };
    let pos_enc_layer_type = match s.str_or("pos_enc_layer_type", if conformer { "rel_pos" } else { "abs_pos" })?.as_str() {
        "abs_pos" => PosEncType::Abs,
        "rel_pos" => PosEncType::Rel,
        "no_pos" => PosEncType::None,
        o => return Err(Error::config(s.key("pos_enc_layer_type"), format!("expected abs_pos, rel_pos or no_pos, found {o:?}"))),
    };
    let selfattention_layer_type = match s.str_or("selfattention_layer_type", if conformer { "rel_selfattn" } else { "selfattn" })?.as_str() {
        "selfattn" => SelfAttnType::Plain,
        "rel_selfattn" => SelfAttnType::Rel,
        o => return Err(Error::config(s.key("selfattention_layer_type"), format!("expected selfattn or rel_selfattn, found {o:?}"))),
    };
    let cnn_module_norm = match s.str_or("cnn_module_norm", "batch_norm")?.as_str() {
        "batch_norm" => ConvNorm::BatchNorm,
        "layer_norm" => ConvNorm::LayerNorm,
        o => return Err(Error::config(s.key("cnn_module_norm"), format!("expected batch_norm or layer_norm, found {o:?}"))),
    };
    let act = s.str_or("activation_type", if conformer { "swish" } else { "relu" })?;
    let activation_type = Activation::parse(&s.key("activation_type"), &act)?;
    let c = EncoderConfig {
        output_size: s.usize_or("output_size", 256)?,
        attention_heads: s.usize_or("attention_heads", 4)?,
        linear_units: s.usize_or("linear_units", 2048)?,
        num_blocks: s.usize_or("num_blocks", 6)?,
        dropout_rate: s.rate_or("dropout_rate", 0.1)?,
        positional_dropout_rate: s.rate_or("positional_dropout_rate", 0.1)?,
        attention_dropout_rate: s.rate_or("attention_dropout_rate", 0.0)?,
        input_layer,
        pos_enc_layer_type,
        normalize_before: s.bool_or("normalize_before", true)?,
        final_norm: s.bool_or("final_norm", true)?,
        macaron_style: conformer && s.bool_or("macaron_style", true)?,
        use_cnn_module: conformer && s.bool_or("use_cnn_module", true)?,
        cnn_module_kernel: s.usize_or("cnn_module_kernel", 15)?,
        cnn_module_norm,
        causal: s.bool_or("causal", false)?,
        activation_type,
        selfattention_layer_type,
        gradient_checkpointing: s.bool_or("gradient_checkpointing", false)?,
        norm_eps: s.f64_or("norm_eps", 1e-5)?,
        conv_norm_eps: s.f64_or("conv_norm_eps", 1e-5)?,
        use_dynamic_chunk: s.bool_or("use_dynamic_chunk", false)?,
        use_dynamic_left_chunk: s.bool_or("use_dynamic_left_chunk", false)?,
        static_chunk_size: s.usize_or("static_chunk_size", 0)?,
        wenet_conv_masking: s.bool_or("wenet_conv_masking", false)?,
    };
    if c.attention_heads == 0 || c.output_size % c.attention_heads != 0 {
        return Err(Error::config(s.key("output_size"), format!("{} is not a multiple of attention_heads {}", c.output_size, c.attention_heads)));
    }
    if c.use_cnn_module && !c.causal && c.cnn_module_kernel % 2 == 0 {
        return Err(Error::config(s.key("cnn_module_kernel"), format!("expected an odd kernel for a non-causal convolution, found {}", c.cnn_module_kernel)));
    }
    check_only(
        &mut s,
        &[
            ("layer_norm_type", Value::from("layer_norm")),
            ("query_bias", Value::Bool(true)),
            ("key_bias", Value::Bool(true)),
            ("value_bias", Value::Bool(true)),
            ("conv_bias", Value::Bool(true)),
            ("positionwise_conv_kernel_size", Value::from(1)),
            ("conv_inner_factor", Value::from(2)),
            ("mlp_type", Value::from("position_wise_feed_forward")),
            ("mlp_bias", Value::Bool(true)),
        ],
    )?;
    s.ignored("use_sdpa", w, "attention always runs the explicit kernel (same result)");
    s.finish(&["n_expert", "n_expert_activated", "n_kv_head", "head_dim"], w);
    Ok(c)
}

fn parse_decoder(root: &Value, w: &mut Vec<String>) -> Result<DecoderConfig> {
    let mut s = Section::of(root, "decoder_conf")?;
    let act = s.str_or("activation_type", "relu")?;
    let c = DecoderConfig {
        attention_heads: s.usize_or("attention_heads", 4)?,
        linear_units: s.usize_or("linear_units", 2048)?,
        num_blocks: s.usize_or("num_blocks", 6)?,
        r_num_blocks: s.usize_or("r_num_blocks", 0)?,
        dropout_rate: s.rate_or("dropout_rate", 0.1)?,
        positional_dropout_rate: s.rate_or("positional_dropout_rate", 0.1)?,
        self_attention_dropout_rate: s.rate_or("self_attention_dropout_rate", 0.0)?,
        src_attention_dropout_rate: s.rate_or("src_attention_dropout_rate", 0.0)?,
        normalize_before: s.bool_or("normalize_before", true)?,
        activation_type: Activation::parse(&s.key("activation_type"), &act)?,
        gradient_checkpointing: s.bool_or("gradient_checkpointing", false)?,
        norm_eps: s.f64_or("norm_eps", 1e-5)?,
    };
    check_only(
        &mut s,
        &[
            ("input_layer", Value::from("embed")),
            ("use_output_layer", Value::Bool(true)),
            ("src_attention", Value::Bool(true)),
            ("tie_word_embedding", Value::Bool(false)),
            ("layer_norm_type", Value::from("layer_norm")),
            ("query_bias", Value::Bool(true)),
            ("key_bias", Value::Bool(true)),
            ("value_bias", Value::Bool(true)),
            ("src_query_bias", Value::Bool(true)),
            ("src_key_bias", Value::Bool(true)),
            ("src_value_bias", Value::Bool(true)),
            ("mlp_type", Value::from("position_wise_feed_forward")),
            ("mlp_bias", Value::Bool(true)),
        ],
    )?;
    s.ignored("use_sdpa", w, "attention always runs the explicit kernel (same result)");
    s.finish(&["n_expert", "n_expert_activated", "n_kv_head", "head_dim"], w);
    Ok(c)
}

fn parse_model_conf(root: &Value, w: &mut Vec<String>) -> Result<ModelOptions> {
    let mut s = Section::of(root, "model_conf")?;
    let c = ModelOptions {
        ctc_weight: s.rate_or("ctc_weight", 0.5)?,
        lsm_weight: s.f64_or("lsm_weight", 0.0)?,
        length_normalized_loss: s.bool_or("length_normalized_loss", false)?,
        reverse_weight: s.rate_or("reverse_weight", 0.0)?,
        ignore_id: s.i64_or("ignore_id", -1)?,
    };
    if !(0.0..1.0).contains(&c.lsm_weight) {
        return Err(Error::config(s.key("lsm_weight"), format!("expected a value in [0, 1), found {}", c.lsm_weight)));
    }
    check_only(&mut s, &[("apply_non_blank_embedding", Value::Bool(false))])?;
    s.finish(&[], w);
    Ok(c)
}

fn check_only(s: &mut Section, table: &[(&str, Value)]) -> Result<()> {
    for (k, v) in table {
        s.only(k, v)?;
    }
    Ok(())
}
