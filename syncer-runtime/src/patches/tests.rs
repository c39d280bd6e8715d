use super::*;
use crate::translate::{host_label, host_name};
use serde_json::json;
use std::time::Duration;
use vcp_crds::{TranslatePatchLabels, TranslatePatchReference};

fn reference(path: &str, api_version: &str, kind: &str) -> TranslatePatch {
    TranslatePatch {
        path: path.into(),
        reference: Some(TranslatePatchReference {
            api_version: api_version.into(),
            kind: kind.into(),
            ..TranslatePatchReference::default()
        }),
        ..TranslatePatch::default()
    }
}

fn certificate(namespace: &str) -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"secretName": "web-tls", "issuerRef": {"name": "ca", "kind": "Issuer", "group": "cert-manager.io"}}
    })
}

fn cert_manager_patches() -> Patches {
    let mut issuer = reference("spec.issuerRef", "cert-manager.io/v1", "Issuer");
    let r = issuer.reference.as_mut().unwrap();
    r.name_path = Some("name".into());
    r.kind_path = Some("kind".into());
    r.api_version_path = Some("group".into());
    Patches::new(
        &[reference("spec.secretName", "v1", "Secret"), issuer],
        "vc",
        "vcluster-vc",
    )
    .unwrap()
    .with_cluster_scoped([("cert-manager.io".to_string(), "ClusterIssuer".to_string())])
}

#[test]
fn references_become_host_names_per_namespace_and_come_back() {
    let patches = cert_manager_patches();
    let mut hosts = Vec::new();
    for namespace in ["team-a", "team-b"] {
        let virtual_obj = certificate(namespace);
        let mut host = virtual_obj.clone();
        patches.to_host(&virtual_obj, &mut host).unwrap();
        // vCluster's single-namespace host name: <name>-x-<namespace>-x-<vcluster>
        assert_eq!(
            host["spec"]["secretName"],
            format!("web-tls-x-{namespace}-x-vc")
        );
        assert_eq!(
            host["spec"]["issuerRef"]["name"],
            format!("ca-x-{namespace}-x-vc")
        );
        assert_eq!(host["spec"]["issuerRef"]["kind"], "Issuer");
        // idempotent: the same virtual object gives the same host copy
        let mut again = virtual_obj.clone();
        patches.to_host(&virtual_obj, &mut again).unwrap();
        assert_eq!(again, host);
        // the way back restores the virtual names (also with no virtual value to compare to)
        let mut up = host.clone();
        patches.to_virtual(&virtual_obj, &mut up).unwrap();
        assert_eq!(up, virtual_obj);
        let mut up = host.clone();
        patches.to_virtual(&json!({}), &mut up).unwrap();
        assert_eq!(up["spec"], virtual_obj["spec"]);
        hosts.push(host);
    }
    assert_ne!(
        hosts[0]["spec"]["secretName"],
        hosts[1]["spec"]["secretName"]
    );
}

#[test]
fn a_cluster_scoped_reference_keeps_its_name() {
    let patches = cert_manager_patches();
    let mut virtual_obj = certificate("team-a");
    virtual_obj["spec"]["issuerRef"]["kind"] = json!("ClusterIssuer");
    let mut host = virtual_obj.clone();
    patches.to_host(&virtual_obj, &mut host).unwrap();
    assert_eq!(host["spec"]["issuerRef"]["name"], "ca");
    assert_eq!(host["spec"]["secretName"], "web-tls-x-team-a-x-vc");
}

