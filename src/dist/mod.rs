//! Moving tensors between processes: the rendezvous store, the
//! `Communicator` trait with its TCP (CPU) and NCCL (GPU) implementations,
//! and the join group that lets uneven data end an epoch on every rank in
//! the same step. `dist` knows no model.

mod census;
pub mod comm;
mod elem;
pub mod groups;
pub mod join;
#[cfg(feature = "cuda")]
pub mod nccl;
mod ring;
pub mod store;
mod store_proto;
pub mod store_server;
pub mod tcp;
mod wire;

pub use comm::{Communicator, ReduceOp};
pub use groups::{init_process_groups, init_process_groups_with, GroupOptions, ProcessGroups};
pub use join::JoinGroup;
#[cfg(feature = "cuda")]
pub use nccl::NcclComm;
pub use store::{rdzv_token_from_env, Store};
pub use store_server::StoreServer;
pub use tcp::TcpCommunicator;
