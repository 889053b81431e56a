//! Turning model outputs into text and scoring text: CTC search and CER/WER.

pub mod cer;
pub mod cli;
pub mod ctc;
