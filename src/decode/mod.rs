//! Turning model outputs into text and scoring text: CTC search, attention
//! beam search and rescoring, the `recognize` and `compute-cer` commands, CER/WER.

pub mod attention;
pub mod beam;
pub mod cer;
pub mod cli;
pub mod ctc;
pub mod ctc_prefix;
pub mod progress;
pub mod recognize;