#[test]
fn reference_namespace_and_wildcards() {
    let mut backend = reference("spec.backendRefs[*]", "v1", "Service");
    let r = backend.reference.as_mut().unwrap();
    r.name_path = Some("name".into());
    r.namespace_path = Some("namespace".into());
    let patches = Patches::new(&[backend], "vc", "vcluster-vc").unwrap();
    let virtual_obj = json!({
        "metadata": {"name": "r", "namespace": "team-a"},
        "spec": {"backendRefs": [
            {"name": "web", "port": 80},
            {"name": "api", "namespace": "team-b", "port": 81},
            {"port": 82}
        ]}
    });
    let mut host = virtual_obj.clone();
    patches.to_host(&virtual_obj, &mut host).unwrap();
    assert_eq!(
        host["spec"]["backendRefs"],
        json!([
            {"name": "web-x-team-a-x-vc", "port": 80},
            {"name": "api-x-team-b-x-vc", "namespace": "vcluster-vc", "port": 81},
            {"port": 82}
        ])
    );
    let mut up = host.clone();
    patches.to_virtual(&virtual_obj, &mut up).unwrap();
    assert_eq!(up, virtual_obj);
}

#[test]
fn long_names_are_shortened_like_vcluster_and_recognised_on_the_way_back() {
    let patches =
        Patches::new(&[reference("spec.secretName", "v1", "Secret")], "vc", "ns").unwrap();
    let long = "a".repeat(60);
    let virtual_obj = json!({"metadata": {"namespace": "team-a"}, "spec": {"secretName": long}});
    let mut host = virtual_obj.clone();
    patches.to_host(&virtual_obj, &mut host).unwrap();
    let translated = host["spec"]["secretName"].as_str().unwrap().to_string();
    assert_eq!(translated.len(), 63);
    assert_eq!(translated, host_name(&long, "team-a", "vc"));
    let mut up = host.clone();
    patches.to_virtual(&virtual_obj, &mut up).unwrap();
    assert_eq!(up["spec"]["secretName"], long.as_str());
    // a value that is no host name of this vCluster is left as it is
    let mut foreign = json!({"spec": {"secretName": "someone-else"}});
    patches.to_virtual(&virtual_obj, &mut foreign).unwrap();
    assert_eq!(foreign["spec"]["secretName"], "someone-else");
}

#[test]
fn missing_paths_are_skipped_and_wrong_shapes_fail() {
    let patches = cert_manager_patches();
    let virtual_obj = json!({"metadata": {"namespace": "a"}, "spec": {}});
    let mut host = virtual_obj.clone();
    patches.to_host(&virtual_obj, &mut host).unwrap();
    assert_eq!(host, virtual_obj);
    let bad = json!({"metadata": {"namespace": "a"}, "spec": {"secretName": 7}});
    let error = patches.to_host(&bad, &mut bad.clone()).unwrap_err();
    assert_eq!(
        (error.path.as_str(), error.what),
        ("spec.secretName", "reference")
    );
    assert!(error.message.starts_with("at spec.secretName: "), "{error}");
    let no_name_path = Patches::new(&[reference("spec.issuerRef", "v1", "X")], "vc", "ns").unwrap();
    let obj = certificate("a");
    let error = no_name_path.to_host(&obj, &mut obj.clone()).unwrap_err();
    assert!(error.message.contains("namePath"), "{error}");
}

#[test]
fn protected_and_malformed_paths_are_refused() {
    for path in [
        "metadata.name",
        "metadata.labels[\"vcluster.loft.sh/managed-by\"]",
        "a[",
        "kind",
    ] {
        let error = Patches::new(&[reference(path, "v1", "Secret")], "vc", "ns").unwrap_err();
        assert_eq!(error.path, path);
    }
}

