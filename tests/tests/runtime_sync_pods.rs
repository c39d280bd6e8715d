//! The declarative runtime (`vcp_syncer_runtime::run`) end to end, on the real host and virtual
//! API servers (RBAC on).
//!
//! The runtime runs in-process under the `vcp-syncer` identity, which each test grants only a
//! Role in its own host namespace (plus read access to Cars in the virtual cluster): the host
//! is watched in that namespace only. The virtual cluster is shared by all tests, so each
//! test's VClusterPlugin selects its own Cars with a label selector (`e2e=<test>`), and each
//! test uses its own host namespace and vCluster name.

//!
//! This binary: Pods: the pod hook on the vCluster's host pods, `--pod-sync=full`, and pod hooks on immutable fields. The harness ([`vcp_tests::World`]) is in
//! tests/src/runtime.rs; the other `runtime_sync_*` binaries cover the rest.

use vcp_crds::Reason;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use vcp_syncer_runtime::PodSync;
use vcp_tests::runtime::{
    TIMEOUT, apply_dynamic as apply, default_spec, pods_resource, world, world_with,
};
use vcp_tests::{Cluster, ControlPlane, Identity, string_map, wait_for};

#[tokio::test]
async fn pod_hook_labels_host_pods_of_the_vcluster() {
    let w = world("pods", &[]).await;
    let pods = Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &pods_resource());
    let pod = |name: &str, labels: Value| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": w.host_ns, "labels": labels},
            "spec": {"automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
        })
    };
    apply(
        &w.host,
        &pods_resource(),
        Some(&w.host_ns),
        pod(
            "synced-pod",
            json!({"vcluster.loft.sh/managed-by": w.vcluster, "app": "web"}),
        ),
    )
    .await;
    apply(
        &w.host,
        &pods_resource(),
        Some(&w.host_ns),
        pod("other-pod", json!({"app": "web"})),
    )
    .await;

    let hooked = wait_for(TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("synced-pod").await.ok()?;
            (pod.labels().get("created-by-plugin").map(String::as_str) == Some("pod-hook"))
                .then_some(pod)
        }
    })
    .await;
    assert_eq!(
        hooked.labels(),
        &string_map([
            ("vcluster.loft.sh/managed-by", w.vcluster.as_str()),
            ("app", "web"),
            ("created-by-plugin", "pod-hook"),
        ])
    );
    // idempotent: no further write once applied. The trigger is a label the hook does not
    // manage: once the runtime reconciled the pod again, the audit log shows no write since.
    let key = format!("{}/synced-pod", w.host_ns);
    let before = w.reconciles.reconciles("Pod", &key);
    let writes_before = w.runtime_writes("/pods/synced-pod");
    assert_eq!(
        writes_before.len(),
        1,
        "one write applied the hook: {writes_before:?}"
    );
    let poked = pods
        .patch(
            "synced-pod",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e-poke": "1"}}})),
        )
        .await
        .expect("poke the pod");
    let after = w.wait_reconciled("Pod", &key, before).await;
    let writes_after = w.runtime_writes("/pods/synced-pod");
    let later = pods.get("synced-pod").await.expect("pod");
    println!(
        "pod hook applied: runtime reconciled {key} {} more time(s) after a label change; its \
         writes of the pod: {} before, {} after; of other-pod: {}",
        after - before,
        writes_before.len(),
        writes_after.len(),
        w.runtime_writes("/pods/other-pod").len()
    );
    assert_eq!(
        writes_after, writes_before,
        "no write once the hook is applied"
    );
    assert_eq!(later.resource_version(), poked.resource_version());
    // a pod of no vCluster is not touched
    let other = pods.get("other-pod").await.expect("other pod");
    assert_eq!(other.labels(), &string_map([("app", "web")]));
    assert_eq!(
        w.runtime_writes("/pods/other-pod"),
        Vec::<(String, String)>::new()
    );

    // a label removed on the host is put back (UpdatePhysical)
    pods.patch(
        "synced-pod",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"created-by-plugin": null}}})),
    )
    .await
    .expect("unlabel");
    wait_for(TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("synced-pod").await.ok()?;
            pod.labels().contains_key("created-by-plugin").then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn pod_sync_full_syncs_pods_and_their_status() {
    let w = world_with(
        "podfull",
        &["podfull-a"],
        default_spec("podfull"),
        PodSync::Full,
    )
    .await;
    let virtual_pods =
        Api::<DynamicObject>::namespaced_with(w.virtual_.clone(), "podfull-a", &pods_resource());
    let host_pods =
        Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &pods_resource());
    let pod = apply(
        &w.virtual_,
        &pods_resource(),
        Some("podfull-a"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "podfull-a", "labels": {"app": "web"}},
            "spec": {"automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "registry.invalid/web:1"}]}
        }),
    )
    .await;
    let host_name = "web-x-podfull-a-x-vc-podfull";
    let host_pod = wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        async move { api.get_opt(host_name).await.ok().flatten() }
    })
    .await;
    // translated metadata, with the pod hook applied before the write (CreatePhysical)
    assert_eq!(
        host_pod.labels(),
        &string_map([
            ("app", "web"),
            ("vcluster.loft.sh/managed-by", "vc-podfull"),
            ("vcluster.loft.sh/namespace", "podfull-a"),
            ("created-by-plugin", "pod-hook"),
        ])
    );
    assert_eq!(
        host_pod.annotations().get("vcluster.loft.sh/object-uid"),
        pod.uid().as_ref()
    );
    assert_eq!(
        host_pod
            .annotations()
            .get("vcluster.loft.sh/object-kind")
            .map(String::as_str),
        Some("/v1, Kind=Pod")
    );
    assert_eq!(
        host_pod.data["spec"]["containers"][0]["image"],
        json!("registry.invalid/web:1")
    );

    // no node runs it: the status is written on the host as admin and copied up
    host_pods
        .patch_status(
            host_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"message": "set on the host", "reason": "HostSide"}})),
        )
        .await
        .expect("host pod status");
    wait_for(TIMEOUT, || {
        let api = virtual_pods.clone();
        async move {
            let pod = api.get("web").await.ok()?;
            (pod.data["status"]["message"] == json!("set on the host")).then_some(())
        }
    })
    .await;

    // a label change follows; deleting the virtual pod deletes the host pod
    apply(&w.virtual_, &pods_resource(), Some("podfull-a"), json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "podfull-a", "labels": {"app": "web", "v": "2"}},
        "spec": {"automountServiceAccountToken": false,
                 "containers": [{"name": "c", "image": "registry.invalid/web:1"}]}
    }))
    .await;
    wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        async move {
            let pod = api.get(host_name).await.ok()?;
            (pod.labels().get("v").map(String::as_str) == Some("2")).then_some(())
        }
    })
    .await;
    virtual_pods
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete virtual pod");
    wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        async move { api.get_opt(host_name).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// An `UpdatePhysical` pod hook whose JSON patch renames a container — a field Kubernetes does
/// not let change on an existing pod (`ValidatePodUpdate`) — with `--pod-sync=full`: the
/// runtime leaves that change out and says so once (a `Warning` Event `ImmutablePodFields` and a
/// log line), never sends the refused update, and keeps syncing the labels.
#[tokio::test]
async fn pod_hook_on_an_immutable_field_is_skipped_once_and_labels_keep_syncing() {
    let mut spec = default_spec("immut");
    spec["hooks"] = json!([{
        "name": "rename-container", "apiVersion": "v1", "kind": "Pod",
        "events": ["UpdatePhysical"],
        "labels": {"hooked": "yes"},
        "jsonPatch": [{"op": "replace", "path": "/spec/containers/0/name", "value": "renamed"}]
    }]);
    // only this test's pods: the virtual cluster is shared, and another test's pod synced here
    // drew a second ImmutablePodFields Warning, which the Event recorder counted as series 2
    spec["syncedTypes"]
        .as_array_mut()
        .expect("types")
        .push(json!({
            "apiVersion": "v1", "kind": "Pod", "syncStatus": true,
            "selector": {"matchLabels": {"e2e": "immut"}}
        }));
    let w = world_with("immut", &["immut-a"], spec, PodSync::Full).await;
    let host_pods =
        Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &pods_resource());
    let virtual_pod = |mut labels: Value| {
        labels["e2e"] = json!("immut");
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "immut-a", "labels": labels},
            "spec": {"automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "registry.invalid/web:1"}]}
        })
    };
    apply(
        &w.virtual_,
        &pods_resource(),
        Some("immut-a"),
        virtual_pod(json!({"app": "web"})),
    )
    .await;
    let host_name = "web-x-immut-a-x-vc-immut";
    let started = std::time::Instant::now();
    // the hook's label arrives (UpdatePhysical), its container rename does not
    let hooked = wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        async move {
            let pod = api.get_opt(host_name).await.ok()??;
            (pod.labels().get("hooked").map(String::as_str) == Some("yes")).then_some(pod)
        }
    })
    .await;
    assert_eq!(hooked.data["spec"]["containers"][0]["name"], json!("c"));
    let event = vcp_tests::wait_event(
        &w.host,
        &w.host_ns,
        "car-plugin",
        Reason::ImmutablePodFields.as_str(),
        TIMEOUT,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.clone().unwrap_or_default();
    assert!(
        note.contains(host_name) && note.contains("/spec/containers/0/name"),
        "{note}"
    );

    // several more syncs of the pod: each label change on the virtual pod reaches the host pod
    let key = "immut-a/web";
    let first = w.reconciles.reconciles("Pod", key);
    for round in 1..=3 {
        let before = w.reconciles.reconciles("Pod", key);
        apply(
            &w.virtual_,
            &pods_resource(),
            Some("immut-a"),
            virtual_pod(json!({"app": "web", "round": round.to_string()})),
        )
        .await;
        let round_label = round.to_string();
        wait_for(TIMEOUT, || {
            let api = host_pods.clone();
            let round_label = round_label.clone();
            async move {
                let pod = api.get(host_name).await.ok()?;
                (pod.labels().get("round") == Some(&round_label)
                    && pod.labels().get("hooked").map(String::as_str) == Some("yes"))
                .then_some(())
            }
        })
        .await;
        w.wait_reconciled("Pod", key, before).await;
    }
    let syncs = w.reconciles.reconciles("Pod", key) - first;

    // exactly one Event, never repeated; no update refused by the API server
    let events: Vec<_> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.host.clone(), &w.host_ns)
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(Reason::ImmutablePodFields.as_str()))
            .collect();
    let repeats: i32 = events
        .iter()
        .map(|e| e.series.as_ref().map_or(0, |s| s.count))
        .sum();
    let writes: Vec<_> = vcp_tests::audited_write_events(ControlPlane::shared(), Cluster::Host)
        .expect("audit log")
        .into_iter()
        .filter(|w| {
            w.user == Identity::Syncer.user() && w.uri.contains(&format!("/pods/{host_name}"))
        })
        .collect();
    let refused = writes.iter().filter(|w| w.code >= 400).count();
    println!(
        "fault: UpdatePhysical hook renames spec.containers[0].name (immutable on a pod); {syncs} \
         syncs of the pod after the warning, {} ImmutablePodFields Event(s) (series count \
         {repeats}), runtime writes of the host pod: {} ({refused} refused), {:.1} s",
        events.len(),
        writes.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(syncs >= 3, "the runtime synced the pod {syncs} times");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(repeats, 0, "{events:?}");
    assert_eq!(refused, 0, "{writes:?}");
    let last = host_pods.get(host_name).await.expect("host pod");
    assert_eq!(last.data["spec"]["containers"][0]["name"], json!("c"));
}

