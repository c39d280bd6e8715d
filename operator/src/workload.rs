//! Pure translation: every `VClusterPlugin` of one vCluster + the vCluster's workload → the
//! server-side-apply body the operator sends for that workload.
//!
//! The rules implemented here:
//! - the workload is the StatefulSet, else the Deployment, named `spec.vcluster.name`, and it
//!   must be a vCluster made by the vCluster chart ([`vcluster_identity`]: the chart's labels,
//!   a `syncer` container, a service account); any other workload gets no plugin at all
//!   (`Ready=False, reason=NotAVCluster`);
//! - no `image`: the embedded-runtime sidecar (a container named after the plugin, running
//!   `vcluster-plugin-syncer`, the plugin's name in env [`PLUGIN_NAME_ENV`], the command line,
//!   arguments and environment sources the operator's alone, `/metrics` on its own port from
//!   [`RUNTIME_METRICS_BASE_PORT`]); it reaches the virtual cluster
//!   with the kubeconfig vCluster keeps in the host Secret `vc-<vcluster>` (key `config`,
//!   server `https://localhost:8443`, the vCluster API server in the same pod), mounted
//!   read-only from one shared volume [`VCLUSTER_KUBECONFIG_VOLUME`] at
//!   [`VCLUSTER_KUBECONFIG_DIR`]; that volume is in the pod only while such a sidecar is, and no
//!   other container gets it (a spec's own mount of it is never copied);
//! - env names beginning with `VCP_` or `VCLUSTER_` ([`RESERVED_ENV_PREFIXES`]) are the
//!   operator's: never copied from a spec;
//! - `image` + `v2` (default): an init container named after the plugin running
//!   `cp -r /plugin /plugins/<name>`, an emptyDir volume `plugins`, mounted at `/plugins` in the
//!   init container and in the `syncer` container;
//! - no `image` + `version: v2` (explicit): the embedded runtime as a v2 plugin, loaded by
//!   vCluster's syncer itself: an init container named after the plugin, from the runtime
//!   image, running `vcluster-plugin-syncer install-plugin /plugins/<name>` (the runtime copies
//!   itself to `/plugins/<name>/plugin`; the image has no shell), with the same `plugins`
//!   volume and mounts as an image `v2` plugin; no sidecar and no kubeconfig Secret volume;
//! - `image` + `v1`: a legacy sidecar with `VCLUSTER_PLUGIN_ADDRESS=localhost:<port>`,
//!   `VCLUSTER_PLUGIN_NAME` and `PLUGIN_CONFIG`. The port ([`V1_BASE_PORT`]): vCluster's chart
//!   numbers the v1 sidecars of its own values (`plugin:` entries without `version: v2`) from
//!   `localhost:14000` too (`chart/templates/_plugin.tpl`, `vcluster.legacyPlugins.containers`),
//!   and a pod's containers share one network namespace, so a plain `14000+i` would put two
//!   sidecars on one port. The operator's v1 plugins, in install order (creationTimestamp, then
//!   name), each take the lowest port from 14000 that is neither in the
//!   `VCLUSTER_PLUGIN_ADDRESS` (a literal `value`, its port after the last `:`) of a container
//!   or init container the operator did not add (told apart as for name conflicts: a
//!   container is the operator's when its `image` is in the operator's `managedFields` entry)
//!   nor taken by an earlier v1 plugin of the operator. Computed the same way from the same
//!   inputs on every reconcile, it is stable: a plugin created after the others takes a port
//!   above theirs, and a plugin's port changes only when the foreign containers' addresses or
//!   the set of older installed v1 plugins change, that is when the pod template changes
//!   anyway. Without chart-rendered v1 sidecars it is `14000+i`;
//! - only the fields the operator owns are applied: a partial object (apiVersion, kind,
//!   metadata.name/namespace, pod template containers / initContainers / volumes by name), so
//!   Helm- or Argo CD-owned fields are never touched;
//! - conflicts are reported, never fought: a plugin whose container name is already used by a
//!   container the operator did not add, or that syncs a type (same API group and kind, any
//!   version) an older plugin of the same vCluster already syncs, is left out and gets
//!   `Ready=False, reason=Conflict`; "older" is by creationTimestamp, then name, so the
//!   plugin that was there first keeps working.
//!
//! All plugins share one field manager, and the `plugins` volume and the `/plugins` mount in
//! `syncer` are shared by every v2 plugin. A server-side apply *replaces* everything the manager
//! owned in that object, so the body must always hold the entries of **all** plugins installed
//! into the workload: [`plan`] takes them all and the controller sends one apply per workload.
//! Removing a plugin is the same apply without it; when no plugin is left the body holds no
//! `spec` at all, so the operator's field manager owns nothing and the pod template is back
//! to what it was.
//!
//! Refusals the operator decides from policy or cluster state (a rule the policy forbids, a
//! type the host does not serve, no vCluster Role to append to) are judged for every plugin of
//! the vCluster before [`plan`] runs, by every reconcile of that workload alike
//! ([`crate::vcluster::ClusterFacts`]): [`plan`] is only given the plugins those checks let
//! through, and decides conflicts among them. A refused plugin therefore never appears in any
//! reconcile's apply body, and the workload is not written for it.
//!
//! [`is_converged`] decides whether the apply can be skipped (a reconcile of a converged
//! object performs zero writes).
//!
//! One concern a submodule, all re-exported here: the vCluster workload and its identity
//! (`identity`), the containers of one plugin (`containers`), the merged apply body and its
//! conflicts (`merge`), convergence (`converge`), the size budgets (`budget`, `TooLarge`).

pub mod budget;
mod containers;
mod converge;
pub mod hook_mode;
mod identity;
mod merge;

pub use containers::{
    PLUGIN_ADDRESS_ENV, PLUGIN_NAME_ENV, PLUGINS_MOUNT_PATH, PLUGINS_VOLUME, PluginKind,
    RESERVED_ENV_PREFIXES, RUNTIME_BINARY, RUNTIME_LIMITS, RUNTIME_METRICS_BASE_PORT,
    RUNTIME_REQUESTS, V1_BASE_PORT, VCLUSTER_KUBECONFIG_DIR, VCLUSTER_KUBECONFIG_KEY,
    VCLUSTER_KUBECONFIG_VOLUME, embedded_container, embedded_v2_init_container, is_reserved_env,
    plugin_kind, runtime_resources, v1_container, v2_init_container, vcluster_kubeconfig_volume,
};
pub use converge::{field_set, is_converged, is_subset, owned_entries};
pub use identity::{
    Refusal, SYNCER_CONTAINER, VCLUSTER_APP_LABEL, VCLUSTER_APP_VALUE, VCLUSTER_RELEASE_LABEL,
    Workload, WorkloadKind, vcluster_identity,
};
pub use merge::{WorkloadPlan, contributes, install_order, plan, planned_pod_spec};

#[cfg(test)]
mod tests;
