//! Where the runtime evaluates an object's expressions: on tokio's blocking pool, in one of the
//! runtime's [`EVALUATION_SLOTS`], awaited by the worker that reconciles the object, so the
//! synced type's driver task (its watches and its other workers) goes on meanwhile.

use std::sync::Arc;

use serde_json::Value;

use super::{Kind, PatchError, Patches};

/// How many evaluations of one runtime run at once (4, the workers of one synced type): each
/// object's expressions run on tokio's blocking pool ([`Patches::to_host_in_pool`] and its
/// siblings), at most this many objects at a time, the others wait for a slot without holding
/// any thread. The slots are the runtime's ([`running::Evaluations`]), so a thread kept by a
/// native call the time bound cannot interrupt keeps its slot until the call returns, even past
/// a spec edit that dropped its syncer.
pub const EVALUATION_SLOTS: usize = 4;

impl Patches {
    /// Whether any patch has an expression (only those need a thread of their own).
    fn has_expressions(&self) -> bool {
        self.patches
            .iter()
            .any(|p| matches!(p.kind, Kind::Expression { .. }))
    }

    /// [`Self::to_host`] on tokio's blocking pool, in one of the runtime's
    /// [`EVALUATION_SLOTS`]: the caller's task (a synced type's driver, which also holds its
    /// watches and its other workers) keeps running while the expressions run, instead of
    /// standing still for up to an object's whole budget
    /// ([`OBJECT_BUDGET_FACTOR`](super::OBJECT_BUDGET_FACTOR)) or a native call's end. Returns
    /// `host` patched. Without expressions it runs in place.
    ///
    /// # Errors
    /// As [`Self::to_host`]; a panic of the evaluation is a [`PatchError`] too.
    pub async fn to_host_in_pool(
        self: &Arc<Self>,
        virtual_obj: Value,
        host: Value,
    ) -> Result<Value, PatchError> {
        self.in_pool(host, move |p, host| p.to_host(&virtual_obj, host))
            .await
    }

    /// [`Self::to_virtual`] on the blocking pool, as [`Self::to_host_in_pool`]; returns
    /// `host_view` patched.
    ///
    /// # Errors
    /// As [`Self::to_virtual`].
    pub async fn to_virtual_in_pool(
        self: &Arc<Self>,
        virtual_obj: Value,
        host_view: Value,
    ) -> Result<Value, PatchError> {
        self.in_pool(host_view, move |p, view| p.to_virtual(&virtual_obj, view))
            .await
    }

    /// [`Self::from_host`] on the blocking pool, as [`Self::to_host_in_pool`]; returns
    /// `virtual_view` patched.
    ///
    /// # Errors
    /// As [`Self::from_host`].
    pub async fn from_host_in_pool(
        self: &Arc<Self>,
        host: Value,
        virtual_view: Value,
    ) -> Result<Value, PatchError> {
        self.in_pool(virtual_view, move |p, view| p.from_host(&host, view))
            .await
    }

    async fn in_pool(
        self: &Arc<Self>,
        mut target: Value,
        apply: impl FnOnce(&Patches, &mut Value) -> Result<(), PatchError> + Send + 'static,
    ) -> Result<Value, PatchError> {
        if !self.has_expressions() {
            apply(self, &mut target)?;
            return Ok(target);
        }
        // waiting for a slot holds no thread; the slot goes with the evaluation, so it is
        // given back when the evaluation really ends, not when a dropped caller stops waiting
        let slot = self.evaluations.slot().await;
        let patches = self.clone();
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            apply(&patches, &mut target).map(|()| target)
        })
        .await
        .unwrap_or_else(|failed| {
            Err(PatchError {
                path: String::new(),
                what: "expression",
                message: format!("the evaluation ended abnormally: {failed}"),
            })
        })
    }
}
