//! Order: the `VClusterPlugin` CRD and the plugins in **one** Application sync at
//! the first attempt on a fresh cluster, with neither a sync wave nor
//! `SkipDryRunOnMissingResource`.
//!
//! Why, in Argo CD v3.6.2's gitops-engine (`pkg/sync/sync_context.go`): before a sync it asks
//! discovery for each resource's kind; a kind the API server does not serve fails the whole
//! operation ("one or more synchronization tasks are not valid") unless the CRD of that group
//! and kind is in the same sync (`hasCRDOfGroupKind`) or the resource opts in with
//! `SkipDryRunOnMissingResource=true`; then its dry run is skipped. Within a wave, resources are
//! applied kind by kind in `kindOrder` (`pkg/sync/sync_tasks.go`: `CustomResourceDefinition`
//! early, kinds it does not list last), and after creating a CRD the controller waits for it to
//! be `Established` (`ensureCRDReady`, up to 3 s) before the next kind.
//!
//! The fresh cluster is a nodeless [`ControlPlane`] of its own (etcd and kube-apiserver
//! v1.34.4, audit log on), with a second Argo CD against it: nothing of this product is
//! installed there (the test first shows the CRD absent). The files in Git are the product's as
//! shipped: `config/crd/vclusterplugins.vcp.dev.yaml` and `config/samples/car-plugin.yaml`;
//! the Applications take the sample Application's shape and sync policy
//! (`config/argocd/application.yaml`), with the Git source only.
//!
//! Two controls show what the order test tests: the same plugin without its CRD fails (Argo CD
//! names the group version the API server does not serve), and so does it with
//! `SkipDryRunOnMissingResource=true` (the dry run is skipped, the apply itself fails): that
//! option is not an order. With the CRD in another Application, the plugins' Application
//! syncs only once that one has: Argo CD v3.6 retries a failed automated sync 5 times by
//! default (5 s, doubling: about 2.5 minutes in all), and after that only a new commit or a
//! manual sync tries again.
//!
//! Seen in 4 of 6 runs: right after the sync, Argo CD's cluster cache starts to watch the new
//! kind, a comparison in between finds the plugin missing and starts one self-heal, which
//! applies the same manifest again without a request reaching the API server (client-side
//! apply, empty patch). The test allows that one and asserts that across the next three
//! reconciles Argo CD writes neither the CRD nor the plugin, and that the plugin's spec was
//! written once (`metadata.generation` 1).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use vcp_tests::argocd_local::{self, ArgoCd, ArgoCdTools};
use vcp_tests::audit::Writes;
use vcp_tests::control_plane::{Cluster, ControlPlane, Identity};
use vcp_tests::{poll_for, repo_root};

use crate::gitops::{ARGOCD_USER_AGENT, resource_health};
use crate::vcluster::{scenario_lock, script_without_node, values};

/// The sample plugin's name and namespace, as shipped.
const PLUGIN: &str = "car-sync";
const PLUGIN_NAMESPACE: &str = "my-vcluster";
/// The namespace of the controls (their destination, and their copy of the sample plugin), so
/// that the order test's Application meets a cluster without the sample's namespace too.
const CONTROL_NAMESPACE: &str = "control";
/// The CRD's name.
const CRD: &str = "vclusterplugins.vcp.dev";

/// What [`ArgoCd::start`] needs, from `scripts/oracles build` (helm, the chart),
/// `scripts/control-plane build` (kubectl) and `scripts/argocd build`: the node's tools are not
/// needed, so this test does not start the node.
fn tools() -> ArgoCdTools {
    let mut all = BTreeMap::new();
    for name in ["oracles", "control-plane", "argocd"] {
        all.extend(values(&script_without_node(name, &["build"])));
    }
    ArgoCdTools::from_values(&all).expect("the tools Argo CD needs")
}

fn shipped(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap()
}

/// `config/argocd/application.yaml` named `name`, its sources replaced by this machine's Git
/// remote at `path` (branch as shipped), without the StatefulSet's `ignoreDifferences` (no
/// chart here), `extra_sync_options` appended to the shipped sync options; destination and
/// sync policy as shipped.
fn application(argocd: &ArgoCd, name: &str, path: &str, extra_sync_options: &[&str]) -> Value {
    let mut app: Value = serde_yaml::from_str(&shipped("config/argocd/application.yaml")).unwrap();
    app["metadata"]["name"] = json!(name);
    let spec = &mut app["spec"];
    let mut git = spec["sources"][1].clone();
    assert_eq!(git["targetRevision"], "main", "the sample's Git source");
    git["repoURL"] = json!(argocd.git_url());
    git["path"] = json!(path);
    spec["sources"] = json!([git]);
    spec.as_object_mut().unwrap().remove("ignoreDifferences");
    let options = spec["syncPolicy"]["syncOptions"].as_array_mut().unwrap();
    options.extend(extra_sync_options.iter().map(|o| json!(o)));
    app
}

