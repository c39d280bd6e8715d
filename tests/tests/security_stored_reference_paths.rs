//! A reference's written paths, at runtime: a plugin stored before the CRD refused a
//! reference's `namespacePath` on the object's identity cannot write it. On the real host and
//! virtual API servers (RBAC on), with the runtime in-process as `vcp-syncer`
//! ([`vcp_tests::runtime`]).
//!
//! When the value at a reference patch's `path` is a string, vCluster reads `namespacePath`
//! from the object's root, and the host namespace is written there on the host copy. With
//! `namespacePath: metadata.labels["vcluster.loft.sh/managed-by"]` the host copy's owner label
//! became the host namespace: the copy no longer belonged to the vCluster and stayed behind when
//! the virtual object went. The CRD refuses that path now (`tests/fixtures/invalid/` and
//! `attacks/`); a plugin stored before the rule is still served as it is, so the runtime refuses
//! it again (`Patches::new`: the type is unavailable, `RuntimeHealthy=False`) and writes
//! nothing for it.
//!
//! The test stores such a plugin the way one was stored before the rule: the CRD without the
//! reference's rules, the plugin applied, the CRD restored (and shown to refuse the same spec
//! in a new plugin now, while the stored plugin stays: the API server does not judge a stored
//! value again that an update leaves unchanged, CRD validation ratcheting).

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_syncer_runtime::PodSync;
use vcp_tests::runtime::{TIMEOUT, apply_dynamic as apply, world_with};
use vcp_tests::{Audit, Identity, TEST_FIELD_MANAGER, poll_for, repo_root, wait_for};

const TEST: &str = "stored-paths";
const VIRTUAL_NS: &str = "stored-a";
/// The attack's path.
const MANAGED_BY_PATH: &str = "metadata.labels[\"vcluster.loft.sh/managed-by\"]";
const MANAGED_BY: &str = "vcluster.loft.sh/managed-by";

fn crds() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    )
}

fn widgets() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("e2e.vcp.test", "v1", "Widget"),
        "widgets",
    )
}

/// The Widget CRD of the runtime tests: `spec` and `status` keep every field.
fn widget_crd() -> Value {
    let free = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.e2e.vcp.test"},
        "spec": {"group": "e2e.vcp.test", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "properties": {"spec": free, "status": free}}}}]}
    })
}

/// The plugin's spec: Widgets of this test to the host, with a reference patch on the string
/// `spec.secretName` and `namespace_path` as its `namespacePath` when given.
fn spec(namespace_path: Option<&str>) -> Value {
    let mut reference = json!({"apiVersion": "v1", "kind": "Secret"});
    if let Some(path) = namespace_path {
        reference["namespacePath"] = json!(path);
    }
    json!({
        "vcluster": {"name": format!("vc-{TEST}")},
        "syncedTypes": [{
            "apiVersion": "e2e.vcp.test/v1", "kind": "Widget",
            "selector": {"matchLabels": {"e2e": TEST}},
            "patches": [{"path": "spec.secretName", "reference": reference}]
        }]
    })
}

fn plugin(namespace: &str, namespace_path: Option<&str>) -> VClusterPlugin {
    serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": {"name": "car-plugin", "namespace": namespace},
        "spec": spec(namespace_path)
    }))
    .expect("plugin")
}

/// The VClusterPlugin CRD as `crds/` ships it, as JSON; without the reference's CEL rules
/// (`x-kubernetes-validations` of `patches[].reference`) when `weakened`: the CRD before the
/// rule existed.
fn plugin_crd(weakened: bool) -> Value {
    let text = std::fs::read_to_string(repo_root().join("crds/vclusterplugins.vcp.dev.yaml"))
        .expect("read the CRD");
    let mut crd: Value = serde_yaml::from_str(&text).expect("parse the CRD");
    if weakened {
        for version in crd["spec"]["versions"].as_array_mut().expect("versions") {
            let reference = version
                .pointer_mut(
                    "/schema/openAPIV3Schema/properties/spec/properties/syncedTypes/items/properties/patches/items/properties/reference",
                )
                .and_then(Value::as_object_mut)
                .expect("the reference's schema");
            reference.remove("x-kubernetes-validations");
        }
    }
    crd
}

async fn widget(api: &Api<DynamicObject>, name: &str, secret: &str) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "e2e.vcp.test/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": VIRTUAL_NS, "labels": {"e2e": TEST}},
        "spec": {"secretName": secret}
    }))
    .expect("widget");
    // the discovery of a new CRD may lag: retry until served
    wait_for(TIMEOUT, || {
        let (api, obj) = (api.clone(), obj.clone());
        async move {
            api.patch(
                name,
                &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await
            .ok()
        }
    })
    .await;
}

fn label(obj: &DynamicObject, key: &str) -> Option<String> {
    obj.metadata.labels.as_ref()?.get(key).cloned()
}