/// When the value at `path` is a string, `namespacePath` is read from the
/// object's root and the host namespace is written there; a `namePath` or `namespacePath` that
/// names the identity is refused like `path`, in every spelling. `kindPath` / `apiVersionPath`
/// are only read (cert-manager's `kindPath: kind` stays usable).
#[test]
fn reference_paths_that_write_the_identity_are_refused() {
    for (field, relative) in [
        (
            "namespacePath",
            "metadata.labels[\"vcluster.loft.sh/managed-by\"]",
        ),
        ("namespacePath", "metadata.namespace"),
        ("namespacePath", "metadata.Labels.release"),
        ("namePath", "metadata.name"),
        (
            "namePath",
            "metadata.annotations['vcluster.loft.sh/object-name']",
        ),
    ] {
        let mut patch = reference("spec.secretName", "v1", "Secret");
        let r = patch.reference.as_mut().unwrap();
        match field {
            "namespacePath" => r.namespace_path = Some(relative.into()),
            _ => r.name_path = Some(relative.into()),
        }
        let error = Patches::new(&[patch], "vc", "vcluster-vc").unwrap_err();
        assert_eq!(
            (error.path.as_str(), error.what),
            ("spec.secretName", "reference"),
            "{field}: {relative}"
        );
        assert!(
            error.message.contains(&format!("reference.{field}")),
            "{error}"
        );
    }
    // what it would have done: the host namespace written over the host copy's owner label
    // (shown with a path of the same shape that names no identity)
    let mut patch = reference("spec.secretName", "v1", "Secret");
    patch.reference.as_mut().unwrap().namespace_path = Some("metadata.labels.team".into());
    let patches = Patches::new(&[patch], "vc", "vcluster-vc").unwrap();
    let virtual_obj = json!({"metadata": {"namespace": "a", "labels": {"team": "b"}},
        "spec": {"secretName": "s"}});
    let mut host = virtual_obj.clone();
    patches.to_host(&virtual_obj, &mut host).unwrap();
    assert_eq!(host["metadata"]["labels"]["team"], "vcluster-vc");
    assert_eq!(host["spec"]["secretName"], host_name("s", "b", "vc"));
    // read-only paths and relative paths that name no identity are accepted
    let mut issuer = reference("spec.issuerRef", "cert-manager.io/v1", "Issuer");
    let r = issuer.reference.as_mut().unwrap();
    r.name_path = Some("name".into());
    r.namespace_path = Some("namespace".into());
    r.kind_path = Some("kind".into());
    r.api_version_path = Some("apiVersion".into());
    Patches::new(&[issuer], "vc", "vcluster-vc").unwrap();
}

#[test]
fn label_selectors_are_translated_like_host_label_selector() {
    let patch = TranslatePatch {
        path: "spec.selector".into(),
        labels: Some(TranslatePatchLabels {}),
        ..TranslatePatch::default()
    };
    let patches = Patches::new(&[patch], "vc", "ns").unwrap();
    let virtual_obj = json!({"metadata": {"namespace": "a"}, "spec": {"selector": {
        "matchLabels": {"app": "web", "release": "r1"},
        "matchExpressions": [{"key": "vcluster.loft.sh/namespace", "operator": "In", "values": ["x"]}]
    }}});
    let mut host = virtual_obj.clone();
    patches.to_host(&virtual_obj, &mut host).unwrap();
    // release → vCluster's documented host key for vCluster vc (translate/names.rs docs)
    assert_eq!(
        host["spec"]["selector"]["matchLabels"],
        json!({"app": "web", "vcluster.loft.sh/label-vc-x-a4d451ec23": "r1"})
    );
    assert_eq!(
        host["spec"]["selector"]["matchExpressions"][0]["key"],
        host_label("vcluster.loft.sh/namespace", "vc")
    );
    let mut up = host.clone();
    patches.to_virtual(&virtual_obj, &mut up).unwrap();
    assert_eq!(up, virtual_obj);
    let mut bad = json!({"spec": {"selector": "app=web"}});
    assert!(patches.to_host(&virtual_obj, &mut bad).is_err());
}

#[test]
fn expressions_and_reverse_expressions() {
    let patch = TranslatePatch {
        path: "spec.image".into(),
        expression: Some("'registry.example.com/' + value".into()),
        reverse_expression: Some("value.replace('registry.example.com/', '')".into()),
        ..TranslatePatch::default()
    };
    let patches = Patches::new(&[patch], "vc", "ns").unwrap();
    let virtual_obj =
        json!({"metadata": {"namespace": "a"}, "spec": {"image": "nginx"}, "status": {}});
    let mut host = virtual_obj.clone();
    patches.to_host(&virtual_obj, &mut host).unwrap();
    assert_eq!(host["spec"]["image"], "registry.example.com/nginx");
    let mut up = host.clone();
    patches.to_virtual(&virtual_obj, &mut up).unwrap();
    assert_eq!(up, virtual_obj);
    // a reverseExpression alone (as vCluster allows) changes nothing on the way down
    let only_reverse = TranslatePatch {
        path: "status.url".into(),
        reverse_expression: Some("value.toUpperCase()".into()),
        ..TranslatePatch::default()
    };
    let patches = Patches::new(&[only_reverse], "vc", "ns").unwrap();
    let mut host = json!({"status": {"url": "abc"}});
    patches.to_host(&virtual_obj, &mut host).unwrap();
    assert_eq!(host["status"]["url"], "abc");
    patches.to_virtual(&virtual_obj, &mut host).unwrap();
    assert_eq!(host["status"]["url"], "ABC");
}

