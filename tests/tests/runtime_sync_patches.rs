//! `syncedTypes[].patches[]` end to end, on the real host and virtual API servers (RBAC on), with
//! the runtime running in-process as `vcp-syncer` (the harness: [`vcp_tests::World`]).
//!
//! The synced type is a test CRD `widgets.e2e.vcp.test` whose `spec` and `status` keep unknown
//! fields, so a widget can carry a cert-manager-like `secretName` / `issuerRef`, a label
//! selector and an image. The expected values come from vCluster's own code through the
//! translate oracle (`SingleNamespaceHostName`, `HostLabelSelector`), and from the expressions'
//! documented meaning.
//!
//! - references: two virtual namespaces with the same names give different host names, equal
//!   to vCluster's; a `ClusterIssuer` (cluster-scoped in the virtual cluster) keeps its name;
//! - labels: the host selector is vCluster's `HostLabelSelector` of the virtual one;
//! - expression and reverseExpression: down on the spec, back up on the status (`syncStatus`);
//! - bounds: a never-ending expression (stopped by the time bound), a fast-allocating one
//!   (stopped by the memory bound) and the attack fixture's allocating one (by either) fail
//!   their objects only (looked at,
//!   retried, `RuntimeHealthy=False` with `PatchFailed`, an Event naming type, object and path,
//!   and 0 writes of their host copies in the audit log), while the other widgets sync; fixed,
//!   the object syncs and the condition recovers.

use std::io::Write;
use std::process::{Command, Stdio};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use vcp_crds::{Reason, VClusterPlugin};
use vcp_syncer_runtime::PodSync;
use vcp_tests::runtime::{TIMEOUT, apply_dynamic as apply, world_with};
use vcp_tests::{
    Audit, Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, poll_event_where, poll_for,
    wait_for,
};

const TEST: &str = "patches";
const VCLUSTER: &str = "vc-patches";

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

/// A CRD of `group` / `kind` / `plural` in `scope`, keeping every field of `spec` and `status`,
/// with a status subresource.
fn free_crd(group: &str, kind: &str, plural: &str, scope: &str) -> Value {
    let free = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": scope,
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "properties": {"spec": free, "status": free}}}}]}
    })
}

