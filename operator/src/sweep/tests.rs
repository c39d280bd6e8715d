use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::runtime::watcher;
use serde_json::json;
use vcp_crds::{VClusterPluginSpec, VClusterRef};

use super::*;

fn plugin(namespace: &str, name: &str, vcluster: &str) -> VClusterPlugin {
    let mut p = VClusterPlugin::new(
        name,
        VClusterPluginSpec {
            vcluster: VClusterRef {
                name: vcluster.into(),
            },
            ..Default::default()
        },
    );
    p.metadata.namespace = Some(namespace.into());
    p
}

fn entry(manager: &str, operation: &str, fields: Value) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some(operation.into()),
        api_version: Some("v1".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(fields)),
        ..Default::default()
    }
}

/// An object labelled for the plugin `namespace/name`, the labels owned by `manager`.
fn labelled(namespace: &str, name: &str, manager: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(format!("vcp:{namespace}:{name}")),
        labels: Some(BTreeMap::from([
            (PLUGIN_NAME_LABEL.to_string(), name.to_string()),
            (PLUGIN_NAMESPACE_LABEL.to_string(), namespace.to_string()),
        ])),
        managed_fields: Some(vec![entry(
            manager,
            "Apply",
            json!({ "f:metadata": { "f:labels": {
                format!("f:{PLUGIN_NAME_LABEL}"): {},
                format!("f:{PLUGIN_NAMESPACE_LABEL}"): {},
            } } }),
        )]),
        ..Default::default()
    }
}

#[test]
fn labelled_objects_of_plugins_that_are_gone_are_orphans() {
    let existing = Existing::new([&plugin("team-a", "kept", "vc")]);
    let gone = labelled("team-a", "gone", OPERATOR_FIELD_MANAGER);
    let kept = labelled("team-a", "kept", OPERATOR_FIELD_MANAGER);
    let elsewhere = labelled("team-b", "kept", OPERATOR_FIELD_MANAGER);
    assert!(labelled_orphan(&gone, &existing));
    assert!(!labelled_orphan(&kept, &existing));
    assert!(
        labelled_orphan(&elsewhere, &existing),
        "a plugin of the same name in another namespace does not keep it"
    );
    assert_eq!(
        labelled_for(
            &ClusterRole {
                metadata: gone.clone(),
                ..Default::default()
            }
            .metadata
        ),
        Some(("team-a".into(), "gone".into()))
    );
}

#[test]
fn objects_a_user_labelled_are_never_orphans() {
    let existing = Existing::default();
    // Labelled by someone else.
    assert!(!labelled_orphan(
        &labelled("team-a", "gone", "kubectl"),
        &existing
    ));
    // The operator owns one label only.
    let mut half = labelled("team-a", "gone", OPERATOR_FIELD_MANAGER);
    half.managed_fields = Some(vec![entry(
        OPERATOR_FIELD_MANAGER,
        "Apply",
        json!({ "f:metadata": { "f:labels": { format!("f:{PLUGIN_NAME_LABEL}"): {} } } }),
    )]);
    assert!(!labelled_orphan(&half, &existing));
    // Not labelled at all.
    assert!(!labelled_orphan(&ObjectMeta::default(), &existing));
}

/// A vCluster Role carrying records of `plugins` (rules JSON `[]` is enough here), each owned
/// by the manager given with it, plus Helm's annotation.
fn chart_role(records: &[(String, &str)]) -> Role {
    let mut annotations =
        BTreeMap::from([("meta.helm.sh/release-name".to_string(), "vc".to_string())]);
    let mut fields = serde_json::Map::new();
    let mut entries = Vec::new();
    for (key, manager) in records {
        annotations.insert(key.clone(), "[]".into());
        if *manager == OPERATOR_FIELD_MANAGER {
            fields.insert(format!("f:{key}"), json!({}));
        } else {
            entries.push(entry(
                manager,
                "Update",
                json!({ "f:metadata": { "f:annotations": { format!("f:{key}"): {} } } }),
            ));
        }
    }
    entries.push(entry(
        OPERATOR_FIELD_MANAGER,
        "Update",
        json!({ "f:metadata": { "f:annotations": Value::Object(fields) } }),
    ));
    Role {
        metadata: ObjectMeta {
            name: Some("vc-vc".into()),
            namespace: Some("team-a".into()),
            annotations: Some(annotations),
            managed_fields: Some(entries),
            ..Default::default()
        },
        rules: Some(vec![]),
    }
}

