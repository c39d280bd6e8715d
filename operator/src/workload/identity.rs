//! The vCluster workload: what the operator reads of it ([`Workload`]) and whether it is a
//! vCluster at all ([`vcluster_identity`]).
//!
//! The rule: the workload is the StatefulSet, else
//! the Deployment, named `spec.vcluster.name`; the operator only installs into real vClusters
//! (the chart's labels, the `syncer` container; the pod template's service account is the
//! RBAC subject), as vCluster's chart v0.30.0 renders them (`chart/templates/statefulset.yaml`).
//! [`Refusal`], the verdict that leaves a plugin out, is shared by every step of the plan.

use std::collections::BTreeMap;
use vcp_crds::Reason;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::{Resource, ResourceExt};

/// Name of the vCluster chart's main container, into which `/plugins` is mounted for v2 plugins.
pub const SYNCER_CONTAINER: &str = "syncer";

/// Why a plugin was left out of the workload; becomes its `Ready=False` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Condition reason, such as [`Reason::Conflict`](Reason::Conflict).
    pub reason: Reason,
    /// Human-readable message naming what to change.
    pub message: String,
}

/// Kind of a vCluster workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkloadKind {
    /// `apps/v1` StatefulSet (the vCluster chart's default).
    StatefulSet,
    /// `apps/v1` Deployment.
    Deployment,
}

impl WorkloadKind {
    /// The Kubernetes kind, `StatefulSet` or `Deployment`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::Deployment => "Deployment",
        }
    }
}

