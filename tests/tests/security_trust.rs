//! The operator's own trust checks (and its re-check of admission), end to end on the local
//! control plane with the operator in-process under the `vcp-operator` identity:
//! - only real vClusters are targets: a plugin aimed at a `postgres` StatefulSet or at a plain
//!   Deployment is refused with `NotAVCluster` and the operator writes nothing to any workload,
//!   Role, RoleBinding, ClusterRole or ClusterRoleBinding (its audit-log writes), after it has
//!   provably looked (the status and the Event it wrote);
//! - the RBAC subject is the service account the vCluster's pod template runs as;
//! - the policy judges the discovered plural (`kind: Secret` is `secrets`);
//! - `rbac.mode: PatchVClusterRoles` refuses a Role bound to anyone else (`SharedVClusterRole`);
//! - a cluster-scoped kind is refused from discovery's scope (`ClusterScopedType`);
//! - a kind whose plural is not Kubernetes' guess from the kind (the resource admission checks)
//!   is refused with `PolicyDenied` naming both, unless `resource` says it.
//!
//! This binary's operator runs with the policy `forbiddenResources: [secrets]`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use vcp_crds::VClusterPlugin;
use vcp_tests::{Audit, apply_yaml, vcluster_workload, vcluster_workload_with, wait_for};

const TIMEOUT: Duration = Duration::from_secs(30);
const OPERATOR: &str = "vcp-operator";

/// CRDs, the operator's RBAC, and one operator for this binary, refusing `secrets` anywhere.
async fn setup() -> Client {
    let policy =
        vcluster_plugin_operator::policy::Policy::from_yaml("forbiddenResources: [secrets]")
            .expect("policy");
    vcp_tests::start_shared_operator_with_policy("vcp-test/runtime:trust", policy).await
}

/// The message of `p`'s `Ready` condition.
fn ready_message(p: &VClusterPlugin) -> String {
    vcp_tests::condition(p, "Ready")
        .expect("a Ready condition")
        .message
        .clone()
}

/// The operator's writes (audit log) to workloads and RBAC objects of namespace `ns`: the
/// StatefulSets, Deployments, Roles and RoleBindings in it, and the ClusterRoles and
/// ClusterRoleBindings named for its plugins (`vcp:<ns>:<name>`). Read once the audit log holds
/// every request answered before the call.
async fn operator_writes_in(ns: &str) -> Vec<(String, String)> {
    Audit::writes()
        .by_user(OPERATOR)
        .in_namespace(ns)
        .resource("statefulsets")
        .resource("deployments")
        .resource("roles")
        .resource("rolebindings")
        .and_its_cluster_objects()
        .caught_up()
        .await
        .requests()
}

fn plugin_yaml(name: &str, vcluster: &str, spec: &str) -> String {
    format!(
        "apiVersion: vcp.dev/v1alpha1\nkind: VClusterPlugin\nmetadata: {{ name: {name} }}\nspec:\n  vcluster: {{ name: {vcluster} }}\n{spec}"
    )
}