#[test]
fn a_runaway_expression_fails_its_patch() {
    let patch = TranslatePatch {
        path: "spec.image".into(),
        expression: Some("while (true) {}".into()),
        ..TranslatePatch::default()
    };
    let patches = Patches::new(&[patch], "vc", "ns").unwrap();
    let virtual_obj = json!({"spec": {"image": "nginx"}});
    let error = patches
        .to_host(&virtual_obj, &mut virtual_obj.clone())
        .unwrap_err();
    assert_eq!(error.what, "expression");
    assert!(error.message.contains("time bound"), "{error}");
}

#[test]
fn from_host_runs_expressions_forward_and_names_back() {
    let patches = Patches::new(
        &[
            TranslatePatch {
                path: "spec.endpoint".into(),
                expression: Some("value + '.' + context.vcluster.namespace".into()),
                reverse_expression: Some("'never run'".into()),
                ..TranslatePatch::default()
            },
            reference("spec.secretName", "v1", "Secret"),
        ],
        "vc",
        "vcluster-vc",
    )
    .unwrap();
    let host = json!({"metadata": {"name": "db", "namespace": "vcluster-vc"},
        "spec": {"endpoint": "db", "secretName": "creds-x-team-a-x-vc"}});
    let mut virtual_view = host.clone();
    patches.from_host(&host, &mut virtual_view).unwrap();
    assert_eq!(virtual_view["spec"]["endpoint"], "db.vcluster-vc");
    // a host name of this vCluster becomes the virtual name; another name stays
    assert_eq!(virtual_view["spec"]["secretName"], "creds");
    let mut other =
        json!({"metadata": {"namespace": "vcluster-vc"}, "spec": {"secretName": "shared"}});
    patches.from_host(&host, &mut other).unwrap();
    assert_eq!(other["spec"]["secretName"], "shared");
}