/// What the operator needs to know of a vCluster workload: its identity, its labels and its
/// pod template's labels (to tell a vCluster from any other workload, [`vcluster_identity`]),
/// its pod template's spec and its managed fields (to know which entries the operator owns).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    /// StatefulSet or Deployment.
    pub kind: Option<WorkloadKind>,
    /// Name (the vCluster release name).
    pub name: String,
    /// Namespace (the plugin's namespace).
    pub namespace: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.template.metadata.labels`.
    pub template_labels: BTreeMap<String, String>,
    /// `spec.template.spec` (empty when absent).
    pub pod_spec: PodSpec,
    /// `metadata.managedFields`.
    pub managed_fields: Vec<ManagedFieldsEntry>,
    /// `metadata.uid` (a recreated workload is another object).
    pub uid: Option<String>,
    /// `metadata.generation`: grows with every change of the spec.
    pub generation: Option<i64>,
    /// `spec.replicas` (`None` when unset: Kubernetes' default is 1).
    pub replicas: Option<i32>,
    /// Bytes of JSON of `metadata.annotations` (a client-side apply's last-applied
    /// configuration can be as large as the object): counted by the size budgets
    /// ([`super::budget`]).
    pub annotations_bytes: usize,
}

impl Workload {
    /// The workload view of a StatefulSet.
    pub fn from_statefulset(sts: &StatefulSet) -> Self {
        let template = sts.spec.as_ref().map(|s| &s.template);
        Workload {
            replicas: sts.spec.as_ref().and_then(|s| s.replicas),
            ..Self::from_object(WorkloadKind::StatefulSet, sts, template)
        }
    }

    /// The workload view of a Deployment.
    pub fn from_deployment(deploy: &Deployment) -> Self {
        let template = deploy.spec.as_ref().map(|s| &s.template);
        Workload {
            replicas: deploy.spec.as_ref().and_then(|s| s.replicas),
            ..Self::from_object(WorkloadKind::Deployment, deploy, template)
        }
    }

    /// The workload view of `obj`, a StatefulSet or Deployment (`kind`) with pod template
    /// `template`: both kinds carry the same metadata and a `spec.template`.
    fn from_object<K: Resource>(
        kind: WorkloadKind,
        obj: &K,
        template: Option<&PodTemplateSpec>,
    ) -> Self {
        Workload {
            kind: Some(kind),
            name: obj.name_any(),
            namespace: obj.namespace().unwrap_or_default(),
            labels: obj.labels().clone(),
            template_labels: template
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.clone())
                .unwrap_or_default(),
            pod_spec: template.and_then(|t| t.spec.clone()).unwrap_or_default(),
            managed_fields: obj.meta().managed_fields.clone().unwrap_or_default(),
            uid: obj.meta().uid.clone(),
            generation: obj.meta().generation,
            replicas: None,
            annotations_bytes: serde_json::to_vec(obj.annotations()).map_or(0, |b| b.len()),
        }
    }

    /// `StatefulSet` or `Deployment` (StatefulSet when unset).
    pub fn kind_str(&self) -> &'static str {
        self.kind.unwrap_or(WorkloadKind::StatefulSet).as_str()
    }
}

/// The label the vCluster chart gives its workload and the workload's pods, with
/// [`VCLUSTER_APP_VALUE`] (`chart/templates/statefulset.yaml` of vCluster v0.30.0:
/// `metadata.labels` and `spec.template.metadata.labels` both carry `app: vcluster` and
/// `release: <release>`; the selector matches on the same two).
pub const VCLUSTER_APP_LABEL: &str = "app";
/// The value of [`VCLUSTER_APP_LABEL`] on a vCluster's workload (the chart's external etcd, for
/// one, is `app: vcluster-etcd`, and is no vCluster).
pub const VCLUSTER_APP_VALUE: &str = "vcluster";
/// The label naming the Helm release on a vCluster's workload; the workload itself is named
/// after the release.
pub const VCLUSTER_RELEASE_LABEL: &str = "release";

/// Decides whether `workload` is a vCluster, and which service account its pods run as.
///
/// What counts (the vCluster chart, v0.30.0, `chart/templates/statefulset.yaml`, which renders
/// both the StatefulSet and the Deployment form of the control plane):
/// - `metadata.labels` hold `app: vcluster` and `release: <the workload's name>`;
/// - the pod template's labels hold the same two;
/// - the pod template has a container named `syncer`;
/// - the pod template names its `serviceAccountName` (the chart always sets it: `vc-<release>`
///   unless `controlPlane.advanced.serviceAccount.name` overrides it). A pod template without
///   one runs as the namespace's `default` account, shared by every pod that names none; the
///   plugin's rules are never bound to it.
///
/// Not a security boundary: anyone who may create StatefulSets can forge all of the above
/// (labels, a container named `syncer`, any `serviceAccountName`, `replicas: 0`). It keeps a
/// plugin out of a database by mistake; what keeps a tenant from binding rules to an account
/// through a forged workload is the requester admission policy
/// (`config/admission/requester.yaml`: the author must be able to create the Role and
/// RoleBinding the operator creates; README.md, "Security model").
///
/// Returns the pod template's service account: the subject of the plugin's RBAC, whatever its
/// name (the deprecated `serviceAccount` alias is read when `serviceAccountName` is empty, as
/// the API server does).
///
/// # Errors
/// A [`Refusal`] with [`NotAVCluster`](vcp_crds::Reason::NotAVCluster) naming the first requirement missed.
pub fn vcluster_identity(workload: &Workload) -> Result<String, Refusal> {
    let what = format!(
        "{} {}/{}",
        workload.kind_str(),
        workload.namespace,
        workload.name
    );
    let refuse = |missing: String| Refusal {
        reason: Reason::NotAVCluster,
        message: format!(
            "{what} is not a vCluster: {missing}; a VClusterPlugin is only installed into the StatefulSet or Deployment the vCluster chart makes (labels app: vcluster and release: <name> on it and on its pod template, a container `syncer`, a serviceAccountName); nothing was written"
        ),
    };
    let wanted = [
        (VCLUSTER_APP_LABEL, VCLUSTER_APP_VALUE),
        (VCLUSTER_RELEASE_LABEL, workload.name.as_str()),
    ];
    for (place, labels) in [
        ("its labels", &workload.labels),
        ("its pod template's labels", &workload.template_labels),
    ] {
        for (key, value) in wanted {
            match labels.get(key) {
                Some(v) if v == value => {}
                Some(v) => {
                    return Err(refuse(format!(
                        "{place} have {key}: {v}, not {key}: {value}"
                    )));
                }
                None => return Err(refuse(format!("{place} lack {key}: {value}"))),
            }
        }
    }
    if !workload
        .pod_spec
        .containers
        .iter()
        .any(|c| c.name == SYNCER_CONTAINER)
    {
        return Err(refuse(format!(
            "its pod template has no container `{SYNCER_CONTAINER}`"
        )));
    }
    let spec = &workload.pod_spec;
    spec.service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .or(spec.service_account.as_deref().filter(|s| !s.is_empty()))
        .map(str::to_string)
        .ok_or_else(|| {
            refuse(
                "its pod template sets no serviceAccountName, so its pods run as the namespace's `default` account, which the plugin's rules are never bound to".into(),
            )
        })
}