#[tokio::test]
async fn a_stored_reference_cannot_write_the_identity_through_namespace_path() {
    let cp = vcp_tests::ControlPlane::shared();
    for cluster in [vcp_tests::Cluster::Host, vcp_tests::Cluster::Virtual] {
        let client = cp.client(cluster, Identity::Admin).await;
        apply(&client, &crds(), None, widget_crd()).await;
    }
    // 1. a plugin without namespacePath: the runtime syncs, the host copy belongs to the vCluster
    let world = world_with(TEST, &[VIRTUAL_NS], spec(None), PodSync::Hooks).await;
    let virtual_widgets: Api<DynamicObject> =
        Api::namespaced_with(world.virtual_.clone(), VIRTUAL_NS, &widgets());
    let host_widgets: Api<DynamicObject> =
        Api::namespaced_with(world.host.clone(), &world.host_ns, &widgets());
    widget(&virtual_widgets, "before", "s").await;
    let before_host = vcp_tests::vcluster_host_name("before", VIRTUAL_NS, &world.vcluster);
    let copy = wait_for(TIMEOUT, || {
        let api = host_widgets.clone();
        let name = before_host.clone();
        async move { api.get_opt(&name).await.ok().flatten() }
    })
    .await;
    assert_eq!(
        label(&copy, MANAGED_BY).as_deref(),
        Some(world.vcluster.as_str()),
        "the host copy belongs to the vCluster"
    );

    // 2. the plugin stored with the attack's namespacePath while the CRD had no rule for it
    let crd_api: Api<DynamicObject> = Api::all_with(world.host.clone(), &crds());
    let apply_crd = |weakened: bool| {
        let crd_api = crd_api.clone();
        async move {
            let crd: DynamicObject =
                serde_json::from_value(plugin_crd(weakened)).expect("the CRD as an object");
            crd_api
                .patch(
                    "vclusterplugins.vcp.dev",
                    &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                    &Patch::Apply(&crd),
                )
                .await
                .expect("apply the CRD");
        }
    };
    let plugins: Api<VClusterPlugin> = Api::namespaced(world.host.clone(), &world.host_ns);
    let attack = plugin(&world.host_ns, Some(MANAGED_BY_PATH));
    // `dry_run`: a new plugin of that spec (an unchanged stored value is not judged again:
    // the API server ratchets CEL rules on values an update leaves as they are)
    let store = |dry_run: bool| {
        let (plugins, mut attack) = (plugins.clone(), attack.clone());
        async move {
            let mut params = PatchParams::apply(TEST_FIELD_MANAGER).force();
            params.dry_run = dry_run;
            let name = if dry_run {
                "another-plugin"
            } else {
                "car-plugin"
            };
            attack.metadata.name = Some(name.into());
            plugins.patch(name, &params, &Patch::Apply(&attack)).await
        }
    };
    apply_crd(true).await;
    // the API server serves the weakened CRD a moment after the write
    let stored = poll_for(TIMEOUT, || async { store(false).await.ok() })
        .await
        .expect("the plugin is stored under the CRD without the rule");
    let generation = stored.metadata.generation.expect("generation");
    apply_crd(false).await;
    // the restored CRD refuses the same spec in a new plugin (the rule is served again), the
    // stored plugin stays
    let refusal = poll_for(TIMEOUT, || async { store(true).await.err() })
        .await
        .expect("the restored CRD refuses the attack's namespacePath");
    assert!(
        refusal.to_string().contains("namespacePath"),
        "the refusal names namespacePath: {refusal}"
    );
    let kept = plugins.get("car-plugin").await.expect("the stored plugin");
    assert_eq!(kept.metadata.generation, Some(generation));
    assert_eq!(
        kept.spec.synced_types[0].patches[0]
            .reference
            .as_ref()
            .and_then(|r| r.namespace_path.as_deref()),
        Some(MANAGED_BY_PATH)
    );
    vcp_tests::accept_as_operator(&world.host, &world.host_ns, "car-plugin").await;

    // 3. the runtime looked at the stored spec and refused the type, naming the field
    let condition = poll_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "RuntimeHealthy" && c.status == "False")
        }
    })
    .await;
    let after_host = vcp_tests::vcluster_host_name("after", VIRTUAL_NS, &world.vcluster);
    let Some(condition) = condition else {
        widget(&virtual_widgets, "after", "t").await;
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        let labels = |name: String| {
            let api = host_widgets.clone();
            async move {
                api.get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|o| label(&o, MANAGED_BY))
            }
        };
        panic!(
            "the runtime accepted the stored namespacePath: host copies' {MANAGED_BY} now {:?} (before) and {:?} (after), the vCluster is {}",
            labels(before_host.clone()).await,
            labels(after_host.clone()).await,
            world.vcluster
        );
    };
    println!(
        "RuntimeHealthy=False {}: {}",
        condition.reason, condition.message
    );
    assert!(
        condition.message.contains("reference.namespacePath")
            && condition.message.contains("vcluster.loft.sh/managed-by"),
        "the condition names the refused path: {}",
        condition.message
    );

    // 4. a new virtual object gets no host copy, the old copy keeps its owner label
    widget(&virtual_widgets, "after", "t").await;
    let written = || {
        let host_ns = world.host_ns.clone();
        async move {
            Audit::writes()
                .by(Identity::Syncer)
                .in_namespace(&host_ns)
                .resource("widgets")
                .caught_up()
                .await
                .attempts()
        }
    };
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let attempts = written().await;
    let of_after = attempts
        .iter()
        .filter(|w| w.object_name == after_host)
        .count();
    println!(
        "the runtime's write attempts on host widgets: {} in all, {of_after} of {after_host}",
        attempts.len()
    );
    assert!(
        !attempts.is_empty(),
        "the audit log shows the runtime's writes of the first copy"
    );
    assert_eq!(of_after, 0, "the runtime wrote {after_host}");
    assert!(
        host_widgets
            .get_opt(&after_host)
            .await
            .expect("read")
            .is_none(),
        "{after_host} exists on the host"
    );
    let copy = host_widgets
        .get(&before_host)
        .await
        .expect("the first copy");
    assert_eq!(
        label(&copy, MANAGED_BY).as_deref(),
        Some(world.vcluster.as_str()),
        "the first host copy still belongs to the vCluster"
    );
}