#[test]
fn one_objects_evaluations_together_are_bounded_in_time_and_in_result_size() {
    // time: 1,000 locations of a `[*]` path, each evaluation taking ~5 ms, against an object's
    // bound of 10 × 200 ms = 2 s: stopped after about 400 of them, the object unchanged. One
    // evaluation's bound is 40 times its work, so that only the object's bound can stop it:
    // with 20 ms against 2 ms, a thread that waited for a core (the unit tests beside a busy
    // machine) ran out of its own bound first, "time bound of 20ms" in 6 of 40 runs. Without
    // the object's bound the 1,000 would take 5 s at the least.
    let patch = TranslatePatch {
        path: "spec.tags[*]".into(),
        expression: Some(
            "var t = Date.now(); while (Date.now() - t < 5) {} value.toUpperCase()".into(),
        ),
        ..TranslatePatch::default()
    };
    let patches = Patches::new(&[patch], "vc", "ns")
        .unwrap()
        .with_bounds(Bounds {
            time: Duration::from_millis(200),
            memory: 16 << 20,
        });
    let tags: Vec<String> = (0..1000).map(|i| format!("t{i}")).collect();
    let virtual_obj = json!({"spec": {"tags": tags}});
    let started = std::time::Instant::now();
    let error = patches
        .to_host(&virtual_obj, &mut virtual_obj.clone())
        .unwrap_err();
    assert!(
        error
            .message
            .contains("longer than the object's bound of 2s"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // size: a FromHost object's 150 items, each made a 1 MB string (the expressions read the
    // host object, which the results do not grow), against the bound of 3 MiB of results
    // (`MAX_RESULT_BYTES`): stopped at the 4th (each result is 1,000,002 bytes of JSON)
    let patch = TranslatePatch {
        path: "spec.items[*]".into(),
        expression: Some("'x'.repeat(1000000)".into()),
        ..TranslatePatch::default()
    };
    let patches = Patches::new(&[patch], "vc", "ns")
        .unwrap()
        .with_bounds(Bounds {
            time: Duration::from_secs(10),
            memory: 16 << 20,
        });
    let host = json!({"metadata": {"namespace": "ns"}, "spec": {"items": vec![0; 150]}});
    let error = patches.from_host(&host, &mut host.clone()).unwrap_err();
    assert!(
        error
            .message
            .contains("the results of the 4 evaluations so far hold 4000008 bytes of JSON, above the object's bound of 3145728 bytes"),
        "{error}"
    );
}

/// An evaluation runs outside the task that awaits it: while one expression is busy (here a
/// loop of about a second under a far time bound, standing for an object's whole budget or a
/// native call the interrupt does not reach), another future *of the same task* keeps running,
/// as a synced type's watches and other workers share its driver's task with the worker that
/// evaluates. With `block_in_place` (as it once was) the other tasks of the runtime moved on
/// but that task stood still: ten heavy objects held up a whole type's creates and deletes for
/// 16–31 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn an_evaluation_does_not_hold_up_its_own_task() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let patch = TranslatePatch {
        path: "spec.image".into(),
        expression: Some("let i = 0; while (i < 20000000) i++; value".into()),
        ..TranslatePatch::default()
    };
    let patches = Arc::new(
        Patches::new(&[patch], "vc", "ns")
            .unwrap()
            .with_bounds(Bounds {
                time: Duration::from_secs(60),
                ..Bounds::default()
            }),
    );
    let ticks = AtomicU64::new(0);
    let evaluating = AtomicBool::new(true);
    // one task, as a type's driver: a ticker beside the evaluation, joined
    let ticker = async {
        while evaluating.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
            ticks.fetch_add(1, Ordering::Relaxed);
        }
    };
    let evaluation = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let virtual_obj = json!({"spec": {"image": "nginx"}});
        let before = ticks.load(Ordering::Relaxed);
        let started = std::time::Instant::now();
        let host = patches
            .to_host_in_pool(virtual_obj.clone(), virtual_obj)
            .await
            .unwrap();
        let during = ticks.load(Ordering::Relaxed) - before;
        evaluating.store(false, Ordering::Relaxed);
        (host, during, started.elapsed())
    };
    let ((host, during, took), ()) = tokio::join!(evaluation, ticker);
    assert_eq!(host["spec"]["image"], "nginx");
    assert!(took > Duration::from_millis(200), "{took:?}");
    // at least a tick for every 50 ms of the evaluation (one per 5 ms when nothing is held up)
    let expected = u64::try_from(took.as_millis() / 50).unwrap();
    assert!(during >= expected, "{during} ticks in {took:?}");
}

