//! End to end inside vCluster itself: vCluster's own syncer process (`cmd/vcluster start`, the
//! pinned `github.com/loft-sh/vcluster`, run by [`VClusterSyncer`]) with the embedded runtime
//! loaded as a v2 plugin, then with a Go v1 (legacy sidecar) plugin.
//!
//! The operator installs a `VClusterPlugin` (no image, `version: v2`) into the chart-rendered
//! StatefulSet; the test then does what the pod would do: it runs the init container the
//! operator added (its command, with the runtime image's binary being this workspace's
//! `vcluster-plugin-syncer` and its `/plugins` mount being the plugins folder), and starts the
//! real syncer with that folder. Every assertion reads vCluster's own log, the processes, the
//! API servers or their audit logs.
//!
//! vCluster's legacy plugin server binds `localhost:10099`, so one syncer runs at a time: this
//! binary has a single test that drives the steps in order, for each vCluster version of the
//! matrix (v0.30.0, the pinned one, and v0.36.1).
//!
//! A hook's host label comes back up. vCluster applies the plugin's `CreatePhysical` hook in
//! its host client (`pkg/util/pluginhookclient`, `plugin.DefaultManager.MutateObject`) before the
//! pod syncer's create, so the host pod is created with the label. On its next sync of that
//! pod, vCluster's pod syncer (`pkg/controllers/resources/pods/translate/diff.go`,
//! `translate.LabelsBidirectionalUpdateFunction`) sees a host label the virtual pod lacks and
//! copies it up to the virtual pod, then records the virtual pod's labels in the host pod's
//! annotation `vcluster.loft.sh/labels` (one update of the host pod, which leaves the label
//! alone). Both steps read only the host object, so a Go plugin's hook label is copied up the
//! same way: the test loads a Go v2 plugin (`tests/vcluster-go/cmd/go-pod-hook`, vCluster's own
//! protocol definitions, as the vcluster-sdk serves them) beside the runtime, and asserts the
//! copy-up of both hooks' labels and the single annotation update.
//!
//! A v1 sidecar plugin works inside vCluster too, when vCluster's configuration lists it (see
//! [`v1_sidecar`]): the operator installs an image plugin with `version: v1`, the test runs the
//! sidecar container the operator added (`tests/vcluster-go/cmd/go-pod-hook-v1`, vCluster's own
//! `pkg/plugin/v1/remote` definitions, with the container's env and args), and vCluster's pod
//! syncer creates the host pod with that hook's label, its value from `PLUGIN_CONFIG`. Unlisted,
//! in a vCluster without other plugins, the plugin registers but its hook is never called.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::{Car, VClusterPlugin};
use vcp_tests::{
    Audit, Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, VCLUSTER_RELEASE, VClusterSyncer,
    wait_for,
};

const RUNTIME_IMAGE: &str = "vcp-test/runtime:inside";
/// The runtime image's binary, as the operator's init container names it.
const IMAGE_BINARY: &str = "/usr/local/bin/vcluster-plugin-syncer";
const PLUGIN: &str = "cars-and-pods";
/// The folder of the Go plugin (`GO_POD_HOOK`, at each version) in the plugins folder.
const GO_PLUGIN: &str = "go-pod-hook";
const TIMEOUT: Duration = Duration::from_secs(60);
/// The v1 sidecar plugin (`GO_POD_HOOK_V1`): its `VClusterPlugin`, its image as the operator
/// writes it into the StatefulSet, and the key of its hook's label (its `-label` argument).
const V1_PLUGIN: &str = "go-hook-v1";
const V1_IMAGE: &str = "vcp-test/go-pod-hook-v1:inside";
const V1_LABEL: &str = "created-by-v1-plugin";
/// What vCluster logs once its controllers run (`pkg/setup/controllers.go`).
const SYNCER_STARTED: &str = "Successfully started vCluster controllers";

/// One vCluster version under test: its own host namespace and virtual namespace (the virtual
/// API server is shared, and a syncer syncs every virtual namespace), its chart and its syncer.
struct Target {
    /// The version, as `scripts/oracles` names it.
    version: &'static str,
    /// The vCluster's host namespace.
    ns: String,
    /// The virtual namespace of this version's objects.
    vns: String,
    /// vCluster's chart at that version.
    chart: PathBuf,
    /// vCluster's syncer at that version (`scripts/oracles`).
    syncer: PathBuf,
}

impl Target {
    /// Every version of the matrix ([`vcp_tests::VCLUSTER_VERSIONS`]), with its syncer and
    /// chart from `scripts/oracles build` (`VCLUSTER_SYNCER`, `VCLUSTER_CHART` and their
    /// `_V0_36` twins).
    fn all() -> Vec<Target> {
        let paths = vcp_tests::oracle_paths();
        vcp_tests::VCLUSTER_VERSIONS
            .into_iter()
            .map(|(version, suffix)| {
                let tag = version.replace('.', "");
                Target {
                    version,
                    ns: format!("vc-inside-{tag}"),
                    vns: format!("team-{tag}"),
                    chart: paths[&format!("VCLUSTER_CHART{suffix}")].clone(),
                    syncer: paths[&format!("VCLUSTER_SYNCER{suffix}")].clone(),
                }
            })
            .collect()
    }

    /// vCluster's user on the host: the pod template's service account, as the chart names it.
    fn user(&self) -> String {
        format!("system:serviceaccount:{}:vc-{VCLUSTER_RELEASE}", self.ns)
    }
}

mod pod_hooks;
mod support;
mod v1_sidecar;
mod v2_runtime;

use pod_hooks::*;
use support::*;
use v1_sidecar::*;
use v2_runtime::*;

/// The matrix: each version in turn (one syncer at a time), each in its own namespaces.
#[tokio::test]
async fn the_embedded_runtime_inside_vclusters_own_syncer() {
    for target in Target::all() {
        eprintln!("vCluster {}: {}", target.version, target.syncer.display());
        inside(&target).await;
    }
}