/// vCluster's answers (the translate oracle) to `requests`, in order.
fn ask_vcluster(requests: &[Value]) -> Vec<Value> {
    let mut child = Command::new(&vcp_tests::oracle_paths()["TRANSLATE_ORACLE"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the translation oracle");
    let input: String = requests.iter().map(|r| format!("{r}\n")).collect();
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write requests");
    let out = child.wait_with_output().expect("oracle output");
    assert!(out.status.success(), "translation oracle failed");
    let answers: Vec<Value> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON answer"))
        .collect();
    assert_eq!(answers.len(), requests.len());
    answers
}

/// vCluster's host name of `name` in virtual namespace `namespace`.
fn vcluster_host_name(name: &str, namespace: &str) -> String {
    ask_vcluster(&[
        json!({"op": "hostName", "name": name, "namespace": namespace, "vcluster": VCLUSTER}),
    ])[0]["name"]
        .as_str()
        .expect("a name")
        .to_string()
}

/// The plugin's spec: Widgets labelled `e2e=patches` to the host with their status, and the
/// patches under test.
fn spec() -> Value {
    json!({
        "vcluster": {"name": VCLUSTER},
        "syncedTypes": [{
            "apiVersion": "e2e.vcp.test/v1", "kind": "Widget", "syncStatus": true,
            "selector": {"matchLabels": {"e2e": TEST}},
            "patches": [
                {"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}},
                {"path": "spec.issuerRef", "reference": {"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
                    "namePath": "name", "kindPath": "kind"}},
                {"path": "spec.selector", "labels": {}},
                {"path": "spec.image", "expression": "'registry.example.com/' + value"},
                {"path": "spec.owner", "expression": "value + '@' + context.vcluster.name + '/' + context.virtualObject.metadata.namespace"},
                {"path": "status.image", "reverseExpression": "value.replace('registry.example.com/', '')"},
                // the attack fixtures' runaway expressions, on fields only two widgets have (a
                // path that is not found is skipped)
                {"path": "spec.loop", "expression": "while(true){}"},
                {"path": "spec.alloc", "expression": "let a=[]; while(true) a.push(new Array(1e6))"},
                // an allocation that reaches the memory bound within milliseconds (1e5 filled
                // elements, 1.6 MB, a step; QuickJS is built optimised in every profile), so
                // that only the memory bound can stop it
                {"path": "spec.grow", "expression": "let a = []; while (true) a.push(new Array(1e5).fill(a.length))"}
            ]
        }]
    })
}

fn widget(name: &str, namespace: &str, spec: Value) -> Value {
    json!({"apiVersion": "e2e.vcp.test/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace, "labels": {"e2e": TEST}},
        "spec": spec})
}

async fn put(api: &Api<DynamicObject>, obj: Value) {
    let obj: DynamicObject = serde_json::from_value(obj).expect("widget");
    let name = obj.metadata.name.clone().expect("name");
    // the discovery of a new CRD may lag: retry until served
    wait_for(TIMEOUT, || {
        let api = api.clone();
        let obj = obj.clone();
        let name = name.clone();
        async move {
            api.patch(
                &name,
                &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await
            .ok()
        }
    })
    .await;
}

async fn host_widget(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    wait_for(TIMEOUT, || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok().flatten() }
    })
    .await
}

/// The runtime's write attempts (any verb, any result) of the host widget `name`, from the
/// audit log.
fn writes_of(host_ns: &str, name: &str) -> usize {
    Audit::writes()
        .by(Identity::Syncer)
        .in_namespace(host_ns)
        .resource("widgets")
        .attempts()
        .into_iter()
        .filter(|w| w.object_name == name)
        .count()
}

#[tokio::test]
async fn patches_translate_references_selectors_and_expressions_and_bound_failures() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    for client in [&host, &virtual_] {
        apply(
            client,
            &crds(),
            None,
            free_crd("e2e.vcp.test", "Widget", "widgets", "Namespaced"),
        )
        .await;
    }
    // cert-manager's issuers in the virtual cluster, as far as discovery sees them: Issuer
    // namespaced, ClusterIssuer cluster-scoped
    apply(
        &virtual_,
        &crds(),
        None,
        free_crd("cert-manager.io", "Issuer", "issuers", "Namespaced"),
    )
    .await;
    apply(
        &virtual_,
        &crds(),
        None,
        free_crd(
            "cert-manager.io",
            "ClusterIssuer",
            "clusterissuers",
            "Cluster",
        ),
    )
    .await;
    // the served groups must be discoverable before the runtime starts its type
    wait_for(TIMEOUT, || {
        let client = virtual_.clone();
        async move {
            let group = kube::discovery::oneshot::group(&client, "cert-manager.io")
                .await
                .ok()?;
            (group.recommended_resources().len() == 2).then_some(())
        }
    })
    .await;

    let w = world_with(TEST, &["patches-a", "patches-b"], spec(), PodSync::Hooks).await;
    let host_widgets =
        Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &widgets());
    let virtual_widgets =
        |ns: &str| Api::<DynamicObject>::namespaced_with(w.virtual_.clone(), ns, &widgets());
    let selector = json!({
        "matchLabels": {"app": "web", "release": "r1", "vcluster.loft.sh/namespace": "x"},
        "matchExpressions": [
            {"key": "vcluster.loft.sh/managed-by", "operator": "In", "values": ["a", "b"]},
            {"key": "tier", "operator": "Exists"}
        ]
    });
    for ns in ["patches-a", "patches-b"] {
        put(
            &virtual_widgets(ns),
            widget(
                "web",
                ns,
                json!({
                    "secretName": "web-tls",
                    "issuerRef": {"name": "ca", "kind": "Issuer"},
                    "selector": selector,
                    "image": "nginx",
                    "owner": "team"
                }),
            ),
        )
        .await;
    }
    put(&virtual_widgets("patches-a"), widget("global", "patches-a", json!({
        "secretName": "global-tls", "issuerRef": {"name": "letsencrypt", "kind": "ClusterIssuer"}
    }))).await;

    // 1. references: per namespace, vCluster's host names; a ClusterIssuer keeps its name
    let mut secret_names = Vec::new();
    for ns in ["patches-a", "patches-b"] {
        let host_name = vcluster_host_name("web", ns);
        let copy = host_widget(&host_widgets, &host_name).await;
        let spec = &copy.data["spec"];
        assert_eq!(
            spec["secretName"],
            vcluster_host_name("web-tls", ns),
            "{spec}"
        );
        assert_eq!(
            spec["issuerRef"],
            json!({"name": vcluster_host_name("ca", ns), "kind": "Issuer"})
        );
        // 3. expressions, with vCluster's variables
        assert_eq!(spec["image"], "registry.example.com/nginx");
        assert_eq!(spec["owner"], format!("team@{VCLUSTER}/{ns}"));
        // 2. labels: vCluster's HostLabelSelector of the virtual selector
        let expected = ask_vcluster(&[json!({
            "op": "hostLabelSelector", "vcluster": VCLUSTER, "hostNamespace": w.host_ns,
            "selector": selector
        })]);
        assert_eq!(spec["selector"], expected[0]["selector"]);
        assert_ne!(spec["selector"], selector, "the selector was translated");
        secret_names.push(spec["secretName"].clone());
    }
    assert_ne!(
        secret_names[0], secret_names[1],
        "two namespaces, two host Secrets"
    );
    let global = host_widget(&host_widgets, &vcluster_host_name("global", "patches-a")).await;
    assert_eq!(
        global.data["spec"]["issuerRef"],
        json!({"name": "letsencrypt", "kind": "ClusterIssuer"})
    );
    assert_eq!(
        global.data["spec"]["secretName"],
        vcluster_host_name("global-tls", "patches-a")
    );

    // reverseExpression: a host controller's status comes up through the way back
    let web_a = vcluster_host_name("web", "patches-a");
    host_widgets
        .patch_status(&web_a, &PatchParams::default(), &Patch::Merge(json!({
            "status": {"image": "registry.example.com/nginx:1.27", "secret": vcluster_host_name("web-tls", "patches-a")}
        })))
        .await
        .expect("host status");
    let up = wait_for(TIMEOUT, || {
        let api = virtual_widgets("patches-a");
        async move {
            let obj = api.get("web").await.ok()?;
            (obj.data["status"]["image"] == "nginx:1.27").then_some(obj)
        }
    })
    .await;
    // a status field without a patch comes up unchanged
    assert_eq!(
        up.data["status"]["secret"],
        vcluster_host_name("web-tls", "patches-a")
    );

    // converged: the patched copy compares equal to what the next sync computes, so nothing is
    // written again. The trigger is a label only the host has: once the runtime reconciled the
    // widget after it, the audit log shows no new write of the host copy, and the virtual
    // status (reversed) was not written again either.
    let virtual_writes = || {
        Audit::writes()
            .on(Cluster::Virtual)
            .by(Identity::Syncer)
            .in_namespace("patches-a")
            .resource("widgets")
            .attempts()
            .into_iter()
            .filter(|w| w.object_name == "web")
            .count()
    };
    // the status write above is in the audit log before counting
    let status_audited = poll_for(TIMEOUT, || async { (virtual_writes() > 0).then_some(()) }).await;
    assert!(
        status_audited.is_some(),
        "the status write is not in the virtual audit log"
    );
    let host_writes_before = writes_of(&w.host_ns, &web_a);
    let virtual_writes_before = virtual_writes();
    let before = w.reconciles.reconciles("Widget", "patches-a/web");
    host_widgets
        .patch(
            &web_a,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e-host-only": "poke"}}})),
        )
        .await
        .expect("poke the host copy");
    w.wait_reconciled("Widget", "patches-a/web", before).await;
    // a barrier: a write sent after that reconcile finished (so after any write it made was
    // answered) and seen in the audit log; the audit log then holds every write of the
    // reconcile too
    let services =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Service"), "services");
    Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &services)
        .patch(
            VCLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e-barrier": "1"}}})),
        )
        .await
        .expect("barrier write");
    let barrier = poll_for(TIMEOUT, || async {
        Audit::writes()
            .by(Identity::Admin)
            .in_namespace(&w.host_ns)
            .resource("services")
            .attempts()
            .into_iter()
            .any(|a| a.object_name == VCLUSTER && a.verb == "patch")
            .then_some(())
    })
    .await;
    assert!(
        barrier.is_some(),
        "the barrier write is not in the audit log"
    );
    // the same on the virtual API server
    virtual_widgets("patches-a")
        .patch(
            "global",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"e2e-barrier": "1"}}})),
        )
        .await
        .expect("virtual barrier write");
    let virtual_barrier = poll_for(TIMEOUT, || async {
        Audit::writes()
            .on(Cluster::Virtual)
            .by(Identity::Admin)
            .in_namespace("patches-a")
            .resource("widgets")
            .attempts()
            .into_iter()
            .any(|a| a.object_name == "global" && a.verb == "patch")
            .then_some(())
    })
    .await;
    assert!(
        virtual_barrier.is_some(),
        "the virtual barrier write is not in the audit log"
    );
    assert_eq!(
        writes_of(&w.host_ns, &web_a),
        host_writes_before,
        "host copy rewritten"
    );
    assert_eq!(
        virtual_writes(),
        virtual_writes_before,
        "virtual status rewritten"
    );

    // 4. runaway expressions fail their objects only
    let started = std::time::SystemTime::now();
    // `grow` first, alone: the objects' evaluations run in parallel on the blocking pool, and
    // beside two runaway scripts on a busy 2-core machine its ten steps took longer than the
    // 100 ms time bound (a wall-clock bound), which then stopped it before the memory bound
    let runaway = |name: &'static str| widget(name, "patches-a", json!({"image": "x", name: 1}));
    put(&virtual_widgets("patches-a"), runaway("grow")).await;
    poll_event_where(&w.host, &w.host_ns, TIMEOUT, |e| {
        e.reason.as_deref() == Some("PatchFailed")
            && e.related.as_ref().and_then(|r| r.name.as_deref()) == Some("grow")
    })
    .await
    .expect("a PatchFailed Event about grow");
    for name in ["loop", "alloc"] {
        put(&virtual_widgets("patches-a"), runaway(name)).await;
    }
    // the runtime looked, more than once (retried with backoff)
    for name in ["loop", "alloc", "grow"] {
        w.wait_reconciled("Widget", &format!("patches-a/{name}"), 1)
            .await;
    }
    // and kept syncing the others: a widget made after them is synced
    put(
        &virtual_widgets("patches-b"),
        widget("after", "patches-b", json!({"image": "busybox"})),
    )
    .await;
    let after_name = vcluster_host_name("after", "patches-b");
    let after = host_widget(&host_widgets, &after_name).await;
    assert_eq!(after.data["spec"]["image"], "registry.example.com/busybox");
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    let condition = wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            let c = status
                .conditions
                .iter()
                .find(|c| c.type_ == "RuntimeHealthy")?
                .clone();
            (c.reason == Reason::PatchFailed.as_str() && c.message.starts_with("3 object(s)"))
                .then_some(c)
        }
    })
    .await;
    assert_eq!(condition.status, "False");
    assert!(
        condition.message.contains("\"spec.loop\"") || condition.message.contains("\"spec.alloc\""),
        "{}",
        condition.message
    );
    // an Event per object naming the type, the object and the path, with the bound that hit
    // the loop can only end at the time bound, and `grow` only at the memory bound (16 MiB
    // after ten steps of a few hundred microseconds); the attack fixture's `alloc` makes sparse
    // arrays of a few dozen bytes each, so which bound stops it depends on the machine's speed:
    // for it, the claim is only that a bound does
    for (name, bounds) in [
        ("loop", &["time bound"][..]),
        ("grow", &["memory bound"][..]),
        ("alloc", &["memory bound", "time bound"][..]),
    ] {
        let event = poll_event_where(&w.host, &w.host_ns, TIMEOUT, |e| {
            e.reason.as_deref() == Some("PatchFailed")
                && e.related.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .await
        .unwrap_or_else(|| panic!("a PatchFailed Event about {name}"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(
            event.regarding.as_ref().and_then(|r| r.name.as_deref()),
            Some("car-plugin")
        );
        let note = event.note.unwrap_or_default();
        assert!(
            note.contains(&format!("e2e.vcp.test/v1 Widget patches-a/{name}")),
            "{note}"
        );
        assert!(note.contains(&format!("\"spec.{name}\"")), "{note}");
        let bound = bounds.iter().find(|b| note.contains(*b));
        assert!(bound.is_some(), "{note}");
        eprintln!(
            "runtime_sync_patches: {name} stopped by its {}",
            bound.unwrap()
        );
    }
    // the audit log has the runtime's create of the widget made after them, and no write at all
    // of theirs
    let audited = poll_for(TIMEOUT, || async {
        (writes_of(&w.host_ns, &after_name) > 0).then_some(())
    })
    .await;
    assert!(
        audited.is_some(),
        "the runtime's create of {after_name} is not in the audit log"
    );
    for name in ["loop", "alloc", "grow"] {
        let host_name = vcluster_host_name(name, "patches-a");
        assert_eq!(
            writes_of(&w.host_ns, &host_name),
            0,
            "writes of {host_name}"
        );
        assert!(host_widgets.get_opt(&host_name).await.unwrap().is_none());
    }
    let runtime_alive = !w.runtime.is_finished();
    assert!(runtime_alive, "the runtime keeps running");
    eprintln!(
        "runtime_sync_patches: runaway expressions bounded, 0 host writes, {:.1}s after they were made",
        started.elapsed().unwrap_or_default().as_secs_f64()
    );

    // fixed, they sync, and the condition recovers
    // (server-side apply without the field removes it)
    for name in ["loop", "alloc", "grow"] {
        put(
            &virtual_widgets("patches-a"),
            widget(name, "patches-a", json!({"image": "x"})),
        )
        .await;
    }
    for name in ["loop", "alloc", "grow"] {
        host_widget(&host_widgets, &vcluster_host_name(name, "patches-a")).await;
    }
    let recovered = wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            let c = status
                .conditions
                .iter()
                .find(|c| c.type_ == "RuntimeHealthy")?
                .clone();
            (c.status == "True").then_some(c)
        }
    })
    .await;
    assert_eq!(recovered.reason, Reason::Syncing.as_str());
}

