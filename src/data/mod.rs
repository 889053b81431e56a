//! The data pipeline: WeNet data lists and shards → decoded audio → fbank →
//! augmentation → sorted, padded [`Batch`]es on worker threads.
//!
//! Uses only `tensor` and `error` (layer 3 in DESIGN.md): it builds batches
//! and never touches the tape.

pub mod audio;
pub mod batch;
pub mod bucket;
pub mod cli;
pub mod cmvn;
pub mod config;
pub mod fbank;
pub mod feats_dump;
pub mod filter;
pub mod limits;
pub mod list;
pub mod loader;
pub mod par;
pub mod process;
pub mod resample;
pub mod sentencepiece;
pub mod shard;
pub mod skip;
pub mod specaug;
pub mod tokenizer;

pub use batch::Batch;
pub use config::{DataConfig, DatasetConf};
pub use limits::ModelLimits;
pub use list::{DataList, ListFormat};
pub use loader::{DataLoader, EpochIter, EpochSummary, LoaderConf};
pub use process::{Processor, Sample};
pub use skip::{Skip, SkipReason, SkipStats};
pub use tokenizer::{SymbolTable, TokenizeMode, Tokenizer};
