//! The declarative runtime (`vcp_syncer_runtime::run`) end to end, on the real host and virtual
//! API servers (RBAC on).
//!
//! The runtime runs in-process under the `vcp-syncer` identity, which each test grants only a
//! Role in its own host namespace (plus read access to Cars in the virtual cluster): the host
//! is watched in that namespace only. The virtual cluster is shared by all tests, so each
//! test's VClusterPlugin selects its own Cars with a label selector (`e2e=<test>`), and each
//! test uses its own host namespace and vCluster name.

//!
//! This binary: Host objects into the virtual cluster (`FromHost`), selector changes, and a malformed object among good ones. The harness ([`vcp_tests::World`]) is in
//! tests/src/runtime.rs; the other `runtime_sync_*` binaries cover the rest.

use vcp_crds::Reason;

use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_syncer_runtime::PodSync;
use vcp_tests::runtime::{
    TIMEOUT, apply_dynamic as apply, cars_resource, default_spec, world_with,
};
use vcp_tests::{Cluster, ControlPlane, Identity, TEST_FIELD_MANAGER, string_map, wait_for};

#[tokio::test]
async fn from_host_copies_host_objects_into_the_virtual_cluster() {
    let test = "fromhost";
    let spec = json!({
        "vcluster": {"name": "vc-fromhost"},
        "syncedTypes": [{
            "apiVersion": "example.loft.sh/v1", "kind": "Car", "direction": "FromHost",
            "syncStatus": true, "selector": {"matchLabels": {"e2e": test}}
        }],
        "hooks": [{
            "name": "import-hook", "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "events": ["CreateVirtual", "UpdateVirtual"],
            "labels": {"imported": "yes"},
            "jsonPatch": [{"op": "add", "path": "/metadata/annotations/imported-by", "value": "runtime"}]
        }]
    });
    let w = world_with(test, &[], spec, PodSync::Hooks).await;
    // identity mapping: host namespace vc-fromhost → virtual namespace vc-fromhost
    let virtual_cars = w.virtual_cars(&w.host_ns);
    let host_car = |name: &str, labels: Value, spec: Value| {
        json!({"apiVersion": "example.loft.sh/v1", "kind": "Car",
               "metadata": {"name": name, "namespace": w.host_ns, "labels": labels}, "spec": spec})
    };
    apply(
        &w.host,
        &cars_resource(),
        Some(&w.host_ns),
        host_car(
            "shared",
            json!({"e2e": test, "tier": "gold"}),
            json!({"type": "Audi"}),
        ),
    )
    .await;
    // a host copy some vCluster made from a virtual object is never imported back
    apply(
        &w.host,
        &cars_resource(),
        Some(&w.host_ns),
        host_car(
            "copy-x-a-x-vc",
            json!({"e2e": test, "vcluster.loft.sh/managed-by": "vc"}),
            json!({"type": "BMW"}),
        ),
    )
    .await;
    let wait_virtual = |check: Box<dyn Fn(&DynamicObject) -> bool>| {
        let api = virtual_cars.clone();
        async move {
            wait_for(TIMEOUT, || {
                let api = api.clone();
                let check = &check;
                async move {
                    api.get_opt("shared")
                        .await
                        .ok()
                        .flatten()
                        .filter(|c| check(c))
                }
            })
            .await
        }
    };
    let imported = wait_virtual(Box::new(|_| true)).await;
    assert_eq!(
        imported.labels(),
        &string_map([("e2e", test), ("tier", "gold"), ("imported", "yes")])
    );
    assert_eq!(
        imported.annotations(),
        &string_map([
            ("vcluster.loft.sh/object-host-name", "shared"),
            ("vcluster.loft.sh/object-host-namespace", w.host_ns.as_str()),
            ("imported-by", "runtime"),
        ])
    );
    assert_eq!(imported.data["spec"], json!({"type": "Audi"}));

    // (the runtime created the virtual namespace) a virtual object of a name the host also has, not made by the runtime: untouched
    let mine = apply(
        &w.virtual_,
        &cars_resource(),
        Some(&w.host_ns),
        json!({
            "apiVersion": "example.loft.sh/v1", "kind": "Car",
            "metadata": {"name": "taken", "namespace": w.host_ns}, "spec": {"type": "Mine"}
        }),
    )
    .await;
    apply(
        &w.host,
        &cars_resource(),
        Some(&w.host_ns),
        host_car("taken", json!({"e2e": test}), json!({"type": "Theirs"})),
    )
    .await;

    // host changes follow (UpdateVirtual hooks applied), status included (syncStatus)
    let host_cars = w.host_cars();
    host_cars
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"seats": 5}})),
        )
        .await
        .expect("host spec");
    host_cars
        .patch_status(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Imported"}})),
        )
        .await
        .expect("host status");
    let updated = wait_virtual(Box::new(|c| {
        c.data["spec"]["seats"] == json!(5) && c.data["status"]["phase"] == json!("Imported")
    }))
    .await;
    assert_eq!(
        updated.labels().get("imported").map(String::as_str),
        Some("yes")
    );

    // drift in the virtual cluster is reverted
    virtual_cars
        .patch(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "Drift"}})),
        )
        .await
        .expect("virtual drift");
    wait_virtual(Box::new(|c| c.data["spec"]["type"] == json!("Audi"))).await;

    // the unmanaged virtual object is reported and untouched; the managed-by copy not imported
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            let cars = status.synced_objects.iter().find(|s| s.kind == "Car")?;
            (cars.count == 1 && cars.conflicts == Some(1)).then_some(())
        }
    })
    .await;
    let still_mine = virtual_cars.get("taken").await.expect("mine");
    assert_eq!(still_mine.resource_version(), mine.resource_version());
    assert!(
        virtual_cars
            .get_opt("copy-x-a-x-vc")
            .await
            .unwrap()
            .is_none()
    );

    // a deleted host object deletes its virtual copy
    host_cars
        .delete("shared", &DeleteParams::default())
        .await
        .expect("delete host");
    wait_for(TIMEOUT, || {
        let api = virtual_cars.clone();
        async move { api.get_opt("shared").await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// `mappings.byName` (vCluster's `config.FromHostMappings`, matched as its
/// `matchesHostObject` does): `"<host ns>/*": "fhmap-all/*"` copies every selected host Car into
/// `fhmap-all` under its name, and the single name `"<host ns>/special": "fhmap-one/renamed"`
/// wins over it for `special`; virtual namespaces that do not exist are created. When the
/// mapping changes, the copy moves: the one at the old place is deleted. A mapping whose key
/// names another host namespace is refused by the runtime before anything is watched
/// (`RuntimeHealthy=False` naming the key), and the audit log shows it never listed or
/// watched Cars there.
#[tokio::test]
async fn from_host_mappings_place_copies_where_the_mapping_says() {
    let test = "fhmap";
    let host_ns = format!("vc-{test}");
    let types = |by_name: Value| {
        json!([{
            "apiVersion": "example.loft.sh/v1", "kind": "Car", "direction": "FromHost",
            "selector": {"matchLabels": {"e2e": test}},
            "mappings": {"byName": by_name}
        }])
    };
    let spec = json!({
        "vcluster": {"name": "vc-fhmap"},
        "syncedTypes": types(json!({
            format!("{host_ns}/*"): "fhmap-all/*",
            format!("{host_ns}/special"): "fhmap-one/renamed"
        }))
    });
    let w = world_with(test, &[], spec, PodSync::Hooks).await;
    for name in ["plain", "special"] {
        apply(
            &w.host,
            &cars_resource(),
            Some(&w.host_ns),
            json!({"apiVersion": "example.loft.sh/v1", "kind": "Car",
                   "metadata": {"name": name, "namespace": w.host_ns, "labels": {"e2e": test}},
                   "spec": {"type": name}}),
        )
        .await;
    }
    let exists = |ns: &'static str, name: &'static str| {
        let api = w.virtual_cars(ns);
        async move {
            wait_for(TIMEOUT, || {
                let api = api.clone();
                async move { api.get_opt(name).await.ok().flatten() }
            })
            .await
        }
    };
    let gone = |ns: &'static str, name: &'static str| {
        let api = w.virtual_cars(ns);
        async move {
            wait_for(TIMEOUT, || {
                let api = api.clone();
                async move { api.get_opt(name).await.ok()?.is_none().then_some(()) }
            })
            .await
        }
    };
    let plain = exists("fhmap-all", "plain").await;
    assert_eq!(plain.data["spec"], json!({"type": "plain"}));
    let renamed = exists("fhmap-one", "renamed").await;
    assert_eq!(renamed.data["spec"], json!({"type": "special"}));
    assert_eq!(
        renamed.annotations(),
        &string_map([
            ("vcluster.loft.sh/object-host-name", "special"),
            ("vcluster.loft.sh/object-host-namespace", host_ns.as_str()),
        ])
    );
    assert!(
        w.virtual_cars("fhmap-all")
            .get_opt("special")
            .await
            .unwrap()
            .is_none(),
        "the single name wins over namespace/*"
    );

    // the mapping changes: the copy moves, the old one is deleted
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    plugins
        .patch(
            "car-plugin",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"syncedTypes": types(json!({format!("{host_ns}/*"): "fhmap-all/*"}))}})),
        )
        .await
        .expect("change the mapping");
    exists("fhmap-all", "special").await;
    gone("fhmap-one", "renamed").await;

    // a key naming another host namespace: refused, nothing watched there
    plugins
        .patch(
            "car-plugin",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"syncedTypes": types(json!({"kube-system/*": "fhmap-all/*"}))}}),
            ),
        )
        .await
        .expect("a foreign mapping (no admission policy in this binary)");
    let condition = wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "RuntimeHealthy" && c.reason == "TypeUnavailable")
        }
    })
    .await;
    assert_eq!(condition.status, "False");
    assert!(
        condition.message.contains(
            "\"kube-system/*\" names a host namespace other than the vCluster's (vc-fhmap)"
        ),
        "{}",
        condition.message
    );
    let reads = vcp_tests::audited_reads(
        ControlPlane::shared(),
        Cluster::Host,
        Identity::Syncer.user(),
    )
    .expect("audit log");
    let foreign: Vec<_> = reads
        .iter()
        .filter(|(_, uri)| {
            uri.contains("/namespaces/kube-system/")
                || uri.starts_with("/apis/example.loft.sh/v1/cars")
        })
        .collect();
    assert!(foreign.is_empty(), "{foreign:?}");
    // the copies of the refused spec's predecessor are left as they are (no type runs)
    assert!(
        w.virtual_cars("fhmap-all")
            .get_opt("plain")
            .await
            .unwrap()
            .is_some()
    );
}

