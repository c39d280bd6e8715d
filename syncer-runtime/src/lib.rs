#![warn(missing_docs)]
//! Rust vcluster-sdk and the declarative runtime of vcluster-plugin-operator.
//!
//! - [`translate`]: vCluster-compatible names, labels and annotations of host objects (pure);
//! - [`hooks`]: the declarative `hooks[]` of a `VClusterPlugin` applied to JSON objects (pure);
//! - [`syncer`]: a generic virtual-to-host syncer over `DynamicObject`;
//! - [`pods`]: physical pod hooks on the host pods a vCluster made (`--pod-sync=hooks`);
//! - [`runtime`]: the declarative runtime ([`runtime::run`]) that reads its `VClusterPlugin`
//!   and runs the syncers and hooks it declares, reporting into its status.
//!
//! The contract is `shared/DESIGN.md`, section "Runtime contract".

pub mod error;
pub mod hooks;
pub mod patch;
pub mod pods;
mod queue;
pub mod runtime;
pub mod stats;
pub mod syncer;
pub mod translate;

pub use error::Error;
pub use runtime::{Config, PodSync, run};