/// The CRD refuses what no runtime could apply: a patch with two kinds, a path that writes the
/// object's identity (in any spelling), two patches of one path.
#[tokio::test]
async fn the_crd_refuses_bad_patches() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::install_crds(&host).await;
    vcp_tests::create_namespace(&host, "patches-crd").await;
    let plugins: Api<VClusterPlugin> = Api::namespaced(host.clone(), "patches-crd");
    let plugin = |patches: Value| {
        serde_json::from_value::<VClusterPlugin>(json!({
            "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
            "metadata": {"name": "p", "namespace": "patches-crd"},
            "spec": {"vcluster": {"name": "vc"}, "syncedTypes": [{
                "apiVersion": "e2e.vcp.test/v1", "kind": "Widget", "patches": patches}]}
        }))
        .expect("plugin")
    };
    let dry_run = PatchParams::apply(TEST_FIELD_MANAGER).force().dry_run();
    for (patches, says) in [
        (
            json!([{"path": "spec.a", "expression": "value", "labels": {}}]),
            "exactly one of",
        ),
        (
            json!([{"path": "metadata.name", "expression": "value"}]),
            "identity",
        ),
        (
            json!([{"path": "metadata[\"Namespace\"]", "expression": "value"}]),
            "identity",
        ),
        (
            json!([{"path": "metadata.labels['vcluster.loft.sh/managed-by']", "expression": "value"}]),
            "identity",
        ),
        (
            json!([{"path": "metadata.annotations[*]", "expression": "value"}]),
            "identity",
        ),
        (json!([{"path": "kind", "expression": "value"}]), "identity"),
        (
            json!([{"path": "spec.a", "expression": "1"}, {"path": "spec.a", "expression": "2"}]),
            "duplicate entries",
        ),
    ] {
        let error = plugins
            .patch("p", &dry_run, &Patch::Apply(plugin(patches.clone())))
            .await
            .expect_err(&patches.to_string());
        assert!(error.to_string().contains(says), "{patches}: {error}");
    }
    // what vCluster accepts is accepted: a reverseExpression alone, labels and label keys
    for patches in [
        json!([{"path": "status.url", "reverseExpression": "value"}]),
        json!([{"path": "metadata.labels.team", "expression": "value"}, {"path": "spec.selector", "labels": {}}]),
        json!([{"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}}]),
    ] {
        plugins
            .patch("p", &dry_run, &Patch::Apply(plugin(patches.clone())))
            .await
            .unwrap_or_else(|e| panic!("{patches}: {e}"));
    }
}