/// `syncedTypes[].selector` changes, as vCluster v0.30.0 treats an object that leaves a sync
/// selector (`pkg/controllers/resources/ingressclasses/syncer.go`: the copy of a source that no
/// longer matches is deleted, with a log line saying why): a virtual Car relabelled out of the
/// selector, or left out by a narrowed selector (`matchLabels` and `matchExpressions` with
/// `In`, `NotIn`, `Exists`, `DoesNotExist`), loses its host copy and the runtime says so (a
/// `Normal` Event `SelectorNoLongerMatches` naming the object, a log line, a counter); the
/// virtual Car is never touched, the Cars that still match are not rewritten, and a Car
/// labelled back in is synced again.
#[tokio::test]
async fn selector_changes_delete_the_host_copies_that_left_it_and_say_so() {
    let test = "selsync";
    let ns = "selsync-a";
    let selector =
        |expressions: Value| json!({"matchLabels": {"e2e": test}, "matchExpressions": expressions});
    let mut spec = default_spec(test);
    spec["syncedTypes"][0]["selector"] =
        selector(json!([{"key": "tier", "operator": "In", "values": ["gold", "silver"]}]));
    let w = world_with(test, &[ns], spec, PodSync::Hooks).await;
    let started = std::time::Instant::now();
    let host = |name: &str| format!("{name}-x-{ns}-x-vc-{test}");
    let car = |name: &'static str, labels: Value| {
        let w = &w;
        async move {
            w.put_car(ns, name, labels, json!({}), json!({"type": "Audi"}))
                .await
        }
    };
    car("gold", json!({"tier": "gold"})).await;
    car("silver", json!({"tier": "silver"})).await;
    car("team", json!({"tier": "gold", "team": "x"})).await;
    car("bronze", json!({"tier": "bronze"})).await;
    for name in ["gold", "silver", "team"] {
        w.host_car_where(&host(name), |_| true).await;
    }
    let host_cars = w.host_cars();
    let gone = |name: String| {
        let api = host_cars.clone();
        async move {
            wait_for(TIMEOUT, || {
                let api = api.clone();
                let name = name.clone();
                async move { api.get_opt(&name).await.ok()?.is_none().then_some(()) }
            })
            .await;
        }
    };
    let events = || async {
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.host.clone(), &w.host_ns)
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(Reason::SelectorNoLongerMatches.as_str()))
            .map(|e| {
                // kube's Recorder folds repeats of one reason on one object into a series
                let count = e.series.as_ref().map_or(1, |s| s.count);
                (
                    e.type_.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                    count,
                )
            })
            .collect::<Vec<_>>()
    };
    let total = |found: &[(String, String, i32)]| found.iter().map(|e| e.2).sum::<i32>();
    let wait_events = |n: i32| async move {
        vcp_tests::poll_for(TIMEOUT, || async move {
            let found = events().await;
            (total(&found) >= n).then_some(found)
        })
        .await
        .unwrap_or_else(|| panic!("fewer than {n} SelectorNoLongerMatches Events"))
    };
    // bronze never matched: never copied
    assert!(host_cars.get_opt(&host("bronze")).await.unwrap().is_none());

    // 1. relabelled out (In no longer holds): the host copy goes, an Event names the Car
    let silver_before = w
        .virtual_cars(ns)
        .get("silver")
        .await
        .expect("virtual silver");
    car("silver", json!({"tier": "bronze"})).await;
    gone(host("silver")).await;
    let found = wait_events(1).await;
    assert_eq!(total(&found), 1, "{found:?}");
    assert_eq!(found[0].0, "Normal");
    assert!(
        found[0].1.contains(&format!("{ns}/silver ")) && found[0].1.contains(&host("silver")),
        "{found:?}"
    );
    let silver_after = w
        .virtual_cars(ns)
        .get("silver")
        .await
        .expect("virtual silver");
    assert_eq!(
        silver_after.uid(),
        silver_before.uid(),
        "the virtual Car stays"
    );

    // 2. labelled back in: synced again, a new host copy
    car("silver", json!({"tier": "silver"})).await;
    w.host_car_where(&host("silver"), |c| {
        c.labels().get("tier").map(String::as_str) == Some("silver")
    })
    .await;

    // 3. the selector narrowed (In gold, and DoesNotExist team): silver and team go, gold stays
    //    and is not rewritten
    let gold_writes = w.runtime_writes(&format!("/cars/{}", host("gold")));
    let gold_reconciles = w.reconciles.reconciles("Car", &format!("{ns}/gold"));
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    let narrow = |expressions: Value| {
        let plugins = plugins.clone();
        let mut types = default_spec(test)["syncedTypes"].clone();
        types[0]["selector"] = selector(expressions);
        async move {
            plugins
                .patch(
                    "car-plugin",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"syncedTypes": types}})),
                )
                .await
                .expect("change the selector");
        }
    };
    narrow(json!([
        {"key": "tier", "operator": "In", "values": ["gold"]},
        {"key": "team", "operator": "DoesNotExist"}
    ]))
    .await;
    gone(host("silver")).await;
    gone(host("team")).await;
    w.wait_reconciled("Car", &format!("{ns}/gold"), gold_reconciles)
        .await;
    assert!(host_cars.get_opt(&host("gold")).await.unwrap().is_some());
    assert_eq!(
        w.runtime_writes(&format!("/cars/{}", host("gold"))),
        gold_writes,
        "a Car that still matches is not rewritten"
    );
    let found = wait_events(3).await;

    // 4. NotIn and Exists: only the Car with a team that is not bronze matches
    narrow(json!([
        {"key": "tier", "operator": "NotIn", "values": ["bronze"]},
        {"key": "team", "operator": "Exists"}
    ]))
    .await;
    gone(host("gold")).await;
    w.host_car_where(&host("team"), |_| true).await;
    let found_all = wait_events(4).await;
    for name in ["silver", "bronze"] {
        assert!(
            host_cars.get_opt(&host(name)).await.unwrap().is_none(),
            "{name}"
        );
    }
    // every virtual Car is still there
    let virtual_names: Vec<String> = w
        .virtual_cars(ns)
        .list(&Default::default())
        .await
        .expect("virtual cars")
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(virtual_names, ["bronze", "gold", "silver", "team"]);
    let deletes = w
        .runtime_writes("/cars/")
        .into_iter()
        .filter(|(verb, _)| verb == "delete")
        .count();
    println!(
        "selector changes: relabelled out 1, narrowed (In + DoesNotExist) 2, narrowed (NotIn + \
         Exists) 1; host copies deleted by the runtime: {deletes}; SelectorNoLongerMatches \
         Events (with their series count): {} after step 3, {} in all; virtual Cars kept: {}; \
         {:.1} s",
        total(&found),
        total(&found_all),
        virtual_names.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(total(&found), 3, "{found:?}");
    assert_eq!(total(&found_all), 4, "{found_all:?}");
    assert_eq!(deletes, 4);
}