fn live(argocd: &ArgoCd, name: &str) -> Value {
    argocd.application(name).unwrap()
}

/// Waits up to 180 s for Application `name`'s first sync operation to end (`Succeeded`,
/// `Failed` or `Error`); returns the Application, or panics with its status and the
/// controller's log.
async fn operation_ended(argocd: &ArgoCd, name: &str) -> Value {
    let ended = poll_for(Duration::from_secs(180), || {
        let app = live(argocd, name);
        async move {
            let phase = app["status"]["operationState"]["phase"].as_str();
            matches!(phase, Some("Succeeded" | "Failed" | "Error")).then_some(app)
        }
    })
    .await;
    ended.unwrap_or_else(|| {
        panic!(
            "Application {name}: no sync operation ended within 180 s:\n{}\ncontroller:\n{}",
            serde_json::to_string_pretty(&live(argocd, name)).unwrap(),
            argocd.log_tail("application-controller", 30)
        )
    })
}

/// The sync result of the resource of `kind` in an Application's last operation: (`status`,
/// `message`).
fn sync_result(app: &Value, kind: &str) -> (String, String) {
    let r = app["status"]["operationState"]["syncResult"]["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["kind"] == kind))
        .unwrap_or_else(|| {
            panic!(
                "no {kind} in the sync result: {}",
                serde_json::to_string_pretty(&app["status"]).unwrap()
            )
        });
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (s(&r["status"]), s(&r["message"]))
}

/// Argo CD's writes on the fresh cluster to `resource` (`customresourcedefinitions`,
/// `vclusterplugins`): every attempt, in order.
async fn argocd_writes(cp: &ControlPlane, resource: &str) -> Vec<vcp_tests::audit::AuditedWrite> {
    let writes = Writes::default()
        .in_control_plane(cp)
        .on(Cluster::Host)
        .resource(resource)
        .without_dry_runs()
        .caught_up()
        .await
        .attempts();
    writes
        .into_iter()
        .filter(|w| w.user_agent.starts_with(ARGOCD_USER_AGENT))
        .collect()
}

/// Whether `big` holds everything `small` says: the same scalars, every key of an object
/// (more keys allowed: the CRD's defaults), arrays of the same length item by item.
fn contains(big: &Value, small: &Value) -> bool {
    match (big, small) {
        (Value::Object(b), Value::Object(s)) => s
            .iter()
            .all(|(k, v)| b.get(k).is_some_and(|bv| contains(bv, v))),
        (Value::Array(b), Value::Array(s)) => {
            b.len() == s.len() && b.iter().zip(s).all(|(bv, sv)| contains(bv, sv))
        }
        _ => big == small,
    }
}

#[tokio::test]
async fn gitops_order_the_crd_and_its_plugins_in_one_application_sync_at_the_first_attempt() {
    let _serial = scenario_lock().lock().await;
    let started = Instant::now();
    let tools = tools();
    let cp = ControlPlane::start().expect("a fresh control plane");
    let admin = cp.kubeconfig(Cluster::Host, Identity::Admin);
    let argocd = ArgoCd::start(
        &cp.dir().join("argocd"),
        &admin,
        tools,
        &argocd_local::shipped_argocd_cm().unwrap(),
        std::process::id(),
    )
    .expect("start Argo CD against the fresh control plane");
    eprintln!(
        "gitops_order: fresh control plane and Argo CD in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let missing = argocd
        .kubectl(&["get", "crd", CRD], None)
        .expect_err("a fresh cluster has no VClusterPlugin CRD");
    assert!(
        missing.to_string().contains("NotFound"),
        "kubectl get crd {CRD} on the fresh cluster: {missing:#}"
    );

    let crd = shipped(&format!("config/crd/{CRD}.yaml"));
    let plugin = shipped("config/samples/car-plugin.yaml");
    assert!(plugin.contains(&format!("  namespace: {PLUGIN_NAMESPACE}\n")));
    let control_plugin = plugin.replace(
        &format!("  namespace: {PLUGIN_NAMESPACE}\n"),
        &format!("  namespace: {CONTROL_NAMESPACE}\n"),
    );
    argocd
        .commit(
            &[
                ("control/car-plugin.yaml", &control_plugin),
                (&format!("vcp/{CRD}.yaml"), &crd),
                ("vcp/car-plugin.yaml", &plugin),
            ],
            "the CRD and the sample plugin; the plugin alone",
        )
        .unwrap();

    // The controls: the plugin without its CRD, with and without SkipDryRunOnMissingResource.
    for (name, options) in [
        ("no-crd", vec![]),
        (
            "no-crd-skip-dry-run",
            vec!["SkipDryRunOnMissingResource=true"],
        ),
    ] {
        let mut app = application(&argocd, name, "control", &options);
        // Argo CD v3.6 retries a failed automated sync 5 times by default (`Retry{Limit: 5}`
        // in `controller/appcontroller.go`, backoff from 5 s doubling): no retry, so that the
        // first attempt's failure is the operation's end.
        app["spec"]["syncPolicy"]["retry"] = json!({"limit": 0});
        app["spec"]["destination"]["namespace"] = json!(CONTROL_NAMESPACE);
        argocd
            .kubectl(&["apply", "-f", "-"], Some(&app.to_string()))
            .unwrap();
    }
    let plain = operation_ended(&argocd, "no-crd").await;
    let skip = operation_ended(&argocd, "no-crd-skip-dry-run").await;
    let state = |app: &Value| {
        let op = &app["status"]["operationState"];
        (
            op["phase"].as_str().unwrap_or_default().to_string(),
            op["message"].as_str().unwrap_or_default().to_string(),
        )
    };
    let (phase, message) = state(&plain);
    eprintln!("gitops_order: the plugin without its CRD: {phase}: {message}");
    assert_eq!(phase, "Failed", "{:#}", plain["status"]);
    assert!(
        message.starts_with("one or more synchronization tasks are not valid")
            && message.contains("vcp.dev/v1alpha1"),
        "Argo CD's message for a kind the API server does not serve: {message}"
    );
    let (phase, message) = state(&skip);
    eprintln!(
        "gitops_order: the plugin without its CRD, SkipDryRunOnMissingResource: {phase}: \
         {message}; resource: {:?}",
        sync_result(&skip, "VClusterPlugin")
    );
    assert_eq!(phase, "Failed", "{:#}", skip["status"]);
    let (status, message) = sync_result(&skip, "VClusterPlugin");
    assert_eq!(status, "SyncFailed", "{:#}", skip["status"]);
    assert!(
        message.contains(r#"no matches for kind "VClusterPlugin" in version "vcp.dev/v1alpha1""#),
        "the apply's failure when the dry run was skipped: {message}"
    );
    // Neither reached the API server with the plugin: the first failed discovery, the second
    // kubectl's mapping of the kind, in Argo CD.
    let attempts = argocd_writes(&cp, "vclusterplugins").await;
    assert!(
        attempts.is_empty(),
        "no VClusterPlugin write without its CRD: {attempts:?}"
    );
    argocd
        .kubectl(
            &[
                "-n",
                argocd_local::NAMESPACE,
                "delete",
                "application",
                "no-crd",
                "no-crd-skip-dry-run",
                "--wait",
            ],
            None,
        )
        .unwrap();
    let namespaces = argocd
        .kubectl(&["get", "namespaces", "-o", "name"], None)
        .unwrap();
    assert!(
        !namespaces.contains(&format!("namespace/{PLUGIN_NAMESPACE}\n")),
        "the order test starts without the sample's namespace: {namespaces}"
    );

    // The order test: the CRD and the plugin in one Application, no wave, no sync option.
    let since = std::time::SystemTime::now();
    let app = application(&argocd, "vcp", "vcp", &[]);
    assert_eq!(
        app["spec"]["syncPolicy"]["syncOptions"],
        json!(["CreateNamespace=true", "RespectIgnoreDifferences=true"]),
        "the sample's sync options, nothing added"
    );
    argocd
        .kubectl(&["apply", "-f", "-"], Some(&app.to_string()))
        .unwrap();
    // The first sync operation, as Argo CD's controller logs it. (Its `status.operationState`
    // may be overwritten at once by a self-heal: see below.)
    let controller = |needles: &[&str]| {
        let mut all = vec!["application=vcp "];
        all.extend_from_slice(needles);
        argocd.log_lines("application-controller", &all)
    };
    let first_end = poll_for(Duration::from_secs(180), || {
        let ended = controller(&["Finished processing requested app operation"])
            .into_iter()
            .find(|l| !l.contains("phase=Running"));
        async move { ended }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "Application vcp: no sync operation ended within 180 s:\n{}\ncontroller:\n{}",
            serde_json::to_string_pretty(&live(&argocd, "vcp")).unwrap(),
            argocd.log_tail("application-controller", 30)
        )
    });
    eprintln!(
        "gitops_order: the CRD and the plugin in one Application, first operation ended ({:.1} \
         s after the Application was created): {first_end}",
        since.elapsed().unwrap().as_secs_f64()
    );
    assert!(
        first_end.contains("phase=Succeeded") && first_end.contains("retryCount=0"),
        "the first operation succeeded at its first attempt: {first_end}"
    );
    let results = controller(&["Adding resource result"]);
    for created in [
        format!("message: 'customresourcedefinition.apiextensions.k8s.io/{CRD} created'"),
        format!("message: 'vclusterplugin.vcp.dev/{PLUGIN} created'"),
    ] {
        assert!(
            results
                .iter()
                .any(|l| l.contains("status: 'Synced'") && l.contains(&created)),
            "Argo CD's result {created}: {results:#?}"
        );
    }
    assert!(
        !results.iter().any(|l| l.contains("SyncFailed")),
        "no resource failed: {results:#?}"
    );

    // The order on the API server: the CRD created, then the plugin, each at its first try.
    let crd_writes = argocd_writes(&cp, "customresourcedefinitions").await;
    let crd_writes: Vec<_> = crd_writes
        .iter()
        .filter(|w| w.received_at >= since)
        .collect();
    let plugin_writes = argocd_writes(&cp, "vclusterplugins").await;
    let plugin_writes: Vec<_> = plugin_writes
        .iter()
        .filter(|w| w.received_at >= since)
        .collect();
    assert_eq!(
        (
            crd_writes.first().map(|w| (w.verb.as_str(), w.code)),
            plugin_writes.first().map(|w| (w.verb.as_str(), w.code)),
        ),
        (Some(("create", 201)), Some(("create", 201))),
        "Argo CD's first write of each: CRD {crd_writes:?}, plugin {plugin_writes:?}"
    );
    assert!(
        crd_writes[0].received_at < plugin_writes[0].received_at,
        "the CRD before the plugin: {crd_writes:?} {plugin_writes:?}"
    );

    // Settled: Synced, the plugin's health from the shipped Lua (no operator runs on this
    // cluster), the plugin as in Git. Right after the CRD is created, Argo CD's cluster cache
    // starts to watch the new kind; a comparison in between may see the plugin missing and
    // start one self-heal (`autoHealAttemptsCount: 1`), which applies the same manifest again
    // (`configured`). Across three reconciles after that, Argo CD writes nothing to either.
    let settled = poll_for(Duration::from_secs(60), || {
        let app = live(&argocd, "vcp");
        async move {
            let synced = app["status"]["sync"]["status"] == "Synced"
                && app["status"]["operationState"]["phase"] == "Succeeded";
            synced.then_some(app)
        }
    })
    .await
    .expect("the Application Synced after its first sync");
    assert_eq!(
        resource_health(&settled, "VClusterPlugin", None),
        Some((
            "Progressing".to_string(),
            "Waiting for vcluster-plugin-operator to act on this plugin".to_string()
        )),
        "Argo CD's health of the plugin (config/argocd/health.lua, no status): {:#}",
        settled["status"]["resources"]
    );
    let window = std::time::SystemTime::now();
    let mut seen = vec![settled["status"]["reconciledAt"].clone()];
    let reconciled = poll_for(Duration::from_secs(60), || {
        let at = live(&argocd, "vcp")["status"]["reconciledAt"].clone();
        if seen.last() != Some(&at) {
            seen.push(at);
        }
        let done = seen.len() > 3;
        async move { done.then_some(()) }
    })
    .await;
    assert!(
        reconciled.is_some(),
        "three reconciles of the Application within 60 s: {seen:?}"
    );
    let after = |resource: &'static str| {
        let cp = &cp;
        async move {
            argocd_writes(cp, resource)
                .await
                .into_iter()
                .filter(|w| w.received_at >= window)
                .collect::<Vec<_>>()
        }
    };
    let (crd_after, plugin_after) = (
        after("customresourcedefinitions").await,
        after("vclusterplugins").await,
    );
    assert!(
        crd_after.is_empty() && plugin_after.is_empty(),
        "Argo CD wrote during three reconciles ({seen:?}): CRD {crd_after:?}, plugin \
         {plugin_after:?}"
    );
    let stored = argocd
        .kubectl(
            &[
                "-n",
                PLUGIN_NAMESPACE,
                "get",
                "vclusterplugin",
                PLUGIN,
                "-o",
                "json",
            ],
            None,
        )
        .unwrap();
    let stored: Value = serde_json::from_str(&stored).unwrap();
    let committed: Value = serde_yaml::from_str(&plugin).unwrap();
    assert!(
        contains(&stored["spec"], &committed["spec"]) && stored["metadata"]["generation"] == 1,
        "the plugin stored as in Git (plus the CRD's defaults), its spec written once: stored \
         {stored:#}, committed {:#}",
        committed["spec"]
    );
    eprintln!(
        "gitops_order: Argo CD's writes to the plugin: {:?}; automated syncs initiated: {}",
        plugin_writes
            .iter()
            .map(|w| format!("{} {}", w.verb, w.code))
            .collect::<Vec<_>>(),
        controller(&["Initiated automated sync", "app-namespace=argocd"]).len()
    );
    eprintln!(
        "gitops_order: passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
