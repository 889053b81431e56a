//! The fusion switch: which fused kernels replace the compositions of
//! smaller ops they were written against.
//!
//! Every fused op is registered here under one [`Fusion`] family and sits
//! beside the composition it replaces; the composition stays the reference
//! (tests run both and compare outputs and gradients). The families are
//! chosen by `ASRFORGE_FUSION=all|none|attention,convmodule,norm,loss,ffn,posenc,subsampling,qkv` or
//! the config key `fusion:` (the same words; the environment wins, as for
//! every `ASRFORGE_*` switch). The default is `none`: a fused kernel becomes
//! the default only once it has passed on a real GPU and is faster there
//! than its composition (cuda/README.md lists which have passed and what
//! they measured).

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU32, Ordering};

/// A family of fused kernels that can be switched on or off as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fusion {
    /// Flash attention (relative-position, plain, causal and cross).
    Attention,
    /// The Conformer convolution module around its two pointwise GEMMs.
    ConvModule,
    /// Layer norm fused with the residual add before it.
    Norm,
    /// log-softmax fused into the label-smoothing and CTC losses.
    Loss,
    /// The feed-forward block's activation fused with the dropout after it.
    Ffn,
    /// The positional encoding (scale, table rows, cast) fused with its dropout.
    PosEnc,
    /// The conv2d subsampling's bias and ReLU after each product.
    Subsampling,
    /// One GEMM for an attention layer's q, k and v projections (k and v
    /// for cross-attention), read in place by flash attention: acts only
    /// with `attention` on.
    Qkv,
}

impl Fusion {
    /// Every family, in the order of [`Fusion::name`]'s words.
    pub const ALL: [Fusion; 8] =
        [Fusion::Attention, Fusion::ConvModule, Fusion::Norm, Fusion::Loss, Fusion::Ffn, Fusion::PosEnc, Fusion::Subsampling, Fusion::Qkv];

    /// The family's word in `ASRFORGE_FUSION` and `fusion:`.
    pub fn name(self) -> &'static str {
        match self {
            Fusion::Attention => "attention",
            Fusion::ConvModule => "convmodule",
            Fusion::Norm => "norm",
            Fusion::Loss => "loss",
            Fusion::Ffn => "ffn",
            Fusion::PosEnc => "posenc",
            Fusion::Subsampling => "subsampling",
            Fusion::Qkv => "qkv",
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// Bit `f.bit()` set: family `f` on. `UNSET`: not yet read from the environment.
const UNSET: u32 = u32::MAX;
static MASK: AtomicU32 = AtomicU32::new(UNSET);

/// Parses a fusion list: `all`, `none` (or empty), or family words separated
/// by commas. `key` names where the text came from, for the error.
pub fn parse(key: &str, text: &str) -> Result<u32> {
    let t = text.trim();
    match t {
        "all" => return Ok(Fusion::ALL.iter().fold(0, |m, f| m | f.bit())),
        "none" | "" => return Ok(0),
        _ => {}
    }
    let mut mask = 0;
    for w in t.split(',').map(str::trim) {
        match Fusion::ALL.iter().find(|f| f.name() == w) {
            Some(f) => mask |= f.bit(),
            None => {
                let names: Vec<&str> = Fusion::ALL.iter().map(|f| f.name()).collect();
                return Err(Error::config(key, format!("expected all, none or a comma-separated list of {}, found {w:?} in {text:?}", names.join(", "))));
            }
        }
    }
    Ok(mask)
}

/// The families `ASRFORGE_FUSION` asks for, if it is set.
pub fn from_env() -> Result<Option<u32>> {
    match std::env::var("ASRFORGE_FUSION") {
        Ok(v) => parse("ASRFORGE_FUSION", &v).map(Some),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::config("ASRFORGE_FUSION", format!("expected UTF-8 text, found {v:?}"))),
    }
}

/// Sets the switch for the whole process: `ASRFORGE_FUSION` when set, else
/// the config's `fusion:` text when given, else none. The CLI calls this
/// once at start; a bad word in either is an error naming its source.
pub fn configure(config_value: Option<&str>) -> Result<()> {
    let mask = match (from_env()?, config_value) {
        (Some(m), _) => m,
        (None, Some(text)) => parse("fusion", text)?,
        (None, None) => 0,
    };
    MASK.store(mask, Ordering::Relaxed);
    Ok(())
}

/// Sets the switch to exactly these families (tests and benches compare a
/// fused kernel with its composition by flipping it).
pub fn set_enabled(families: &[Fusion]) {
    MASK.store(families.iter().fold(0, |m, f| m | f.bit()), Ordering::Relaxed);
}

/// The families switched on now.
pub fn enabled_families() -> Vec<Fusion> {
    Fusion::ALL.iter().copied().filter(|f| enabled(*f)).collect()
}

/// Whether family `f` runs fused. Before [`configure`] or [`set_enabled`]
/// it reads `ASRFORGE_FUSION` once (an unreadable value is reported once on
/// stderr and treated as `none`; the CLI has already refused it).
pub fn enabled(f: Fusion) -> bool {
    let mut m = MASK.load(Ordering::Relaxed);
    if m == UNSET {
        let m0 = from_env()
            .unwrap_or_else(|e| {
                eprintln!("warning: {e}; running every composition unfused");
                None
            })
            .unwrap_or(0);
        // Only the first reader stores; a concurrent configure() wins.
        let _ = MASK.compare_exchange(UNSET, m0, Ordering::Relaxed, Ordering::Relaxed);
        m = MASK.load(Ordering::Relaxed);
    }
    m & f.bit() != 0
}

/// The switch as text (`none`, `all`, or the family words), for logs.
pub fn describe() -> String {
    let on = enabled_families();
    match on.len() {
        0 => "none".into(),
        n if n == Fusion::ALL.len() => "all".into(),
        _ => on.iter().map(|f| f.name()).collect::<Vec<_>>().join(","),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_none_and_lists_and_names_a_bad_word() {
        assert_eq!(parse("k", "all").unwrap(), 0b1111_1111);
        assert_eq!(parse("k", "ffn").unwrap(), Fusion::Ffn.bit());
        assert_eq!(parse("k", "posenc").unwrap(), Fusion::PosEnc.bit());
        assert_eq!(parse("k", "subsampling,posenc").unwrap(), Fusion::Subsampling.bit() | Fusion::PosEnc.bit());
        assert_eq!(parse("k", "attention,qkv").unwrap(), Fusion::Attention.bit() | Fusion::Qkv.bit());
        assert_eq!(parse("k", "none").unwrap(), 0);
        assert_eq!(parse("k", " ").unwrap(), 0);
        assert_eq!(parse("k", "attention, loss").unwrap(), Fusion::Attention.bit() | Fusion::Loss.bit());
        assert_eq!(parse("k", "convmodule,norm").unwrap(), Fusion::ConvModule.bit() | Fusion::Norm.bit());
        let e = parse("fusion", "attention,flash").unwrap_err().to_string();
        assert!(
            e.contains("fusion") && e.contains("\"flash\"") && e.contains("convmodule") && e.contains("ffn") && e.contains("posenc") && e.contains("qkv"),
            "{e}"
        );
    }
}