#[test]
fn records_of_plugins_that_are_gone_are_orphans_in_every_key_scheme() {
    let long_kept = "k".repeat(60);
    let long_gone = "g".repeat(60);
    let existing = Existing::new([
        &plugin("team-a", "kept", "vc"),
        &plugin("team-a", &long_kept, "vc"),
        &plugin("team-b", "gone", "vc"),
    ]);
    let key = rbac::added_rules_annotation;
    let legacy = |n: &str| rbac::legacy_added_rules_annotation(n).unwrap();
    let role = chart_role(&[
        (key("kept"), OPERATOR_FIELD_MANAGER),
        (key("gone"), OPERATOR_FIELD_MANAGER),
        (key(&long_kept), OPERATOR_FIELD_MANAGER),
        (legacy(&long_kept), OPERATOR_FIELD_MANAGER),
        (key(&long_gone), OPERATOR_FIELD_MANAGER),
        (legacy(&long_gone), OPERATOR_FIELD_MANAGER),
        (key("users-own"), "kubectl-edit"),
    ]);
    let mut want = vec![key("gone"), key(&long_gone), legacy(&long_gone)];
    want.sort();
    assert_eq!(orphan_records(&role, &existing), want);

    // Taking them out leaves the other records and Helm's annotation.
    let patch = rbac::patch_records(&role, &want, None).unwrap();
    let changed = patch["metadata"]["annotations"].as_object().unwrap();
    assert_eq!(changed.len(), 3);
    assert!(changed.values().all(Value::is_null));
}

/// A workload whose operator `Apply` entry owns `containers` and `init` (by name).
fn workload(containers: &[&str], init: &[&str]) -> Workload {
    let keyed = |names: &[&str]| -> Value {
        Value::Object(
            names
                .iter()
                .map(|n| (format!("k:{}", json!({ "name": n })), json!({ ".": {} })))
                .collect(),
        )
    };
    Workload {
        name: "vc".into(),
        namespace: "team-a".into(),
        managed_fields: vec![
            entry(
                OPERATOR_FIELD_MANAGER,
                "Apply",
                json!({ "f:spec": { "f:template": { "f:spec": {
                    "f:containers": keyed(containers),
                    "f:initContainers": keyed(init),
                } } } }),
            ),
            entry(
                "helm",
                "Update",
                json!({ "f:spec": { "f:template": { "f:spec": {
                    "f:containers": keyed(&["helm-sidecar"]),
                } } } }),
            ),
        ],
        ..Default::default()
    }
}

#[test]
fn workload_entries_of_plugins_that_are_gone_or_moved_are_orphans() {
    let existing = Existing::new([
        &plugin("team-a", "sidecar", "vc"),
        &plugin("team-a", "v2", "vc"),
        &plugin("team-a", "moved", "other-vc"),
        &plugin("team-b", "gone-here", "vc"),
    ]);
    let wl = workload(
        &[SYNCER_CONTAINER, "sidecar", "moved", "gone-here"],
        &["v2", "gone-init"],
    );
    assert_eq!(
        orphan_entries(&wl, &existing),
        ["gone-here", "gone-init", "moved"]
    );
    assert!(
        orphan_entries(
            &workload(&[SYNCER_CONTAINER, "sidecar"], &["v2"]),
            &existing
        )
        .is_empty()
    );
    // Entries another manager owns are not the operator's.
    assert!(orphan_entries(&workload(&[], &[]), &Existing::default()).is_empty());
}

/// The second independent attack: `managedFields` are the client's to write, so a labelled
/// object counts as the operator's only where and as the operator names what it makes for the
/// plugin of its labels (`vcp-plugin-<name>` in the plugin's namespace, `vcp:<ns>:<name>`
/// cluster-wide), the objects `config/admission/operator-bounds.yaml` lets it delete.
#[test]
fn a_labelled_object_counts_only_under_the_name_the_operator_gives_it() {
    let existing = Existing::default();
    let namespaced = |namespace: &str, name: &str| {
        let mut meta = labelled("team-a", "ghost", OPERATOR_FIELD_MANAGER);
        meta.namespace = Some(namespace.into());
        meta.name = Some(name.into());
        meta
    };
    assert!(labelled_orphan(
        &namespaced("team-a", "vcp-plugin-ghost"),
        &existing
    ));
    for (namespace, name) in [
        ("team-a", "aaa-plant"),
        ("team-a", "vcp-plugin-other"),
        ("team-b", "vcp-plugin-ghost"),
    ] {
        assert!(
            !labelled_orphan(&namespaced(namespace, name), &existing),
            "{namespace}/{name}"
        );
    }
    let mut cluster = labelled("team-a", "ghost", OPERATOR_FIELD_MANAGER);
    assert!(labelled_orphan(&cluster, &existing));
    cluster.name = Some("cluster-admin-ish".into());
    assert!(!labelled_orphan(&cluster, &existing));
    cluster.name = Some("vcp:team-b:ghost".into());
    assert!(!labelled_orphan(&cluster, &existing));
}

