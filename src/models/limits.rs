//! What a model config implies before anything is built: the lengths the
//! encoder can take (for the loader to skip what it cannot) and the size of
//! the model (checked against a limit before any allocation, so an absurd
//! `output_size` is a clear error, not an allocation abort).

use super::config::{ConvNorm, DecoderType, EncoderType, InputLayer, ModelConfig, PosEncType, SelfAttnType};
use super::pos_enc::MAX_LEN;
use super::subsampling::{conv_len, Subsampling};
use crate::data::ModelLimits;
use crate::error::{Error, Result};

/// The environment variable that sets the model size limit, in bytes.
pub const MAX_MODEL_BYTES_ENV: &str = "ASRFORGE_MAX_MODEL_BYTES";

/// The default model size limit: 16 GiB of parameters and buffers (4 billion
/// f32 parameters, several times WeNet's largest models; training adds 3×
/// that for gradients and Adam's moments).
pub const DEFAULT_MAX_MODEL_BYTES: u128 = 16 << 30;

/// The encoder's length limits for the loader: its subsampling convolutions
/// over time, the rows of its positional table (none for `no_pos`) and
/// whether CTC is trained.
pub fn data_limits(cfg: &ModelConfig) -> ModelLimits {
    ModelLimits {
        subsampling: Subsampling::plan_of(cfg.encoder_conf.input_layer).to_vec(),
        max_encoder_frames: (cfg.encoder_conf.pos_enc_layer_type != PosEncType::None).then_some(MAX_LEN),
        ctc: cfg.model_conf.ctc_weight > 0.0,
    }
}

/// Element counts of a model, computed from its config.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelSize {
    /// Trainable parameters (what `num_parameters` counts once built).
    pub parameters: u128,
    /// Buffers (positional tables, CMVN statistics, BatchNorm statistics).
    pub buffers: u128,
}

impl ModelSize {
    /// Bytes of parameters and buffers in f32, plus the f64 scratch of the largest positional table.
    pub fn bytes(&self, d: u128) -> u128 {
        (self.parameters + self.buffers) * 4 + MAX_LEN as u128 * d * 8
    }
}

fn linear(i: u128, o: u128, bias: bool) -> u128 {
    i * o + if bias { o } else { 0 }
}

/// The element counts of the model `cfg` describes (u128: no overflow for any config).
pub fn model_size(cfg: &ModelConfig) -> ModelSize {
    let e = &cfg.encoder_conf;
    let d = e.output_size as u128;
    let (idim, vocab) = (cfg.input_dim as u128, cfg.output_dim as u128);
    let ln = 2 * d;
    let mha = 4 * linear(d, d, true);
    let ffn = |u: usize| linear(d, u as u128, true) + linear(u as u128, d, true);
    let (mut params, mut buffers) = (0u128, 0u128);
    // Input layer.
    let plan = Subsampling::plan_of(e.input_layer);
    if e.input_layer == InputLayer::Linear {
        params += linear(idim, d, true) + ln;
    } else {
        let mut f = cfg.input_dim;
        for (i, &(k, s)) in plan.iter().enumerate() {
            let cin = if i == 0 { 1 } else { d };
            params += cin * d * (k * k) as u128 + d;
            f = conv_len(f, k, s);
        }
        params += linear(d * f as u128, d, true);
    }
    if e.pos_enc_layer_type != PosEncType::None {
        buffers += MAX_LEN as u128 * d;
    }
    if cfg.cmvn.is_some() {
        buffers += 2 * idim;
    }
    // Encoder blocks.
    let conformer = cfg.encoder == EncoderType::Conformer;
    let mut block = mha + ffn(e.linear_units) + 2 * ln;
    if e.selfattention_layer_type == SelfAttnType::Rel {
        block += linear(d, d, false) + 2 * d;
    }
    if conformer && e.macaron_style {
        block += ffn(e.linear_units) + ln;
    }
    let mut block_buffers = 0;
    if conformer && e.use_cnn_module {
        block += linear(d, 2 * d, true) + d * e.cnn_module_kernel as u128 + d + linear(d, d, true) + 2 * ln + 2 * d;
        if e.cnn_module_norm == ConvNorm::BatchNorm {
            block_buffers += 2 * d + 1;
        }
    }
    params += e.num_blocks as u128 * block + ln;
    buffers += e.num_blocks as u128 * block_buffers;
    // CTC head.
    params += linear(d, vocab, true);
    // Decoders: embedding, blocks, after_norm, output layer, and an absolute positional table each.
    let dc = &cfg.decoder_conf;
    let dblock = 2 * mha + ffn(dc.linear_units) + 3 * ln;
    let decoder = |blocks: usize| vocab * d + blocks as u128 * dblock + ln + linear(d, vocab, true);
    let blocks: &[usize] = match cfg.decoder {
        DecoderType::Transformer => &[dc.num_blocks],
        DecoderType::BiTransformer => &[dc.num_blocks, dc.r_num_blocks],
    };
    for &b in blocks {
        params += decoder(b);
        buffers += MAX_LEN as u128 * d;
    }
    ModelSize { parameters: params, buffers }
}

/// The size limit in bytes: `ASRFORGE_MAX_MODEL_BYTES` when set, else [`DEFAULT_MAX_MODEL_BYTES`].
pub fn max_model_bytes() -> Result<u128> {
    match std::env::var(MAX_MODEL_BYTES_ENV) {
        Err(_) => Ok(DEFAULT_MAX_MODEL_BYTES),
        Ok(v) => v.trim().parse::<u128>().map_err(|_| Error::config(MAX_MODEL_BYTES_ENV, format!("expected a byte count, found {v:?}"))),
    }
}

/// Refuses a config whose model would exceed `limit` bytes, naming the
/// sizes that make it so; runs before any tensor is allocated.
pub fn check_model_size(cfg: &ModelConfig, limit: u128) -> Result<ModelSize> {
    let size = model_size(cfg);
    let bytes = size.bytes(cfg.encoder_conf.output_size as u128);
    if bytes > limit {
        let e = &cfg.encoder_conf;
        return Err(Error::config(
            "encoder_conf.output_size",
            format!(
                "the model would need {:.1} GiB ({} parameters, {} buffer elements; output_size {}, linear_units {}, num_blocks {}, output_dim {}), \
                 expected at most {:.1} GiB (set {MAX_MODEL_BYTES_ENV} to raise the limit)",
                bytes as f64 / (1u64 << 30) as f64,
                size.parameters,
                size.buffers,
                e.output_size,
                e.linear_units,
                e.num_blocks,
                cfg.output_dim,
                limit as f64 / (1u64 << 30) as f64
            ),
        ));
    }
    Ok(size)
}