#[tokio::test]
async fn plugins_aimed_at_workloads_that_are_not_vclusters_are_refused_with_nothing_written() {
    const NS: &str = "trust-not-a-vcluster";
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    // A database and a web Deployment, each with its own service account, nothing of the
    // vCluster chart. The web Deployment even has a container named `syncer`.
    apply_yaml(
        &admin,
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: { name: postgres }
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: postgres
  labels: { app.kubernetes.io/name: postgresql }
spec:
  serviceName: postgres
  selector: { matchLabels: { app.kubernetes.io/name: postgresql } }
  template:
    metadata: { labels: { app.kubernetes.io/name: postgresql } }
    spec:
      serviceAccountName: postgres
      containers:
        - { name: postgresql, image: "postgres:16" }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: { app: web }
spec:
  selector: { matchLabels: { app: web } }
  template:
    metadata: { labels: { app: web } }
    spec:
      containers:
        - { name: syncer, image: "nginx:1.27" }
"#,
        Some(NS),
    )
    .await
    .expect("workloads");
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), NS);
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(admin.clone(), NS);
    let sts_before = sts.get("postgres").await.unwrap().resource_version();
    let web_before = deployments.get("web").await.unwrap().resource_version();

    let cars = "  syncedTypes:\n    - { apiVersion: example.loft.sh/v1, kind: Car }\n";
    let plugins_yaml = [
        plugin_yaml("embedded-at-postgres", "postgres", cars),
        plugin_yaml(
            "v1-at-postgres",
            "postgres",
            "  image: ghcr.io/example/plugin:1\n  version: v1\n",
        ),
        plugin_yaml("embedded-at-web", "web", cars),
        plugin_yaml(
            "v2-at-web",
            "web",
            "  image: ghcr.io/example/plugin:1\n  rbac:\n    role:\n      extraRules:\n        - { apiGroups: [\"\"], resources: [configmaps], verbs: [get] }\n",
        ),
    ]
    .join("---\n");
    apply_yaml(&admin, &plugins_yaml, Some(NS))
        .await
        .expect("plugins");
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), NS);
    for (name, what) in [
        (
            "embedded-at-postgres",
            "StatefulSet trust-not-a-vcluster/postgres",
        ),
        (
            "v1-at-postgres",
            "StatefulSet trust-not-a-vcluster/postgres",
        ),
        ("embedded-at-web", "Deployment trust-not-a-vcluster/web"),
        ("v2-at-web", "Deployment trust-not-a-vcluster/web"),
    ] {
        let message = ready_message(
            &vcp_tests::wait_ready(&admin, NS, name, "False", Some("NotAVCluster"), TIMEOUT).await,
        );
        assert!(
            message.starts_with(&format!("{what} is not a vCluster: ")),
            "{name}: {message}"
        );
        // The Event the operator publishes right after its status write: the evidence that it looked.
        vcp_tests::wait_event(&admin, NS, name, "NotAVCluster", TIMEOUT).await;
        let p = plugins.get(name).await.unwrap();
        let status = p.status.unwrap();
        assert_eq!(status.phase, Some(vcp_crds::Phase::Failed), "{name}");
        for c in ["WorkloadPatched", "RBACReady"] {
            let cond = status.conditions.iter().find(|x| x.type_ == c).unwrap();
            assert_eq!(
                (cond.status.as_str(), cond.reason.as_str()),
                ("False", "NotAVCluster")
            );
        }
    }
    // The operator has looked at all four (statuses and Events above): it wrote nothing to
    // the workloads or to any RBAC object for them.
    assert_eq!(operator_writes_in(NS).await, Vec::<(String, String)>::new());
    assert_eq!(
        sts.get("postgres").await.unwrap().resource_version(),
        sts_before
    );
    assert_eq!(
        deployments.get("web").await.unwrap().resource_version(),
        web_before
    );
    let roles = Api::<Role>::namespaced(admin.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        roles.items.is_empty(),
        "{:?}",
        roles.items.iter().map(|r| r.name_any()).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn the_rbac_subject_is_the_service_account_of_the_pod_template() {
    const NS: &str = "trust-custom-sa";
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    // vCluster's chart with `controlPlane.advanced.serviceAccount.name: custom-sa`.
    let workload = vcluster_workload_with(
        NS,
        "controlPlane:\n  advanced:\n    serviceAccount:\n      name: custom-sa\n",
    );
    assert!(
        workload.contains("serviceAccountName: custom-sa"),
        "{workload}"
    );
    apply_yaml(&admin, &workload, Some(NS))
        .await
        .expect("vCluster");
    apply_yaml(
        &admin,
        &plugin_yaml(
            "car-syncer",
            "my-vcluster",
            "  syncedTypes:\n    - { apiVersion: example.loft.sh/v1, kind: Car }\n  rbac:\n    clusterRole:\n      extraRules:\n        - { apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions], verbs: [get, list, watch] }\n",
        ),
        Some(NS),
    )
    .await
    .expect("plugin");
    ready_message(
        &vcp_tests::wait_ready(&admin, NS, "car-syncer", "True", Some("Installed"), TIMEOUT).await,
    );
    let expected = vec![Subject {
        kind: "ServiceAccount".into(),
        name: "custom-sa".into(),
        namespace: Some(NS.into()),
        api_group: None,
    }];
    let rb = Api::<RoleBinding>::namespaced(admin.clone(), NS)
        .get("vcp-plugin-car-syncer")
        .await
        .unwrap();
    assert_eq!(rb.subjects, Some(expected.clone()));
    // The cluster rule (reading CRDs) is bound to the same account.
    let crb = Api::<ClusterRoleBinding>::all(admin.clone())
        .get(&format!("vcp:{NS}:car-syncer"))
        .await
        .unwrap();
    assert_eq!(crb.subjects, Some(expected));
    // The audit filter the refusal tests rely on sees the writes of an install.
    let writes = operator_writes_in(NS).await;
    for resource in ["statefulsets", "rolebindings", "clusterrolebindings"] {
        assert!(
            writes
                .iter()
                .any(|(_, uri)| uri.contains(&format!("/{resource}/"))),
            "{resource}: {writes:?}"
        );
    }
}

#[tokio::test]
async fn a_narrowing_policy_stops_a_type_synced_by_kind_through_its_plural() {
    const NS: &str = "trust-secret-plural";
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    apply_yaml(&admin, &vcluster_workload(NS), Some(NS))
        .await
        .expect("vCluster");
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), NS);
    let sts_before = sts.get("my-vcluster").await.unwrap().resource_version();
    apply_yaml(
        &admin,
        &plugin_yaml(
            "secret-syncer",
            "my-vcluster",
            "  image: ghcr.io/example/plugin:1\n  syncedTypes:\n    - { apiVersion: v1, kind: Secret }\n",
        ),
        Some(NS),
    )
    .await
    .expect("plugin");
    let message = ready_message(
        &vcp_tests::wait_ready(
            &admin,
            NS,
            "secret-syncer",
            "False",
            Some("PolicyDenied"),
            TIMEOUT,
        )
        .await,
    );
    assert!(
        message.contains("resource \"secrets\" (policy forbiddenResources: secrets)"),
        "{message}"
    );
    // The Event the operator publishes right after its status write: the evidence that it looked.
    vcp_tests::wait_event(&admin, NS, "secret-syncer", "PolicyDenied", TIMEOUT).await;
    assert_eq!(operator_writes_in(NS).await, Vec::<(String, String)>::new());
    assert_eq!(
        sts.get("my-vcluster").await.unwrap().resource_version(),
        sts_before
    );
}