/// A sweep that left failures is retried after `RETRY` (5 s), doubling, then every
/// `SWEEP_INTERVAL` (10 min): 5, 10, 20, 40, 80, 160, 320, 600, 600 s.
#[test]
fn failed_sweeps_back_off_to_the_sweep_interval() {
    use backon::BackoffBuilder as _;
    let delays: Vec<u64> = retry_builder()
        .build()
        .take(9)
        .map(|d| d.as_secs())
        .collect();
    assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 600, 600]);
}

#[test]
fn many_plugin_scopes_are_swept_as_one_sweep_of_all_with_their_namespaces() {
    let scope = |namespace: &str, name: &str| Scope::Plugin {
        namespace: namespace.into(),
        name: name.into(),
    };
    // A few deletes: swept one by one.
    let few: BTreeSet<Scope> = (0..SWEEP_ALL_ABOVE)
        .map(|n| scope("team-a", &format!("p{n}")))
        .collect();
    let (pass, namespaces) = pass_of(few.clone());
    assert_eq!(pass, few.into_iter().collect::<Vec<_>>());
    assert!(namespaces.is_empty());
    // One more: one sweep of every plugin, which also looks at their namespaces' Roles.
    let many: BTreeSet<Scope> = (0..=SWEEP_ALL_ABOVE)
        .map(|n| {
            scope(
                if n % 2 == 0 { "team-a" } else { "team-b" },
                &format!("p{n}"),
            )
        })
        .collect();
    let (pass, namespaces) = pass_of(many);
    assert_eq!(pass, vec![Scope::All]);
    assert_eq!(
        namespaces,
        BTreeSet::from(["team-a".to_string(), "team-b".to_string()])
    );
    // `All` pending covers every plugin scope, however few.
    let (pass, namespaces) = pass_of(BTreeSet::from([Scope::All, scope("team-c", "p")]));
    assert_eq!(pass, vec![Scope::All]);
    assert_eq!(namespaces, BTreeSet::from(["team-c".to_string()]));
}

/// A request the fake API server of [`fake_api`] received: method, path and query, body.
type Received = Arc<std::sync::Mutex<Vec<(String, String, String)>>>;

