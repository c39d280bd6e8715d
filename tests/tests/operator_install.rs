//! The operator end to end, on the real host API server (RBAC on): the operator runs
//! in-process under the `vcp-operator` identity, which holds only `config/rbac/role.yaml`.
//!
//! There is no kube-controller-manager: no garbage collector, no namespace deletion, no default
//! ServiceAccount, and a StatefulSet never gets pods. Each test uses its own namespace and
//! creates the vCluster's ServiceAccount itself.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::{OPERATOR_FIELD_MANAGER, VClusterPlugin};
use vcp_tests::{Audit, Identity, condition, create_plugin, delete_plugin, wait_event, wait_ready};

const RUNTIME_IMAGE: &str = "vcp-test/runtime:e2e";
const TIMEOUT: Duration = Duration::from_secs(30);

/// Installs the CRDs and the operator's RBAC, then starts one operator for this test binary on
/// its own thread and runtime (so it outlives each test's runtime). Returns an admin client.
async fn setup() -> Client {
    vcp_tests::start_shared_operator(RUNTIME_IMAGE).await
}

/// A namespace with the vCluster `my-vcluster` as its chart renders it (vCluster v0.30.0,
/// default values: ServiceAccount `vc-my-vcluster`, Services, config Secret, StatefulSet with
/// container `syncer`), created by the field manager "helm" as `helm install` does. Returns the
/// StatefulSet's original `spec.template`.
async fn vcluster(admin: &Client, ns: &str) -> Value {
    vcp_tests::create_namespace(admin, ns).await;
    vcluster_in_existing_namespace(admin, ns).await
}

async fn vcluster_in_existing_namespace(admin: &Client, ns: &str) -> Value {
    let created =
        vcp_tests::create_yaml(admin, &vcp_tests::vcluster_workload(ns), Some(ns), "helm")
            .await
            .expect("create the vCluster as its chart renders it");
    let sts = created
        .into_iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "StatefulSet"))
        .expect("the chart's StatefulSet");
    let sts: StatefulSet =
        serde_json::from_value(serde_json::to_value(sts).expect("json")).expect("StatefulSet");
    serde_json::to_value(&sts.spec.unwrap().template).unwrap()
}

/// An embedded-runtime plugin `name` of the vCluster `my-vcluster` in `ns`, syncing one type
/// to the host.
fn embedded_spec(api_version: &str, kind: &str) -> Value {
    json!({
        "vcluster": { "name": "my-vcluster" },
        "syncedTypes": [{ "apiVersion": api_version, "kind": kind }],
    })
}

async fn sts(admin: &Client, ns: &str) -> StatefulSet {
    Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .get("my-vcluster")
        .await
        .expect("get StatefulSet")
}

fn template(s: &StatefulSet) -> Value {
    serde_json::to_value(&s.spec.as_ref().unwrap().template).unwrap()
}

fn operator_owns_something(s: &StatefulSet) -> bool {
    s.metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|m| m.manager.as_deref() == Some(OPERATOR_FIELD_MANAGER))
}

/// The operator's write requests so far that concern namespace `ns` or its cluster objects,
/// once the audit log holds every request answered before the call.
async fn operator_writes(ns: &str) -> Vec<(String, String)> {
    Audit::writes()
        .by(Identity::Operator)
        .in_namespace(ns)
        .and_its_cluster_objects()
        .caught_up()
        .await
        .requests()
}

