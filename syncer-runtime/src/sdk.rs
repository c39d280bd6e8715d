//! The plugin-author API, mirroring the vcluster-sdk (and its `Car` tutorial) in Rust.
//!
//! - [`Syncer`]: one namespaced type synced from the virtual cluster to the host namespace, with
//!   the tutorial's three methods [`Syncer::sync_to_host`] (virtual object without host copy),
//!   [`Syncer::sync`] (both exist) and [`Syncer::sync_to_virtual`] (host copy without virtual
//!   object). The [`crate::controller`] that drives it owns the lifecycle table (object-uid
//!   mismatch → host replaced; a host object not managed by this
//!   vCluster → never touched; terminating virtual objects → host copy deleted, never
//!   recreated), so a syncer only says *what* the host copy looks like.
//! - [`NamespacedTranslator`]: `translate_metadata` / `translate_metadata_update`, built by
//!   [`RegisterContext::translator`].
//! - [`SyncContext::sync_to_host_create`] / [`SyncContext::sync_to_host_update`]: the writes,
//!   with the [`ClientHook`]s of the type applied first; `sync_to_host_update(.., None)` and an
//!   update that changes nothing send no request.
//! - [`ClientHook`]: the eight `mutate_{create,update,delete,get}_{virtual,physical}` points.
//! - [`Plugin`]: `Plugin::init()` (or [`Plugin::new`]), [`Plugin::register`],
//!   [`Plugin::register_hook`], [`Plugin::start`].
//!
//! The declarative runtime ([`crate::runtime`]) is built from these same parts: its
//! [`crate::syncer::DeclarativeSyncer`] implements [`Syncer`] and its
//! [`crate::hooks::DeclarativeHook`] implements [`ClientHook`].
//!
//! This module only gathers the public names; they are defined by concern: the hook points in
//! [`crate::hooks`], the [`Syncer`] trait in [`crate::syncer`], the contexts and write helpers
//! in `context.rs`, plugin start-up and client construction in `plugin.rs`.
//!
//! ```no_run
//! # use vcp_syncer_runtime::sdk::*;
//! # async fn example(car_syncer: impl FnOnce(&RegisterContext) -> vcp_syncer_runtime::syncer::DeclarativeSyncer) -> Result<(), vcp_syncer_runtime::Error> {
//! let mut plugin = Plugin::init().await?;
//! let syncer = car_syncer(plugin.context());
//! plugin.register(syncer);
//! plugin.start().await
//! # }
//! ```
//! A complete example is `syncer-runtime/examples/car_syncer.rs`.

pub use crate::context::{RegisterContext, SyncContext, SyncObject, vcluster_owner_uid};
pub use crate::error::HookError;
pub use crate::hooks::{ClientHook, HookPoint, Hooks};
#[cfg(feature = "test-faults")]
pub use crate::plugin::client_with_fault;
pub use crate::plugin::{Plugin, client_from, wait_for_kubeconfig};
pub use crate::syncer::Syncer;
pub use crate::translate::{MetadataUpdate, NamespacedTranslator};
