//! Pods created through vCluster's own pod syncer with the plugins' `CreatePhysical` hooks, and
//! the plugin's spec.

use super::*;

/// A virtual Pod `name` synced by vCluster's own pod syncer while plugins with `CreatePhysical`
/// pod hooks run: the host pod carries each hook's label (`hooked`: key, value) in the object its
/// create stored (the watch's ADDED event), so vCluster applied the hooks before its create
/// (vCluster's log names its pod syncer as the creator). vCluster then copies the labels up to
/// the virtual pod and records them in the host pod's annotation `vcluster.loft.sh/labels`: its
/// one update of the host pod (the audit log), which leaves the labels as created.
pub(crate) async fn assert_hooked_create(
    host: &Client,
    virtual_: &Client,
    t: &Target,
    syncer: &VClusterSyncer,
    name: &str,
    hooked: &[(&str, &str)],
) {
    let has_hooks = |labels: &std::collections::BTreeMap<String, String>| {
        hooked
            .iter()
            .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
    };
    let since = SystemTime::now();
    let host_name = format!("{name}-x-{}-x-{VCLUSTER_RELEASE}", t.vns);
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), &t.ns);
    let mut watch = host_pods
        .watch(
            &WatchParams::default().fields(&format!("metadata.name={host_name}")),
            "0",
        )
        .await
        .expect("watch the host pod")
        .boxed();
    create_virtual_pod(virtual_, t, name).await;
    let added = next_event(
        &mut watch,
        &host_name,
        "the host pod's create",
        |e| match e {
            WatchEvent::Added(pod) => Some(pod),
            _ => None,
        },
    )
    .await;
    assert!(
        has_hooks(added.labels()),
        "the created host pod carries every hook's label {hooked:?}: {:?}",
        added.labels()
    );
    // vCluster's own log: its pod syncer (controller "pod") created that host object, and that
    // very line names it.
    let create = format!(
        "Create host object\t{{\"component\": \"vcluster\", \"controller\": \"pod\", \"namespace\": \"{}\", \"name\": \"{name}\"",
        t.vns
    );
    let log = syncer.wait_log(&create, 1, TIMEOUT).await;
    let line = log
        .lines()
        .find(|l| l.contains(&create))
        .unwrap_or_default();
    assert!(
        line.contains(&format!("\"object\": \"{}/{host_name}\"", t.ns)),
        "vCluster's create of {host_name} names it: {line}"
    );
    // vCluster then copies the hook's host label up to the virtual pod (its pod syncer syncs
    // labels both ways: pkg/controllers/resources/pods/translate/diff.go), and records the
    // virtual pod's labels in the host pod's annotation `vcluster.loft.sh/labels`: its one
    // update of the host pod, which does not touch the label.
    let virtual_pods: Api<Pod> = Api::namespaced(virtual_.clone(), &t.vns);
    wait_for(TIMEOUT, || {
        let api = virtual_pods.clone();
        async move { has_hooks(api.get(name).await.ok()?.labels()).then_some(()) }
    })
    .await;
    let records = |annotations: &std::collections::BTreeMap<String, String>| {
        annotations
            .get("vcluster.loft.sh/labels")
            .is_some_and(|l| hooked.iter().all(|(k, _)| l.contains(k)))
    };
    wait_for(TIMEOUT, || {
        let api = host_pods.clone();
        let name = host_name.clone();
        async move { records(api.get(&name).await.ok()?.annotations()).then_some(()) }
    })
    .await;
    // Evidence that the syncer kept working after those writes: a second pod is synced later.
    create_virtual_pod(virtual_, t, &format!("{name}-next")).await;
    host_pod(host, t, &format!("{name}-next")).await;
    let writes = pod_writes(t, &host_name, since).await;
    assert_eq!(
        writes.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>(),
        ["create", "update"],
        "vCluster created host pod {host_name} with the hooks' labels, then recorded the copied-up labels: {writes:?}"
    );
    // That update, as the watch saw it: the labels are those of the create.
    let modified = next_event(
        &mut watch,
        &host_name,
        "vCluster's update of the host pod",
        |e| match e {
            WatchEvent::Modified(pod) => Some(pod),
            _ => None,
        },
    )
    .await;
    assert_eq!(modified.labels(), added.labels());
    assert!(
        records(modified.annotations()),
        "{:?}",
        modified.annotations()
    );
    // v0.30.0 logs each patch it applies (pkg/patcher/apply.go, at info level); v0.36.1 logs
    // them only at verbosity 1, so there the watch above is the only record.
    if t.version == "v0.30.0" {
        let host_patch = syncer
            .log()
            .lines()
            .find(|l| {
                l.contains("Apply host patch")
                    && l.contains(&format!("\"object\": \"{}/{host_name}\"", t.ns))
            })
            .expect("vCluster logs its patch of the host pod")
            .to_string();
        assert!(
            host_patch.contains("vcluster.loft.sh/labels")
                && !host_patch.contains(r#"\"labels\":{"#),
            "vCluster's update of the host pod only records the virtual labels: {host_patch}"
        );
    }
}

pub(crate) fn plugin_spec(label_value: &str) -> Value {
    json!({
        "vcluster": {"name": VCLUSTER_RELEASE},
        "version": "v2",
        "syncedTypes": [{"apiVersion": "example.loft.sh/v1", "kind": "Car"}],
        "hooks": [{"name": "pod-hook", "apiVersion": "v1", "kind": "Pod",
                   "events": ["CreatePhysical"], "labels": {"created-by-plugin": label_value}}]
    })
}