#[tokio::test]
async fn embedded_plugin_install_converge_and_clean_removal() {
    let admin = setup().await;
    let ns = "op-embedded";
    let original = vcluster(&admin, ns).await;

    // A cluster rule too (nothing cluster-wide is derived): RBAC objects of all four kinds.
    let mut spec = embedded_spec("example.loft.sh/v1", "Car");
    spec["rbac"] = json!({ "clusterRole": { "extraRules": [{
        "apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
        "verbs": ["get", "list", "watch"],
    }] } });
    create_plugin(&admin, ns, "car-syncer", spec).await;
    let p = wait_ready(&admin, ns, "car-syncer", "True", None, TIMEOUT).await;
    let status = p.status.as_ref().unwrap();
    assert_eq!(status.phase, Some(vcp_crds::Phase::Ready));
    assert_eq!(status.runtime.as_deref(), Some("embedded"));
    assert_eq!(
        status
            .workload
            .as_ref()
            .map(|w| (w.kind.as_str(), w.name.as_str())),
        Some(("StatefulSet", "my-vcluster"))
    );
    for c in ["WorkloadPatched", "RBACReady"] {
        assert_eq!(
            condition(&p, c).map(|c| c.status.as_str()),
            Some("True"),
            "{c}"
        );
    }

    // The StatefulSet carries the sidecar; the Helm-owned parts are untouched.
    let live = sts(&admin, ns).await;
    let spec = live.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let names: Vec<_> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["syncer", "car-syncer"]);
    let sidecar = &spec.containers[1];
    assert_eq!(sidecar.image.as_deref(), Some(RUNTIME_IMAGE));
    assert_eq!(
        sidecar.command,
        Some(vec!["/usr/local/bin/vcluster-plugin-syncer".to_string()])
    );
    assert_eq!(
        sidecar.args,
        Some(
            [
                "--namespace",
                ns,
                "--vcluster",
                "my-vcluster",
                "--virtual-kubeconfig",
                "/var/run/vcp/vcluster/config",
                // its own `/metrics` port (the first sidecar of the pod)
                "--metrics-bind-address",
                "0.0.0.0:9460",
            ]
            .map(String::from)
            .to_vec()
        )
    );
    // The plugin's name, written once: the runtime runs only the plugin named there.
    assert_eq!(
        serde_json::to_value(&sidecar.env).unwrap(),
        serde_json::json!([{ "name": "VCLUSTER_PLUGIN_NAME", "value": "car-syncer" }])
    );
    assert_eq!(
        serde_json::to_value(&spec.containers[0]).unwrap(),
        original["spec"]["containers"][0]
    );

    // RBAC: the Role with the derived Car rule, bound to vc-my-vcluster; CRD read cluster-wide.
    let role = Api::<Role>::namespaced(admin.clone(), ns)
        .get("vcp-plugin-car-syncer")
        .await
        .expect("Role");
    let rules = role.rules.unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r.api_groups == Some(vec!["example.loft.sh".into()])
                && r.resources == Some(vec!["cars".into()])
                && r.verbs.contains(&"delete".to_string())),
        "{rules:?}"
    );
    assert_eq!(
        role.metadata.owner_references.unwrap()[0].name,
        "car-syncer"
    );
    let rb = Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .get("vcp-plugin-car-syncer")
        .await
        .expect("RoleBinding");
    assert_eq!(rb.subjects.unwrap()[0].name, "vc-my-vcluster");
    let cluster_name = format!("vcp:{ns}:car-syncer");
    let cr = Api::<ClusterRole>::all(admin.clone())
        .get(&cluster_name)
        .await
        .expect("ClusterRole");
    assert_eq!(
        cr.labels()
            .get(vcp_crds::PLUGIN_NAMESPACE_LABEL)
            .map(String::as_str),
        Some(ns)
    );
    Api::<ClusterRoleBinding>::all(admin.clone())
        .get(&cluster_name)
        .await
        .expect("ClusterRoleBinding");

    // Converged: poking the plugin and the StatefulSet triggers reconciles that write nothing.
    // Evidence first: the operator finished a reconcile of the plugin as it is now (its Ready
    // status written), then one of each poke, before the audit log is compared.
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    let current = plugins.get("car-syncer").await.expect("plugin");
    let settled = vcp_tests::wait_operator_reconciled(
        ns,
        "car-syncer",
        &current.resource_version().unwrap_or_default(),
        0,
        TIMEOUT,
    )
    .await;
    let before = operator_writes(ns).await;
    assert!(
        before
            .iter()
            .any(|(verb, uri)| verb == "patch" && uri.contains("statefulsets/my-vcluster")),
        "the audit log shows the install: {before:?}"
    );
    let started = std::time::Instant::now();
    let touch = json!({ "metadata": { "annotations": { "e2e/touched": "1" } } });
    let touched = plugins
        .patch("car-syncer", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .expect("touch plugin");
    let touched_rv = touched.resource_version().unwrap_or_default();
    let after_plugin_touch =
        vcp_tests::wait_operator_reconciled(ns, "car-syncer", &touched_rv, settled, TIMEOUT).await;
    Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .patch(
            "my-vcluster",
            &PatchParams::default(),
            &Patch::Merge(&touch),
        )
        .await
        .expect("touch StatefulSet");
    let after_sts_touch = vcp_tests::wait_operator_reconciled(
        ns,
        "car-syncer",
        &touched_rv,
        after_plugin_touch,
        TIMEOUT,
    )
    .await;
    let writes = operator_writes(ns).await;
    let new_writes = &writes[before.len().min(writes.len())..];
    println!(
        "converged plugin: poked the plugin and its StatefulSet; the operator reconciled it {} \
         times after the pokes (reconcile #{settled} -> #{after_sts_touch}, {:.1} s); operator \
         writes in {ns}: {} before, {} after, new: {new_writes:?}",
        after_sts_touch - settled,
        started.elapsed().as_secs_f64(),
        before.len(),
        writes.len(),
    );
    assert_eq!(writes, before, "a converged plugin must cost zero writes");

    // Delete: the pod template is the original again and the operator owns nothing.
    delete_plugin(&admin, ns, "car-syncer", TIMEOUT).await;
    let after = sts(&admin, ns).await;
    assert_eq!(template(&after), original);
    assert!(
        !operator_owns_something(&after),
        "{:?}",
        after.metadata.managed_fields
    );
    assert!(
        Api::<Role>::namespaced(admin.clone(), ns)
            .get_opt("vcp-plugin-car-syncer")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<RoleBinding>::namespaced(admin.clone(), ns)
            .get_opt("vcp-plugin-car-syncer")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ClusterRole>::all(admin.clone())
            .get_opt(&cluster_name)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ClusterRoleBinding>::all(admin.clone())
            .get_opt(&cluster_name)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn missing_vcluster_is_reported_and_installed_once_it_appears() {
    let admin = setup().await;
    let ns = "op-missing";
    vcp_tests::create_namespace(&admin, ns).await;
    create_plugin(
        &admin,
        ns,
        "early",
        json!({ "vcluster": { "name": "my-vcluster" } }),
    )
    .await;
    let p = wait_ready(&admin, ns, "early", "False", None, TIMEOUT).await;
    let ready = condition(&p, "Ready").unwrap();
    assert_eq!(ready.reason, "VClusterNotFound");
    assert!(ready.message.contains("my-vcluster"), "{}", ready.message);
    assert_eq!(
        p.status.as_ref().unwrap().phase,
        Some(vcp_crds::Phase::Pending)
    );
    assert!(
        Api::<Role>::namespaced(admin.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing created"
    );
    assert!(
        Api::<RoleBinding>::namespaced(admin.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    wait_event(&admin, ns, "early", "VClusterNotFound", TIMEOUT).await;

    // The vCluster appears: the StatefulSet watch installs the plugin without any other trigger.
    vcluster_in_existing_namespace(&admin, ns).await;
    wait_ready(&admin, ns, "early", "True", None, TIMEOUT).await;
    let live = sts(&admin, ns).await;
    assert!(
        live.spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .containers
            .iter()
            .any(|c| c.name == "early")
    );
}

#[tokio::test]
async fn v2_image_plugins_share_the_plugins_volume_and_leave_no_trace() {
    let admin = setup().await;
    let ns = "op-v2";
    let original = vcluster(&admin, ns).await;
    for (name, image) in [
        ("first", "ghcr.io/loft-sh/vcluster-example:0.1.0"),
        ("second", "ghcr.io/example/other:1.0"),
    ] {
        create_plugin(
            &admin,
            ns,
            name,
            json!({ "vcluster": { "name": "my-vcluster" }, "image": image, "version": "v2" }),
        )
        .await;
    }
    for name in ["first", "second"] {
        let p = wait_ready(&admin, ns, name, "True", None, TIMEOUT).await;
        assert_eq!(
            p.status.unwrap().runtime.as_deref(),
            Some(if name == "first" {
                "ghcr.io/loft-sh/vcluster-example:0.1.0"
            } else {
                "ghcr.io/example/other:1.0"
            })
        );
    }
    // the chart's own entries (init container `kubernetes`, its volumes and mounts) stay first
    let names_in = |list: &Value| -> Vec<String> {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["name"].as_str().map(str::to_string))
            .collect()
    };
    let original_syncer = original["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "syncer")
        .unwrap()
        .clone();
    let spec = sts(&admin, ns).await.spec.unwrap().template.spec.unwrap();
    let original_inits = names_in(&original["spec"]["initContainers"]);
    let inits: Vec<_> = spec
        .init_containers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !original_inits.contains(&c.name))
        .map(|c| (c.name, c.args))
        .collect();
    assert_eq!(inits.len(), 2, "{inits:?}");
    for (name, args) in &inits {
        assert_eq!(
            args.clone().unwrap(),
            vec!["-c".to_string(), format!("cp -r /plugin /plugins/{name}")]
        );
    }
    let volumes: Vec<_> = spec
        .volumes
        .clone()
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    let mut expected_volumes = names_in(&original["spec"]["volumes"]);
    expected_volumes.push("plugins".into());
    assert_eq!(volumes, expected_volumes);
    let syncer = spec.containers.iter().find(|c| c.name == "syncer").unwrap();
    let mounts: Vec<_> = syncer
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| (m.name, m.mount_path))
        .collect();
    let mut expected_mounts: Vec<(String, String)> = original_syncer["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["mountPath"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    expected_mounts.push(("plugins".into(), "/plugins".into()));
    assert_eq!(mounts, expected_mounts);
    assert_eq!(spec.containers.len(), 1, "a v2 plugin adds no container");

    // Removing one keeps the shared volume and mount for the other.
    delete_plugin(&admin, ns, "first", TIMEOUT).await;
    let spec = sts(&admin, ns).await.spec.unwrap().template.spec.unwrap();
    let inits: Vec<_> = spec
        .init_containers
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .filter(|name| !original_inits.contains(name))
        .collect();
    assert_eq!(inits, ["second"]);
    assert!(spec.volumes.unwrap().iter().any(|v| v.name == "plugins"));
    assert!(
        spec.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.mount_path == "/plugins")
    );

    // Removing the last restores the original template exactly.
    delete_plugin(&admin, ns, "second", TIMEOUT).await;
    let after = sts(&admin, ns).await;
    assert_eq!(template(&after), original);
    assert!(
        !operator_owns_something(&after),
        "{:?}",
        after.metadata.managed_fields
    );
}

/// `UnknownType` depends on the cluster, not the spec: once the type's CRD is installed the
/// plugin is judged again ([`vcluster_plugin_operator::vcluster::RECHECK`]) and installed,
/// without any change to the plugin or its vCluster.
#[tokio::test]
async fn unknown_type_is_installed_once_its_crd_is_served() {
    let admin = setup().await;
    let ns = "op-unknown-type";
    vcluster(&admin, ns).await;
    create_plugin(
        &admin,
        ns,
        "gadgets",
        embedded_spec("late.example.com/v1", "Gadget"),
    )
    .await;
    let refused = wait_ready(&admin, ns, "gadgets", "False", None, TIMEOUT).await;
    let ready = condition(&refused, "Ready").unwrap();
    assert_eq!(ready.reason, "UnknownType");
    assert!(ready.message.contains("Gadget"), "{}", ready.message);
    let untouched = sts(&admin, ns).await;
    assert!(
        !operator_owns_something(&untouched),
        "a refused plugin leaves the workload untouched"
    );
    // Let the reconciles the refusal's own writes (status, Event) trigger pass, so only the
    // recheck can notice the CRD: a reconcile of the poked plugin finished after them.
    vcp_tests::poke_plugin(&admin, ns, "gadgets", TIMEOUT).await;

    vcp_tests::apply_yaml(
        &admin,
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: { name: gadgets.late.example.com }
spec:
  group: late.example.com
  scope: Namespaced
  names: { plural: gadgets, singular: gadget, kind: Gadget, listKind: GadgetList }
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: { type: object, x-kubernetes-preserve-unknown-fields: true }
"#,
        None,
    )
    .await
    .expect("install the Gadget CRD");

    let installed = {
        let timeout = vcluster_plugin_operator::vcluster::RECHECK + TIMEOUT;
        wait_ready(&admin, ns, "gadgets", "True", None, timeout).await
    };
    assert_eq!(
        installed.metadata.generation, refused.metadata.generation,
        "installed without a change of the plugin"
    );
    let role = Api::<Role>::namespaced(admin.clone(), ns)
        .get(&vcluster_plugin_operator::rbac::role_name("gadgets"))
        .await
        .expect("the plugin's dedicated Role");
    assert!(
        role.rules.iter().flatten().any(|r| {
            r.api_groups.as_deref() == Some(&["late.example.com".to_string()][..])
                && r.resources.as_deref() == Some(&["gadgets".to_string()][..])
        }),
        "{:?}",
        role.rules
    );
    assert!(
        template(&sts(&admin, ns).await)["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "gadgets"),
        "the sidecar is added"
    );
}
