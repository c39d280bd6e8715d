#![warn(missing_docs)]
//! Rust vcluster-sdk and the declarative runtime of vcluster-plugin-operator.
//!
//! - [`translate`]: vCluster-compatible names, labels and annotations of host objects (pure);
//! - [`hooks`]: the hook points (`ClientHook`, `Hooks`) and the declarative `hooks[]` of a
//!   `VClusterPlugin` applied to JSON objects (pure);
//! - [`sdk`]: the plugin-author API mirroring the vcluster-sdk: [`sdk::Syncer`],
//!   [`sdk::ClientHook`], [`sdk::SyncContext`] (`sync_to_host_create` / `sync_to_host_update`),
//!   [`sdk::Plugin`] (init / register / start);
//! - [`controller`]: the controller that drives a `Syncer` (the lifecycle table), run by the
//!   one driver of watches, compact caches, work queue and workers that every syncer uses;
//! - [`syncer`]: the `Syncer` trait and the declarative syncer of one `syncedTypes[]` entry;
//! - [`from_host`]: host-to-virtual (`FromHost`) syncing;
//! - [`pod_update`]: what a hook may change on an existing pod (pure);
//! - [`pods`]: physical pod hooks on the host pods a vCluster made (`--pod-sync=hooks`);
//! - `write` (internal): the one write path of every syncer: hooks, guarded merge patch, field
//!   manager, write count and own-write tracking;
//! - [`v2`]: vCluster's v2 plugin protocol (go-plugin + gRPC `pluginv2.Plugin`), spoken by
//!   [`sdk::Plugin`] and the runtime binary when vCluster starts them from `/plugins`;
//! - [`heap`]: the binary's heap given back to the kernel after a burst of reconciles;
//! - [`metrics`]: the runtime's counters, served on `/metrics` with `/healthz` when
//!   [`Config::metrics_bind_address`] is set ([`listener`]: a port it cannot listen on is
//!   reported and tried again, never fatal);
//! - [`runtime`]: the declarative runtime ([`runtime::run`]) that reads its `VClusterPlugin`
//!   and runs the syncers and hooks it declares, reporting into its status ([`status`], pure).
//!
//! What it does for a plugin author: the README, "Syncing real custom resources" and "Writing a
//! plugin in Rust"; where each rule lives: ARCHITECTURE.md.

pub mod acceptance;
mod cache;
mod context;
pub mod controller;
mod driver;
pub mod error;
pub mod from_host;
pub mod heap;
pub mod hooks;
pub mod listener;
pub mod metrics;
mod own_writes;
pub mod patch;
pub mod patches;
mod plugin;
pub mod pod_update;
pub mod pods;
pub mod produced;
mod queue;
pub mod retry;
pub mod runtime;
pub mod sdk;
pub mod stats;
pub mod status;
pub mod syncer;
pub mod translate;
pub mod v2;
mod vanish;
mod write;

pub use error::Error;
pub use runtime::{Config, PodSync, run};
pub use sdk::{ClientHook, HookPoint, Plugin, RegisterContext, SyncContext, Syncer};
pub use translate::NamespacedTranslator;