/// A CRD `widgets.e2e.vcp.test` whose `spec` has the given schema.
fn widget_crd(spec_schema: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.e2e.vcp.test"},
        "spec": {"group": "e2e.vcp.test", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec_schema}}}}]}
    })
}

#[tokio::test]
async fn malformed_object_is_reported_and_the_rest_keep_syncing() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    // the host CRD wants an integer size; the virtual one accepts anything
    let crds = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    apply(
        &host,
        &crds,
        None,
        widget_crd(json!({"type": "object",
        "properties": {"size": {"type": "integer"}}})),
    )
    .await;
    apply(
        &virtual_,
        &crds,
        None,
        widget_crd(json!({"type": "object",
        "x-kubernetes-preserve-unknown-fields": true})),
    )
    .await;
    let widgets = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("e2e.vcp.test", "v1", "Widget"),
        "widgets",
    );
    let spec = json!({
        "vcluster": {"name": "vc-malformed"},
        "syncedTypes": [{"apiVersion": "e2e.vcp.test/v1", "kind": "Widget"}]
    });
    let w = world_with("malformed", &["malformed-a"], spec, PodSync::Hooks).await;
    let widget = |name: &str, size: Value| {
        json!({"apiVersion": "e2e.vcp.test/v1", "kind": "Widget",
               "metadata": {"name": name, "namespace": "malformed-a"}, "spec": {"size": size}})
    };
    // the discovery of the new CRD may lag: retry the virtual applies until served
    for (name, size) in [("bad", json!("big")), ("good", json!(3))] {
        let obj: DynamicObject = serde_json::from_value(widget(name, size)).unwrap();
        let api =
            Api::<DynamicObject>::namespaced_with(w.virtual_.clone(), "malformed-a", &widgets);
        wait_for(TIMEOUT, || {
            let api = api.clone();
            let obj = obj.clone();
            async move {
                api.patch(
                    &obj.name_any(),
                    &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                    &Patch::Apply(&obj),
                )
                .await
                .ok()
            }
        })
        .await;
    }
    let host_widgets = Api::<DynamicObject>::namespaced_with(w.host.clone(), &w.host_ns, &widgets);
    let good = wait_for(TIMEOUT, || {
        let api = host_widgets.clone();
        async move {
            api.get_opt("good-x-malformed-a-x-vc-malformed")
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(good.data["spec"], json!({"size": 3}));
    // the bad one is refused by the host API server, reported, and retried (not dropped)
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    let condition = wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            let widgets = status.synced_objects.iter().find(|s| s.kind == "Widget")?;
            let condition = status
                .conditions
                .iter()
                .find(|c| c.type_ == "RuntimeHealthy")?
                .clone();
            (widgets.count == 1 && condition.reason == "SyncErrors").then_some(condition)
        }
    })
    .await;
    assert_eq!(condition.status, "False");
    assert!(
        condition.message.contains("1 object(s) failed"),
        "{}",
        condition.message
    );
    assert!(
        host_widgets
            .get_opt("bad-x-malformed-a-x-vc-malformed")
            .await
            .unwrap()
            .is_none()
    );
}
