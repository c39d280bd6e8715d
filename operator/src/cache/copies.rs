//! The full copies of the workloads plugins target ([`WorkloadCopies`]): what a reconcile
//! reads of a workload beyond its metadata ([`crate::workload::Workload`]: its labels, its pod
//! template's labels and spec, the operator's own `managedFields` entry, the size of its
//! annotations), kept between reconciles so that a converged vCluster is not read again.
//!
//! A copy comes from a GET made by a reconcile of a plugin that targets the workload
//! ([`crate::cache::workload`]) or from the API server's answer to the operator's own apply
//! ([`WorkloadCopies::statefulset`], [`WorkloadCopies::deployment`]). The metadata watch
//! ([`super::meta`]) says which copy is current ([`WorkloadCopies::current`]): the one at the
//! `resourceVersion` the watch last showed, or one of a higher `generation` (the operator's own
//! write the watch has not shown yet, preferred to the older state as the cache's rules say).
//! A copy the watch has moved past is dropped, and the next reconcile reads the workload again.
//!
//! **Bounded:** the copies together hold at most [`COPIES_BUDGET`] bytes of JSON; the least
//! recently used go first. A tenant who aims plugins at its own large workloads therefore never
//! grows the operator's memory past that budget: the copies evicted are read again by the
//! reconciles that need them (a GET each), which costs time, not memory, and no correctness (a
//! GET is never older than a copy).

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use vcp_crds::OPERATOR_FIELD_MANAGER;

use crate::workload::{Workload, WorkloadKind};

/// The most bytes of JSON the copies hold together ([`WorkloadCopies`]): 16 MiB. The vCluster
/// chart's StatefulSet with two plugins is about 5 KiB of JSON (5,108 bytes in
/// `tests/tests/operator_memory_workloads.rs`), so about 3,000 vClusters fit (the copies of a
/// larger fleet are read again when evicted). The budget counts JSON, not the parsed copies'
/// heap, which is of the same order (their strings are the JSON's; the typed pod spec's empty
/// fields add to it).
pub const COPIES_BUDGET: usize = 16 << 20;

/// The full copies of the workloads plugins target, by kind, namespace and name (module docs).
#[derive(Default)]
pub struct WorkloadCopies {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<String, Copy>,
    /// Sum of [`Copy::bytes`].
    bytes: usize,
    /// Counts uses, to find the least recently used copy.
    clock: u64,
}

/// One workload as read or written.
struct Copy {
    /// `metadata.uid` (a recreated workload is another object).
    uid: String,
    /// `metadata.resourceVersion` of the read or the apply's answer.
    resource_version: String,
    /// `metadata.generation`: grows with every change of the spec.
    generation: i64,
    /// What the operator reads of it, `managedFields` reduced to the operator's own entries.
    workload: Workload,
    /// Its size in bytes of JSON ([`json_bytes`]).
    bytes: usize,
    /// [`Inner::clock`] at its last use.
    used: u64,
}

fn key(kind: WorkloadKind, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}", kind.as_str())
}

