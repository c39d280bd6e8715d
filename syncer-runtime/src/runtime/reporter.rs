//! The runtime's part of the plugin status, written when it changed ([`Reporter`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use tracing::warn;
use vcp_crds::tolerant::Tolerant;
use vcp_crds::{RUNTIME_FIELD_MANAGER, VClusterPlugin};

use crate::status::{self, RuntimeStatus};

use super::generation::Generation;

/// Writes the runtime's part of the plugin status ([`status`]) by server-side apply (best
/// effort), only when it changed since the last successful write.
pub(super) struct Reporter {
    api: Api<Tolerant<VClusterPlugin>>,
    name: String,
    /// The last status written, and its `RuntimeHealthy` condition.
    last: Option<(RuntimeStatus, Condition)>,
    last_error: Option<String>,
}

impl Reporter {
    pub(super) fn new(api: Api<Tolerant<VClusterPlugin>>, name: &str) -> Self {
        Self {
            api,
            name: name.to_string(),
            last: None,
            last_error: None,
        }
    }

    pub(super) async fn report(
        &mut self,
        generation: &Generation,
        overrunning: &[crate::patches::running::Overrun],
        metrics_failure: Option<&str>,
    ) {
        let types: Vec<_> = generation.types.iter().map(|t| t.summary()).collect();
        let pod_hooks = generation.pod_hooks.as_ref().map(|p| p.summary());
        let desired = status::desired(&types, pod_hooks.as_ref(), generation.observed_generation);
        let desired = status::with_overrunning(desired, overrunning);
        let desired = status::with_metrics_failure(desired, metrics_failure);
        if self.last.as_ref().is_some_and(|(last, _)| *last == desired) {
            return;
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let condition = status::condition(&desired, self.last.as_ref().map(|(_, c)| c), &now);
        let body = status::apply_body(&self.name, &desired, &condition);
        let params = PatchParams::apply(RUNTIME_FIELD_MANAGER).force();
        match self
            .api
            .patch_status(&self.name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(_) => {
                self.last = Some((desired, condition));
                self.last_error = None;
            }
            Err(error) => {
                let error = error.to_string();
                if self.last_error.as_ref() != Some(&error) {
                    warn!(%error, "cannot write the VClusterPlugin status (the syncer identity needs patch on vclusterplugins/status); will retry");
                    self.last_error = Some(error);
                }
            }
        }
    }
}
