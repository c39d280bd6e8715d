//! In-memory sync statistics per synced type, read by the status reporter.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The last result of syncing one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The host copy matches the virtual object.
    InSync,
    /// A host object of the translated name exists that this vCluster does not manage; it is
    /// never touched.
    Conflict,
    /// Waiting for something (such as a host object being deleted) before the next step.
    Pending,
    /// The last attempt failed with this message; it is retried with backoff.
    Failed(String),
}

/// Counts of one type, as reported in `status.syncedObjects`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeSummary {
    /// `group/version` of the type.
    pub api_version: String,
    /// Kind of the type.
    pub kind: String,
    /// Objects whose host copy matches the virtual object.
    pub in_sync: i64,
    /// Host objects of a translated name that this vCluster does not manage.
    pub conflicts: i64,
    /// Objects whose last sync attempt failed.
    pub failed: i64,
    /// A problem of the whole type (discovery or watch failing), if any.
    pub type_error: Option<String>,
    /// Whether both watches have listed their objects once.
    pub ready: bool,
}

/// Sync statistics of one type, shared between a syncer and the status reporter.
#[derive(Debug, Default)]
pub struct TypeStats {
    api_version: String,
    kind: String,
    outcomes: Mutex<HashMap<String, Outcome>>,
    type_error: Mutex<Option<String>>,
    ready: std::sync::atomic::AtomicBool,
    writes: AtomicU64,
}

impl TypeStats {
    /// Empty statistics for `api_version` / `kind`.
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
            ..Self::default()
        }
    }

    /// `group/version` of the type.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// Kind of the type.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Records the outcome of `key` (`namespace/name` of the virtual object); `None` forgets it
    /// (the object is gone on both sides).
    pub fn record(&self, key: &str, outcome: Option<Outcome>) {
        if let Ok(mut outcomes) = self.outcomes.lock() {
            match outcome {
                Some(outcome) => {
                    outcomes.insert(key.to_string(), outcome);
                }
                None => {
                    outcomes.remove(key);
                }
            }
        }
    }

    /// The last recorded outcome of `key`.
    pub fn outcome(&self, key: &str) -> Option<Outcome> {
        self.outcomes.lock().ok()?.get(key).cloned()
    }

    /// Sets or clears a problem of the whole type.
    pub fn set_type_error(&self, error: Option<String>) {
        if let Ok(mut slot) = self.type_error.lock() {
            *slot = error;
        }
    }

    /// Marks the type's watches as initialised.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Counts one write request (create, patch or delete) sent by the syncer.
    pub fn count_write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Write requests sent so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Current counts.
    pub fn summary(&self) -> TypeSummary {
        let mut summary = TypeSummary {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            type_error: self.type_error.lock().ok().and_then(|e| e.clone()),
            ready: self.ready.load(Ordering::Relaxed),
            ..TypeSummary::default()
        };
        if let Ok(outcomes) = self.outcomes.lock() {
            for outcome in outcomes.values() {
                match outcome {
                    Outcome::InSync => summary.in_sync += 1,
                    Outcome::Conflict => summary.conflicts += 1,
                    Outcome::Failed(_) => summary.failed += 1,
                    Outcome::Pending => {}
                }
            }
        }
        summary
    }
}