/// A fake API server on a free local port, answering each request with
/// `answer(method, path)` (status and JSON body), and a client of it; every request is
/// recorded, in order.
async fn fake_api(
    answer: impl Fn(&str, &str) -> (u16, Value) + Send + Sync + 'static,
) -> (kube::Client, Received) {
    use http_body_util::{BodyExt as _, Full};
    use hyper::body::Bytes;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    let (answer, log) = (Arc::new(answer), received.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (answer, log) = (answer.clone(), log.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (answer, log) = (answer.clone(), log.clone());
                        async move {
                            let method = req.method().to_string();
                            let uri = req.uri().to_string();
                            let path = req.uri().path().to_string();
                            let body = req.into_body().collect().await?.to_bytes();
                            log.lock().unwrap().push((
                                method.clone(),
                                uri,
                                String::from_utf8_lossy(&body).into_owned(),
                            ));
                            let (status, json) = answer(&method, &path);
                            let mut res =
                                hyper::Response::new(Full::new(Bytes::from(json.to_string())));
                            *res.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
                            res.headers_mut().insert(
                                hyper::header::CONTENT_TYPE,
                                hyper::header::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, hyper::Error>(res)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    (kube::Client::try_from(config).unwrap(), received)
}

/// The sweep's context on `client`, with `plugins` as the plugins' watch cache (the other
/// caches stay empty).
fn context(
    client: kube::Client,
    plugins: kube::runtime::reflector::Store<VClusterPlugin>,
) -> Context {
    let telemetry = Arc::new(crate::telemetry::Telemetry::new());
    let (caches, _streams) = crate::cache::Caches::new(&client, &telemetry);
    Context {
        client,
        runtime_image: "rt".into(),
        reporter: kube::runtime::events::Reporter {
            controller: "test".into(),
            instance: None,
        },
        policy: crate::policy::Policy::default(),
        plugins,
        telemetry,
        caches_ready: caches.ready_signal(),
        caches,
        copies: Default::default(),
        written_statuses: Default::default(),
        discovery: Default::default(),
        verdicts: Default::default(),
        workload_locks: Default::default(),
        retries: Default::default(),
    }
}

/// The race a fresh-clone CI run of `operator_ops` hit with `--debounce-ms 0`: a new leader's
/// start-up sweep began before the plugin `first` was created; `first` was created and
/// reconciled while the sweep listed (its Role and, in `rbac.mode: PatchVClusterRoles`, its
/// record in the vCluster's Role written by that reconcile), so the sweep's lists held the
/// objects of a plugin its copy of the cache, taken when it began, did not. It deleted the new
/// Role (recreated 12 ms later by the next reconcile). What the lists hold is judged with the
/// cache as it is after each list: the objects and records of `first` stay; those of a plugin
/// that is gone (`gone`) still go.
#[tokio::test]
async fn a_plugin_created_while_the_sweep_runs_keeps_its_objects_and_records() {
    let (plugins, writer) = kube::runtime::reflector::store::<VClusterPlugin>();
    let writer = Arc::new(std::sync::Mutex::new(writer));
    writer
        .lock()
        .unwrap()
        .apply_watcher_event(&watcher::Event::InitDone);
    let owned = |meta: ObjectMeta, name: &str, uid: &str| {
        let mut meta = ObjectMeta {
            namespace: Some("team-a".into()),
            name: Some(rbac::role_name(name)),
            uid: Some(uid.into()),
            resource_version: Some("7".into()),
            ..meta
        };
        meta.labels.get_or_insert_default().extend(
            labelled("team-a", name, OPERATOR_FIELD_MANAGER)
                .labels
                .unwrap(),
        );
        meta.managed_fields = labelled("team-a", name, OPERATOR_FIELD_MANAGER).managed_fields;
        meta
    };
    let list = |kind: &str, items: Vec<Value>| {
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": format!("{kind}List"),
            "metadata": { "resourceVersion": "7" }, "items": items,
        })
    };
    let key = rbac::added_rules_annotation;
    let mut vcluster_role = chart_role(&[
        (key("first"), OPERATOR_FIELD_MANAGER),
        (key("gone"), OPERATOR_FIELD_MANAGER),
    ]);
    vcluster_role.metadata.resource_version = Some("7".into());
    let first_role = Role {
        metadata: owned(ObjectMeta::default(), "first", "uid-first"),
        rules: Some(vec![]),
    };
    let gone_binding = RoleBinding {
        metadata: owned(ObjectMeta::default(), "gone", "uid-gone"),
        role_ref: Default::default(),
        subjects: None,
    };
    let new_plugin = writer.clone();
    let (client, received) = fake_api(move |method, path| {
        let rbac_path = path
            .strip_prefix("/apis/rbac.authorization.k8s.io/v1/")
            .unwrap_or(path);
        match (method, rbac_path) {
            ("GET", "clusterrolebindings") => (200, list("ClusterRoleBinding", vec![])),
            ("GET", "clusterroles") => (200, list("ClusterRole", vec![])),
            ("GET", "rolebindings") => (
                200,
                list("RoleBinding", vec![serde_json::to_value(&gone_binding).unwrap()]),
            ),
            ("GET", "roles") => {
                // `first` was created after the sweep began, and its first reconcile wrote
                // its Role before this list: the cache holds it by now.
                let mut p = plugin("team-a", "first", "vc");
                p.metadata.uid = Some("plugin-first".into());
                new_plugin
                    .lock()
                    .unwrap()
                    .apply_watcher_event(&watcher::Event::Apply(p));
                (200, list("Role", vec![serde_json::to_value(&first_role).unwrap()]))
            }
            ("GET", "namespaces/team-a/roles") => (
                200,
                list("Role", vec![serde_json::to_value(&vcluster_role).unwrap()]),
            ),
            ("PATCH", "namespaces/team-a/roles/vc-vc") => {
                (200, serde_json::to_value(&vcluster_role).unwrap())
            }
            ("DELETE", _) => (
                200,
                json!({ "apiVersion": "v1", "kind": "Status", "status": "Success", "metadata": {} }),
            ),
            _ => (
                404,
                json!({ "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound", "metadata": {} }),
            ),
        }
    })
    .await;
    let ctx = context(client, plugins);

    let swept = sweep_all(&ctx, &BTreeSet::from(["team-a".to_string()])).await;

    assert!(swept.failed.is_empty(), "{:?}", swept.failed);
    let received = received.lock().unwrap().clone();
    let writes: Vec<&(String, String, String)> =
        received.iter().filter(|(m, _, _)| m != "GET").collect();
    assert!(
        !writes
            .iter()
            .any(|(m, uri, _)| m == "DELETE" && uri.contains("vcp-plugin-first")),
        "the Role of `first`, created while the sweep ran, was deleted: {writes:#?}"
    );
    assert_eq!(
        swept.deleted,
        ["RoleBinding team-a/vcp-plugin-gone"],
        "the gone plugin's objects still go: {writes:#?}"
    );
    let patched: Vec<Value> = writes
        .iter()
        .filter(|(m, _, _)| m == "PATCH")
        .map(|(_, _, body)| serde_json::from_str(body).unwrap())
        .collect();
    assert_eq!(patched.len(), 1, "{writes:#?}");
    let changed = patched[0]["metadata"]["annotations"].as_object().unwrap();
    assert_eq!(
        changed.keys().collect::<Vec<_>>(),
        [&key("gone")],
        "only the gone plugin's record is taken out, not the new plugin's"
    );
}
