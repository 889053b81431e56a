//! Moving tensors between processes: the rendezvous store, the
//! `Communicator` trait with its TCP (CPU) and NCCL (GPU) implementations,
//! and the join group that lets uneven data end an epoch on every rank in
//! the same step. `dist` knows no model.

pub mod comm;

pub use comm::{Communicator, ReduceOp};
