//! One `produced` entry of a synced type: what [`run`](super::run) is given
//! ([`ProducedOptions`]) and what it keeps while it runs ([`Produced`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::api::{ApiResource, DynamicObject};
use kube::core::Selector;

use crate::cache::Cache;
use crate::driver::ConflictReporter;
use crate::hooks::Hooks;
use crate::stats::TypeStats;
use crate::translate::NamespacedTranslator;
use crate::write::Writer;

use super::claims::Claims;
use super::index::Index;

/// Everything [`run`](super::run) needs.
#[derive(Clone)]
pub struct ProducedOptions {
    /// Client of the host cluster.
    pub host: Client,
    /// Client of the virtual cluster.
    pub virtual_: Client,
    /// The synced (`ToHost`) type's translator: vCluster name, host namespace, its kind.
    pub translator: NamespacedTranslator,
    /// The synced type (the same in both clusters).
    pub source: ApiResource,
    /// Only synced objects matching this label selector (the synced type's) bring anything back.
    pub selector: Option<Selector>,
    /// The produced kind (the same in both clusters, namespaced).
    pub produced: ApiResource,
    /// Path of the name in the synced object (`produced[].namePath`).
    pub name_path: String,
    /// The produced kind's hooks (`CreateVirtual`, `UpdateVirtual`, `DeleteVirtual` are used).
    pub hooks: Hooks,
    /// Statistics of the produced kind, shared with the status reporter.
    pub stats: Arc<TypeStats>,
    /// Every synced object is reconciled again this often.
    pub resync_period: Duration,
    /// Told once about each virtual object in the way of a copy.
    pub on_conflict: Option<ConflictReporter>,
    /// The longest delay between two attempts of a failing watch ([`crate::retry`]).
    pub retry_max: Duration,
    /// The host names declared by every `produced` entry of the runtime's synced types, shared
    /// by them all ([`Claims`]).
    pub claims: Arc<Claims>,
}

/// One `produced` entry of a synced type as the driver runs it: its options, the caches of its
/// four watches, what they told ([`Index`]) and its writer.
pub(super) struct Produced {
    pub(super) opts: ProducedOptions,
    /// `<Kind>.<group>/` of the synced type, the prefix of
    /// [`PRODUCED_FOR_ANNOTATION`](crate::translate::PRODUCED_FOR_ANNOTATION).
    pub(super) for_prefix: String,
    /// This entry in [`Claims`]: `<Kind>.<group>/` of the synced type and the `namePath`
    /// ([`Claims::entry`]).
    pub(super) entry: String,
    /// The produced kind in [`Claims`]: `apiVersion/kind`.
    pub(super) produced_kind: String,
    pub(super) virtual_sources: Cache<DynamicObject>,
    pub(super) host_sources: Cache<DynamicObject>,
    pub(super) host_produced: Cache<DynamicObject>,
    pub(super) virtual_produced: Cache<DynamicObject>,
    pub(super) index: Mutex<Index>,
    pub(super) writer: Writer,
}