#[tokio::test]
async fn patch_mode_refuses_a_vcluster_role_bound_to_someone_else() {
    const NS: &str = "trust-shared-role";
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    apply_yaml(
        &admin,
        &format!(
            r#"{}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: vc-my-vcluster }}
rules:
  - {{ apiGroups: [""], resources: [pods], verbs: [get] }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: vc-my-vcluster }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-my-vcluster }}
subjects:
  - {{ kind: ServiceAccount, name: vc-my-vcluster, namespace: {NS} }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: pod-readers }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-my-vcluster }}
subjects:
  - {{ kind: User, apiGroup: rbac.authorization.k8s.io, name: jane }}
"#,
            vcluster_workload(NS)
        ),
        Some(NS),
    )
    .await
    .expect("vCluster");
    let roles = Api::<Role>::namespaced(admin.clone(), NS);
    let role_before = roles.get("vc-my-vcluster").await.unwrap();
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), NS);
    let sts_before = sts.get("my-vcluster").await.unwrap().resource_version();
    apply_yaml(
        &admin,
        &plugin_yaml(
            "patcher",
            "my-vcluster",
            "  syncedTypes:\n    - { apiVersion: example.loft.sh/v1, kind: Car }\n  rbac: { mode: PatchVClusterRoles }\n",
        ),
        Some(NS),
    )
    .await
    .expect("plugin");
    let message = ready_message(
        &vcp_tests::wait_ready(
            &admin,
            NS,
            "patcher",
            "False",
            Some("SharedVClusterRole"),
            TIMEOUT,
        )
        .await,
    );
    assert!(message.contains("Role vc-my-vcluster"), "{message}");
    assert!(message.contains("User jane"), "{message}");
    // The Event the operator publishes right after its status write: the evidence that it looked.
    vcp_tests::wait_event(&admin, NS, "patcher", "SharedVClusterRole", TIMEOUT).await;
    assert_eq!(operator_writes_in(NS).await, Vec::<(String, String)>::new());
    let role_after = roles.get("vc-my-vcluster").await.unwrap();
    assert_eq!(
        role_after.resource_version(),
        role_before.resource_version()
    );
    assert_eq!(
        sts.get("my-vcluster").await.unwrap().resource_version(),
        sts_before
    );
}