/// At most [`EVALUATION_SLOTS`](super::EVALUATION_SLOTS) objects of a runtime evaluate at
/// once, on as many threads; the others wait for a slot without a thread, and every one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn evaluations_take_at_most_their_slots() {
    use super::EVALUATION_SLOTS;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let patch = TranslatePatch {
        path: "spec.image".into(),
        expression: Some("var t = Date.now(); while (Date.now() - t < 50) {} value".into()),
        ..TranslatePatch::default()
    };
    let evaluations = Arc::new(running::Evaluations::default());
    let patches = Arc::new(
        Patches::new(&[patch], "vc", "ns")
            .unwrap()
            .with_bounds(Bounds {
                time: Duration::from_secs(10),
                ..Bounds::default()
            })
            .sharing_evaluations(evaluations.clone()),
    );
    let most = Arc::new(AtomicUsize::new(0));
    let watching = {
        let (evaluations, most) = (evaluations.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                most.fetch_max(evaluations.running(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let objects = 3 * EVALUATION_SLOTS;
    let results = futures::future::join_all((0..objects).map(|_| {
        let obj = json!({"spec": {"image": "nginx"}});
        patches.to_host_in_pool(obj.clone(), obj)
    }))
    .await;
    watching.abort();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let most = most.load(Ordering::Relaxed);
    assert!((1..=EVALUATION_SLOTS).contains(&most), "{most} at once");
}

/// The fourth attacker's piling threads: an evaluation inside one long native call keeps its
/// thread past its bound, and new evaluations (a spec edit starts them again) took a thread
/// more each. With [`running::MAX_OVERRUNNING`] of the runtime's evaluations past their
/// bound, a new one is refused at once, without a thread and without being counted; the
/// overrunning ones end with the time bound's error, and new ones start again.
#[test]
fn at_most_a_few_evaluations_run_past_their_bound_at_once() {
    use running::{Evaluations, MAX_OVERRUNNING};
    use std::sync::Arc;
    use std::time::Instant;
    // one native call, inside which the interrupt handler is never called: `replaceAll` over
    // a string of 64 million characters (about 0.2 s; linear in the size, which only the
    // memory bound limits, raised here for a call this long)
    let slow = TranslatePatch {
        path: "spec.image".into(),
        expression: Some("'ab'.repeat(32e6).replaceAll('a', 'c').length && value".into()),
        ..TranslatePatch::default()
    };
    let bounds = Bounds {
        time: Duration::from_millis(20),
        memory: 192 << 20,
    };
    let evaluations = Arc::new(Evaluations::default());
    let patches = Arc::new(
        Patches::new(&[slow], "vc", "ns")
            .unwrap()
            .with_bounds(bounds)
            .sharing_evaluations(evaluations.clone()),
    );
    let widget = |name: &str| {
        json!({"apiVersion": "e2e.vcp.test/v1", "kind": "Widget",
            "metadata": {"name": name, "namespace": "a"}, "spec": {"image": "nginx"}})
    };
    let stuck: Vec<_> = (0..MAX_OVERRUNNING)
        .map(|i| {
            let patches = patches.clone();
            let obj = widget(&format!("w{i}"));
            std::thread::spawn(move || patches.to_host(&obj, &mut obj.clone()))
        })
        .collect();
    let waited = Instant::now();
    while evaluations.overrunning(Instant::now()).len() < MAX_OVERRUNNING {
        assert!(waited.elapsed() < Duration::from_secs(10), "never overran");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(evaluations.running(), MAX_OVERRUNNING);
    let started = Instant::now();
    let obj = widget("late");
    let error = patches.to_host(&obj, &mut obj.clone()).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(error.what, "expression");
    assert!(
        error.message.starts_with(&format!(
            "refused without running: {MAX_OVERRUNNING} evaluation(s) of this runtime's expressions are still running past their time bound"
        )),
        "{error}"
    );
    assert!(
        error.message.contains(
            "e2e.vcp.test/v1 Widget a/w0: patch \"spec.image\" (expression) at spec.image"
        ) || error.message.contains("e2e.vcp.test/v1 Widget a/w1"),
        "{error}"
    );
    assert_eq!(
        evaluations.running(),
        MAX_OVERRUNNING,
        "the refused one ran"
    );
    for thread in stuck {
        let error = thread.join().unwrap().unwrap_err();
        assert!(error.message.contains("time bound of 20ms"), "{error}");
    }
    assert_eq!(evaluations.running(), 0);
    let quick = Patches::new(
        &[TranslatePatch {
            path: "spec.image".into(),
            expression: Some("value + '-x'".into()),
            ..TranslatePatch::default()
        }],
        "vc",
        "ns",
    )
    .unwrap()
    .sharing_evaluations(evaluations.clone());
    let mut host = obj.clone();
    quick.to_host(&obj, &mut host).unwrap();
    assert_eq!(host["spec"]["image"], "nginx-x");
}
