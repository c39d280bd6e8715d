//! A vCluster's workload as its chart (vCluster v0.30.0) renders it, of either [`Kind`], created
//! the way `helm install` does, and the containers of its live pod template.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::Client;
use kube::api::Api;
use serde_json::Value;

/// The name of the chart's workload (the release name of the vClusters the tests create).
pub const VC: &str = "my-vcluster";

/// The kind of a vCluster's workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The chart's default.
    StatefulSet,
    /// With [`DEPLOYMENT_VALUES`].
    Deployment,
}

/// The chart values that make vCluster's chart render a Deployment instead of a StatefulSet
/// (no volume claim: the data lives in an emptyDir).
pub const DEPLOYMENT_VALUES: &str =
    "controlPlane:\n  statefulSet:\n    persistence:\n      volumeClaim:\n        enabled: false\n";

/// Creates the vCluster in `ns` as its chart (vCluster v0.30.0) renders it, the way
/// `helm install` does (field manager `helm`): its ServiceAccounts, config Secret and Services
/// once, and the workload `my-vcluster` of `kind`; returns the workload's original
/// `spec.template`.
pub async fn create_workload(admin: &Client, ns: &str, kind: Kind) -> Value {
    let values = match kind {
        Kind::StatefulSet => "",
        Kind::Deployment => DEPLOYMENT_VALUES,
    };
    let yaml = crate::vcluster_workload_with(ns, values);
    let mut workload = None;
    for doc in yaml.split("---\n") {
        let created = crate::create_yaml(admin, doc, Some(ns), "helm").await;
        let is_workload =
            doc.contains("\nkind: StatefulSet\n") || doc.contains("\nkind: Deployment\n");
        match created {
            Ok(objects) => {
                for object in objects {
                    if object
                        .types
                        .as_ref()
                        .is_some_and(|t| t.kind == "StatefulSet" || t.kind == "Deployment")
                    {
                        workload = Some(object);
                    }
                }
            }
            // the ServiceAccounts, Secret and Services survive a deleted workload
            Err(error) if !is_workload && format!("{error:#}").contains("AlreadyExists") => {}
            Err(error) => panic!("create the vCluster: {error:#}"),
        }
    }
    // the template as the typed objects serialize it, like `template` reads it back
    let workload = serde_json::to_value(workload.expect("the chart's workload")).expect("json");
    match kind {
        Kind::StatefulSet => {
            let sts: StatefulSet = serde_json::from_value(workload).expect("StatefulSet");
            serde_json::to_value(sts.spec.expect("spec").template)
        }
        Kind::Deployment => {
            let d: Deployment = serde_json::from_value(workload).expect("Deployment");
            serde_json::to_value(d.spec.expect("spec").template)
        }
    }
    .expect("json")
}

/// Creates namespace `ns` and, in it, the vCluster ([`create_workload`]); returns the
/// workload's original `spec.template`.
pub async fn create_vcluster(admin: &Client, ns: &str, kind: Kind) -> Value {
    crate::create_namespace(admin, ns).await;
    create_workload(admin, ns, kind).await
}

/// The live pod template of the workload `my-vcluster` in `ns`.
pub async fn template(admin: &Client, ns: &str, kind: Kind) -> Value {
    match kind {
        Kind::StatefulSet => serde_json::to_value(
            Api::<StatefulSet>::namespaced(admin.clone(), ns)
                .get(VC)
                .await
                .expect("get StatefulSet")
                .spec
                .unwrap()
                .template,
        ),
        Kind::Deployment => serde_json::to_value(
            Api::<Deployment>::namespaced(admin.clone(), ns)
                .get(VC)
                .await
                .expect("get Deployment")
                .spec
                .unwrap()
                .template,
        ),
    }
    .unwrap()
}

/// The containers of `template`'s `spec.<list>` (`containers`, `initContainers`).
pub fn containers(template: &Value, list: &str) -> Vec<Value> {
    template["spec"][list]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The names of [`containers`].
pub fn container_names(template: &Value, list: &str) -> Vec<String> {
    containers(template, list)
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

/// The container `name` of `template`.
///
/// # Panics
/// When there is none.
pub fn container<'a>(template: &'a Value, name: &str) -> &'a Value {
    template["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {template:#}"))
}

/// The spec of an embedded plugin for the vCluster [`VC`] syncing the tutorial's Cars.
pub fn embedded_car_spec() -> Value {
    serde_json::json!({
        "vcluster": { "name": VC },
        "syncedTypes": [{ "apiVersion": "example.loft.sh/v1", "kind": "Car" }],
    })
}