impl WorkloadCopies {
    /// The copy of the workload whose cached metadata is `meta` (kind `kind`), when it is
    /// current: the same object (`uid`), and the version the watch shows (`resourceVersion`)
    /// or a newer spec (`generation`: the operator's own write, not yet shown by the watch).
    /// A copy that is not current is dropped: the caller reads the workload again.
    pub fn current(&self, kind: WorkloadKind, meta: &ObjectMeta) -> Option<Workload> {
        let key = key(
            kind,
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let copy = inner.by_key.get_mut(&key)?;
        let same = meta.uid.as_deref() == Some(copy.uid.as_str());
        let shown = meta.resource_version.as_deref() == Some(copy.resource_version.as_str());
        let newer = copy.generation > meta.generation.unwrap_or_default();
        if same && (shown || newer) {
            copy.used = now;
            return Some(copy.workload.clone());
        }
        inner.remove(&key);
        None
    }

    /// Keeps `workload`, read at `resource_version` (a GET of a reconcile), as the copy of its
    /// kind, namespace and name. Not kept without a uid or a version, nor when it alone is
    /// larger than [`COPIES_BUDGET`]; the least recently used copies are dropped until the
    /// copies fit the budget again.
    pub fn keep(&self, mut workload: Workload, resource_version: Option<&str>) {
        let Some(kind) = workload.kind else { return };
        let key = key(kind, &workload.namespace, &workload.name);
        let mut inner = self.lock();
        inner.remove(&key);
        let (Some(uid), Some(resource_version)) = (workload.uid.clone(), resource_version) else {
            return;
        };
        workload
            .managed_fields
            .retain(|f| f.manager.as_deref() == Some(OPERATOR_FIELD_MANAGER));
        let bytes = json_bytes(&workload);
        if bytes > COPIES_BUDGET {
            return;
        }
        inner.clock += 1;
        let copy = Copy {
            uid,
            resource_version: resource_version.to_string(),
            generation: workload.generation.unwrap_or_default(),
            workload,
            bytes,
            used: inner.clock,
        };
        inner.bytes += bytes;
        inner.by_key.insert(key.clone(), copy);
        while inner.bytes > COPIES_BUDGET {
            let Some(oldest) = inner
                .by_key
                .iter()
                .filter(|(k, _)| **k != key)
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            inner.remove(&oldest);
        }
    }

    /// Keeps the API server's answer to an apply of a StatefulSet ([`WorkloadCopies::keep`]).
    pub fn statefulset(&self, sts: &StatefulSet) {
        self.keep(
            Workload::from_statefulset(sts),
            sts.metadata.resource_version.as_deref(),
        );
    }

    /// Keeps the API server's answer to an apply of a Deployment ([`WorkloadCopies::keep`]).
    pub fn deployment(&self, deploy: &Deployment) {
        self.keep(
            Workload::from_deployment(deploy),
            deploy.metadata.resource_version.as_deref(),
        );
    }

    /// Drops the copies of the workload `name` of `namespace`, of either kind (it left the
    /// watch caches: deleted, or no longer labelled as a vCluster).
    pub fn forget(&self, namespace: &str, name: &str) {
        let mut inner = self.lock();
        for kind in [WorkloadKind::StatefulSet, WorkloadKind::Deployment] {
            inner.remove(&key(kind, namespace, name));
        }
    }

    /// Keeps the copies for which `keep(kind, namespace, name)` holds only ([`crate::sweep`]:
    /// the workloads that still exist and that a plugin still targets).
    pub fn retain(&self, keep: impl Fn(WorkloadKind, &str, &str) -> bool) {
        let mut inner = self.lock();
        let gone: Vec<String> = inner
            .by_key
            .iter()
            .filter(|(_, c)| {
                let w = &c.workload;
                !keep(
                    w.kind.unwrap_or(WorkloadKind::StatefulSet),
                    &w.namespace,
                    &w.name,
                )
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            inner.remove(&k);
        }
    }

    /// Copies held.
    pub fn entries(&self) -> usize {
        self.lock().by_key.len()
    }

    /// Bytes of JSON the copies hold together (at most [`COPIES_BUDGET`]).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn remove(&mut self, key: &str) {
        if let Some(copy) = self.by_key.remove(key) {
            self.bytes -= copy.bytes;
        }
    }
}

/// The size of `workload`'s parts in bytes of JSON (its pod spec, both sets of labels, its
/// `managedFields`), counted without building the text.
pub fn json_bytes(workload: &Workload) -> usize {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    fn count(value: &impl Serialize) -> usize {
        let mut c = Count(0);
        match serde_json::to_writer(&mut c, value) {
            Ok(()) => c.0,
            Err(_) => 0,
        }
    }
    count(&workload.pod_spec)
        + count(&workload.labels)
        + count(&workload.template_labels)
        + count(&workload.managed_fields)
        + workload.namespace.len()
        + workload.name.len()
}