/// The same beside a vCluster (`--pod-sync=hooks`, the default), where the host pods exist
/// before any hook runs: a pod hook that sets `spec.nodeName` and a label gets its label onto
/// the vCluster's host pod, the `nodeName` change is left out and reported once, and no update
/// is refused, over several syncs of the pod.
#[tokio::test]
async fn pod_hook_on_an_immutable_field_beside_a_vcluster_is_skipped_once() {
    let mut spec = default_spec("immuthooks");
    spec["hooks"] = json!([{
        "name": "pin-node", "apiVersion": "v1", "kind": "Pod",
        "events": ["CreatePhysical", "UpdatePhysical"],
        "labels": {"hooked": "yes"},
        "jsonPatch": [{"op": "add", "path": "/spec/nodeName", "value": "node-1"}]
    }]);
    let w = world_with("immuthooks", &[], spec, PodSync::Hooks).await;
    let pods = Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &pods_resource());
    let pod = |labels: Value| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "synced-pod", "namespace": w.host_ns, "labels": labels},
            "spec": {"automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "registry.invalid/none:1"}]}
        })
    };
    let managed = json!({"vcluster.loft.sh/managed-by": w.vcluster});
    apply(
        &w.host,
        &pods_resource(),
        Some(&w.host_ns),
        pod(managed.clone()),
    )
    .await;
    wait_for(TIMEOUT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("synced-pod").await.ok()?;
            (pod.labels().get("hooked").map(String::as_str) == Some("yes")).then_some(())
        }
    })
    .await;
    let event = vcp_tests::wait_event(
        &w.host,
        &w.host_ns,
        "car-plugin",
        Reason::ImmutablePodFields.as_str(),
        TIMEOUT,
    )
    .await;
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("/spec/nodeName"),
        "{:?}",
        event.note
    );
    let key = format!("{}/synced-pod", w.host_ns);
    let first = w.reconciles.reconciles("Pod", &key);
    for round in 1..=3 {
        let before = w.reconciles.reconciles("Pod", &key);
        let mut labels = managed.clone();
        labels["round"] = json!(round.to_string());
        labels["hooked"] = json!("yes");
        apply(&w.host, &pods_resource(), Some(&w.host_ns), pod(labels)).await;
        w.wait_reconciled("Pod", &key, before).await;
    }
    let syncs = w.reconciles.reconciles("Pod", &key) - first;
    let events: Vec<_> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.host.clone(), &w.host_ns)
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(Reason::ImmutablePodFields.as_str()))
            .collect();
    let writes: Vec<_> = vcp_tests::audited_write_events(ControlPlane::shared(), Cluster::Host)
        .expect("audit log")
        .into_iter()
        .filter(|w| w.user == Identity::Syncer.user() && w.uri.contains("/pods/synced-pod"))
        .collect();
    let refused = writes.iter().filter(|w| w.code >= 400).count();
    let last = pods.get("synced-pod").await.expect("pod");
    println!(
        "fault: pod hook adds spec.nodeName to existing host pods (--pod-sync=hooks); {syncs} \
         syncs after the warning, {} ImmutablePodFields Event(s) (series {:?}), runtime writes \
         of the pod: {} ({refused} refused)",
        events.len(),
        events
            .iter()
            .map(|e| e.series.as_ref().map(|s| s.count))
            .collect::<Vec<_>>(),
        writes.len()
    );
    assert!(syncs >= 3, "{syncs}");
    assert_eq!(events.len(), 1);
    assert!(events[0].series.is_none(), "{events:?}");
    assert_eq!(refused, 0, "{writes:?}");
    assert_eq!(last.data["spec"].get("nodeName"), None);
    assert_eq!(last.labels().get("hooked").map(String::as_str), Some("yes"));
}