#[tokio::test]
async fn a_cluster_scoped_kind_is_refused_from_discoverys_scope() {
    const NS: &str = "trust-cluster-scoped";
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    apply_yaml(&admin, &vcluster_workload(NS), Some(NS))
        .await
        .expect("vCluster");
    apply_yaml(
        &admin,
        &plugin_yaml(
            "namespace-syncer",
            "my-vcluster",
            "  syncedTypes:\n    - { apiVersion: example.loft.sh/v1, kind: Car }\n    - { apiVersion: v1, kind: Namespace }\n",
        ),
        Some(NS),
    )
    .await
    .expect("plugin");
    let message = ready_message(
        &vcp_tests::wait_ready(
            &admin,
            NS,
            "namespace-syncer",
            "False",
            Some("ClusterScopedType"),
            TIMEOUT,
        )
        .await,
    );
    assert!(
        message.starts_with("spec.syncedTypes[1] (v1 Namespace) is cluster-scoped"),
        "{message}"
    );
    // The Event the operator publishes right after its status write: the evidence that it looked.
    vcp_tests::wait_event(&admin, NS, "namespace-syncer", "ClusterScopedType", TIMEOUT).await;
    assert_eq!(operator_writes_in(NS).await, Vec::<(String, String)>::new());
}

/// A CRD whose plural Kubernetes does not guess: kind `Person`, plural `people` (the guess,
/// `UnsafeGuessKindToResource`, is `persons`), namespaced, in group `trust.vcp.test`.
const PEOPLE_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: { name: people.trust.vcp.test }
spec:
  group: trust.vcp.test
  scope: Namespaced
  names: { kind: Person, plural: people, singular: person, listKind: PersonList }
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: { type: object, x-kubernetes-preserve-unknown-fields: true }
"#;

#[tokio::test]
async fn a_plural_admission_could_not_guess_is_refused_unless_resource_names_it() {
    const NS: &str = "trust-admitted-plural";
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    apply_yaml(&admin, PEOPLE_CRD, None).await.expect("CRD");
    let crds = Api::<CustomResourceDefinition>::all(admin.clone());
    wait_for(TIMEOUT, || {
        let crds = crds.clone();
        async move {
            crds.get("people.trust.vcp.test")
                .await
                .ok()?
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        }
    })
    .await;
    apply_yaml(&admin, &vcluster_workload(NS), Some(NS))
        .await
        .expect("vCluster");
    let guessed = "  syncedTypes:\n    - { apiVersion: trust.vcp.test/v1, kind: Person }\n";
    apply_yaml(
        &admin,
        &plugin_yaml("people-syncer", "my-vcluster", guessed),
        Some(NS),
    )
    .await
    .expect("plugin");
    let message = ready_message(
        &vcp_tests::wait_ready(
            &admin,
            NS,
            "people-syncer",
            "False",
            Some("PolicyDenied"),
            TIMEOUT,
        )
        .await,
    );
    assert!(
        message.starts_with("spec.syncedTypes[0] (trust.vcp.test/v1 Person) "),
        "{message}"
    );
    assert!(message.contains("\"people\""), "{message}");
    assert!(message.contains("\"persons\""), "{message}");
    // The Event the operator publishes right after its status write: the evidence that it looked.
    vcp_tests::wait_event(&admin, NS, "people-syncer", "PolicyDenied", TIMEOUT).await;
    assert_eq!(operator_writes_in(NS).await, Vec::<(String, String)>::new());

    // Named explicitly, admission checks `people`: installed, and the Role grants it.
    let named =
        "  syncedTypes:\n    - { apiVersion: trust.vcp.test/v1, kind: Person, resource: people }\n";
    apply_yaml(
        &admin,
        &plugin_yaml("people-syncer", "my-vcluster", named),
        Some(NS),
    )
    .await
    .expect("plugin");
    ready_message(
        &vcp_tests::wait_ready(
            &admin,
            NS,
            "people-syncer",
            "True",
            Some("Installed"),
            TIMEOUT,
        )
        .await,
    );
    let role = Api::<Role>::namespaced(admin.clone(), NS)
        .get("vcp-plugin-people-syncer")
        .await
        .unwrap();
    assert!(
        role.rules
            .unwrap()
            .iter()
            .any(|r| r.resources == Some(vec!["people".to_string()])),
    );
}
