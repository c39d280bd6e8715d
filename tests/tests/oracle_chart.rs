//! Chart oracle: vCluster's own Helm chart is the referee of what the operator installs.
//!
//! `scripts/oracles build` builds helm (`helm.sh/helm/v3`, pinned in `tests/helm/go.mod`) and
//! finds vCluster's chart in each vCluster module of [`vcp_tests::VCLUSTER_VERSIONS`] (`chart/` of
//! `github.com/loft-sh/vcluster@v0.30.0` and `@v0.36.1`, from the Go module cache; nothing of it
//! is committed), and the test runs once per version.
//! For each values file in `tests/fixtures/chart-oracle/`, this test applies to the host API
//! server (a) the chart rendered *with* the plugin values, and (b) the chart rendered *without*
//! them, into which the operator then installs the VClusterPlugins that `import` makes of the same
//! values. The plugin parts of the two pod templates — init containers, sidecars, the `plugins`
//! volume, the syncer's mounts, and the order of the init containers — and the rules granted
//! (the chart's Role / ClusterRole rules added by the values against the operator's plugin
//! Roles / ClusterRoles) must be equal field by field, both as the API server stored them, apart
//! from the deliberate differences named in [`DELIBERATE_DIFFERENCES`] (each must occur).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use vcp_crds::{PLUGIN_NAME_LABEL, PLUGIN_NAMESPACE_LABEL, VClusterPlugin};
use vcp_tests::{TEST_FIELD_MANAGER, apply_yaml, repo_root, wait_for};

const RUNTIME_IMAGE: &str = "vcp-test/runtime:chart-oracle";
const TIMEOUT: Duration = Duration::from_secs(60);

/// Differences between the chart's rendering and the operator's install that are there on
/// purpose, by name and why. Each is applied to the operator's side by [`apply_deliberate`]
/// (only in exactly the described form; anything else still counts as a difference), and each
/// must occur. README.md ("vCluster compatibility") lists them too.
const DELIBERATE_DIFFERENCES: [(&str, &str); 2] = [
    (
        "init-container-order",
        "the chart lists plugin init containers before its own `kubernetes` init container; the \
         operator adds its entries to a list Helm owns by server-side apply, which appends them \
         (reordering would take the chart's entries over). Both copy into their own volumes, so \
         the order does not matter; the plugins keep their order among themselves",
    ),
    (
        "v1-config-as-plugin-config-env",
        "a v1 sidecar's `config` reaches it as env PLUGIN_CONFIG (YAML), after the chart's env; \
         vCluster v0.30's chart renders no env for it (its syncer passes config only to v2 \
         plugins)",
    ),
];

/// Undoes the deliberate differences on the operator's side, where they occur in exactly their
/// described form; returns the names of those that occurred.
fn apply_deliberate(
    chart: &BTreeMap<String, Value>,
    operator: &mut BTreeMap<String, Value>,
) -> Vec<&'static str> {
    let mut applied = Vec::new();
    // init-container-order: the same entries, the plugins in the same order among themselves,
    // only the chart's own init containers placed differently
    let order = |parts: &BTreeMap<String, Value>| -> Vec<String> {
        serde_json::from_value(parts["initContainers order"].clone()).unwrap_or_default()
    };
    let (chart_order, operator_order) = (order(chart), order(operator));
    let plugins_only = |o: &[String]| -> Vec<String> {
        o.iter()
            .filter(|n| chart.contains_key(&format!("initContainers[{n}]")))
            .cloned()
            .collect()
    };
    let mut sorted_chart = chart_order.clone();
    sorted_chart.sort();
    let mut sorted_operator = operator_order.clone();
    sorted_operator.sort();
    if chart_order != operator_order
        && sorted_chart == sorted_operator
        && plugins_only(&chart_order) == plugins_only(&operator_order)
    {
        operator.insert("initContainers order".into(), json!(chart_order));
        applied.push(DELIBERATE_DIFFERENCES[0].0);
    }
    // v1-config-as-plugin-config-env: one PLUGIN_CONFIG, last, on a v1 sidecar
    for (key, container) in operator.iter_mut() {
        if !key.starts_with("containers[") {
            continue;
        }
        let Some(env) = container["env"].as_array_mut() else {
            continue;
        };
        if env.last().is_some_and(|e| e["name"] == "PLUGIN_CONFIG")
            && env.iter().filter(|e| e["name"] == "PLUGIN_CONFIG").count() == 1
        {
            env.pop();
            applied.push(DELIBERATE_DIFFERENCES[1].0);
        }
    }
    applied
}

/// `helm template my-vcluster <vCluster chart> -n <namespace> [-f <values>]`
/// ([`vcp_tests::render_vcluster_chart_from`]) with the chart of vCluster `version`: the
/// documents, or helm's error.
fn render(version: &str, namespace: &str, values: Option<&PathBuf>) -> Result<Vec<Value>, String> {
    let text = values
        .map(|v| std::fs::read_to_string(v).expect("values file"))
        .unwrap_or_default();
    let chart = vcp_tests::oracle_path_at("VCLUSTER_CHART", version);
    let rendered = vcp_tests::render_vcluster_chart_from(chart, namespace, &text)
        .map_err(|e| format!("{e:#}"))?;
    Ok(serde_yaml::Deserializer::from_str(&rendered)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("helm renders valid YAML"))
        .filter_map(|doc| serde_json::to_value(doc).ok())
        .filter(|doc| !doc.is_null())
        .collect())
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn to_yaml(docs: &[&Value]) -> String {
    docs.iter()
        .map(|d| serde_yaml::to_string(d).expect("yaml"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Names of the entries of a list of named objects.
fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str().map(str::to_string))
        .collect()
}

/// The entries of `list` whose name is not in `base`, by name.
fn added(list: &Value, base: &[String]) -> BTreeMap<String, Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e.clone())))
        .filter(|(name, _)| !base.contains(name))
        .collect()
}

/// The plugin parts of a pod template: what it has beyond the chart's rendering without
/// plugins (`base`, a pod spec).
fn plugin_parts(spec: &Value, base: &Value) -> BTreeMap<String, Value> {
    let syncer = |s: &Value| {
        s["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == "syncer")
            .cloned()
            .unwrap_or(Value::Null)
    };
    let mut parts = BTreeMap::new();
    for (field, list) in [
        ("initContainers", "initContainers"),
        ("containers", "containers"),
        ("volumes", "volumes"),
    ] {
        for (name, entry) in added(&spec[list], &names(&base[list])) {
            parts.insert(format!("{field}[{name}]"), entry);
        }
    }
    for list in ["volumeMounts", "env"] {
        for (name, entry) in added(&syncer(spec)[list], &names(&syncer(base)[list])) {
            parts.insert(format!("syncer.{list}[{name}]"), entry);
        }
    }
    parts.insert(
        "initContainers order".into(),
        json!(names(&spec["initContainers"])),
    );
    parts
}

/// Leaf differences between two JSON values, as `path: chart → operator`.
fn diff(path: &str, chart: &Value, operator: &Value, out: &mut Vec<(String, String)>) {
    match (chart, operator) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                diff(
                    &format!("{path}.{key}"),
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if chart != operator => out.push((path.to_string(), format!("{chart} → {operator}"))),
        _ => {}
    }
}

/// A rule with empty fields left out and lists sorted, for comparing rule sets.
fn normalized_rules(rules: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = rules
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let mut r = r.as_object().cloned().unwrap_or_default();
            r.retain(|_, v| !(v.is_null() || v.as_array().is_some_and(|a| a.is_empty())));
            Value::Object(r)
        })
        .collect();
    out.sort_by_key(|r| r.to_string());
    out
}

/// The rules of `with` that `without` does not have.
fn added_rules(with: &Value, without: &Value) -> Vec<Value> {
    let base = normalized_rules(without);
    normalized_rules(with)
        .into_iter()
        .filter(|r| !base.contains(r))
        .collect()
}

async fn namespace(admin: &Client, name: &str) {
    vcp_tests::create_namespace(admin, name).await;
}

async fn live_pod_spec(admin: &Client, namespace: &str) -> Value {
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), namespace)
        .get("my-vcluster")
        .await
        .expect("the StatefulSet");
    serde_json::to_value(sts.spec.expect("spec").template.spec.expect("pod spec")).expect("json")
}

/// Every difference between vCluster `version`'s chart's and the operator's install of `values`
/// (`case`).
async fn differences(admin: &Client, version: &str, case: &str, values: &PathBuf) -> Outcome {
    let tag = version.replace('.', "");
    let chart_ns = format!("chart-{case}-{tag}");
    let operator_ns = format!("op-{case}-{tag}");
    let with = render(version, &chart_ns, Some(values))
        .unwrap_or_else(|e| panic!("{version} {case}: {e}"));
    let without_chart_ns = render(version, &chart_ns, None).expect("render without plugins");
    let without = render(version, &operator_ns, None).expect("render without plugins");

    // (a) the chart with the plugin values
    namespace(admin, &chart_ns).await;
    let sts = find(&with, "StatefulSet", "my-vcluster").expect("chart StatefulSet");
    apply_yaml(admin, &to_yaml(&[sts]), Some(&chart_ns))
        .await
        .expect("apply the chart's StatefulSet");
    let chart_spec = live_pod_spec(admin, &chart_ns).await;

    // (b) the chart without them, and the operator's install of `import`'s VClusterPlugins
    namespace(admin, &operator_ns).await;
    let docs: Vec<&Value> = without
        .iter()
        .filter(|d| d["kind"] != "Secret" || d["metadata"]["name"] != "")
        .collect();
    apply_yaml(admin, &to_yaml(&docs), Some(&operator_ns))
        .await
        .expect("apply the chart without plugins");
    let text = std::fs::read_to_string(values).expect("values");
    let imported = vcluster_plugin_operator::import::import(&text, "my-vcluster", &operator_ns)
        .expect("import");
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), &operator_ns);
    for plugin in &imported.plugins {
        plugins
            .patch(
                &plugin.name_any(),
                &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                &Patch::Apply(plugin),
            )
            .await
            .expect("apply the imported VClusterPlugin");
    }
    let mut out = Outcome::default();
    for plugin in &imported.plugins {
        let name = plugin.name_any();
        let api = plugins.clone();
        let ready = wait_for(TIMEOUT, || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let p = api.get(&name).await.ok()?;
                let status = p.status.clone()?;
                (status.observed_generation == p.metadata.generation).then_some(())?;
                let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
                (ready.status != "Unknown").then(|| {
                    (
                        ready.status.clone(),
                        ready.reason.clone(),
                        ready.message.clone(),
                    )
                })
            }
        })
        .await;
        if ready.0 != "True" {
            out.differences.push((
                format!("plugin {name}"),
                format!("not installed: {} {}", ready.1, ready.2),
            ));
        }
    }
    let operator_spec = live_pod_spec(admin, &operator_ns).await;

    // the pod template's plugin parts
    let base_chart = &find(&without_chart_ns, "StatefulSet", "my-vcluster").expect("sts")["spec"]["template"]
        ["spec"];
    let base_operator =
        &find(&without, "StatefulSet", "my-vcluster").expect("sts")["spec"]["template"]["spec"];
    let chart_parts = plugin_parts(&chart_spec, base_chart);
    let mut operator_parts = plugin_parts(&operator_spec, base_operator);
    for name in apply_deliberate(&chart_parts, &mut operator_parts) {
        out.deliberate.push(name);
    }
    out.fields += chart_parts.values().map(leaves).sum::<usize>();
    for key in chart_parts.keys().chain(
        operator_parts
            .keys()
            .filter(|k| !chart_parts.contains_key(*k)),
    ) {
        diff(
            key,
            chart_parts.get(key).unwrap_or(&Value::Null),
            operator_parts.get(key).unwrap_or(&Value::Null),
            &mut out.differences,
        );
    }

    // the rules granted: the chart's Role / ClusterRole rules added by the values against the
    // operator's Roles / ClusterRoles of these plugins
    let role_name = "vc-my-vcluster";
    let cluster_role = |ns: &str| format!("vc-my-vcluster-v-{ns}");
    let chart_role = added_rules(
        &find(&with, "Role", role_name)
            .map(|r| r["rules"].clone())
            .unwrap_or(Value::Null),
        &find(&without_chart_ns, "Role", role_name)
            .map(|r| r["rules"].clone())
            .unwrap_or(Value::Null),
    );
    let chart_cluster_role = added_rules(
        &find(&with, "ClusterRole", &cluster_role(&chart_ns))
            .map(|r| r["rules"].clone())
            .unwrap_or(Value::Null),
        &find(&without_chart_ns, "ClusterRole", &cluster_role(&chart_ns))
            .map(|r| r["rules"].clone())
            .unwrap_or(Value::Null),
    );
    let roles = Api::<Role>::namespaced(admin.clone(), &operator_ns)
        .list(&ListParams::default().labels(PLUGIN_NAME_LABEL))
        .await
        .expect("list Roles");
    let operator_role: Vec<Value> = roles
        .items
        .iter()
        .flat_map(|r| normalized_rules(&json!(r.rules)))
        .collect();
    let cluster_roles = Api::<ClusterRole>::all(admin.clone())
        .list(&ListParams::default().labels(&format!("{PLUGIN_NAMESPACE_LABEL}={operator_ns}")))
        .await
        .expect("list ClusterRoles");
    let operator_cluster_role: Vec<Value> = cluster_roles
        .items
        .iter()
        .flat_map(|r| normalized_rules(&json!(r.rules)))
        .collect();
    let sorted = |mut v: Vec<Value>| {
        v.sort_by_key(|r| r.to_string());
        json!(v)
    };
    out.fields += leaves(&json!(chart_role)) + leaves(&json!(chart_cluster_role));
    diff(
        "Role rules",
        &sorted(chart_role),
        &sorted(operator_role),
        &mut out.differences,
    );
    diff(
        "ClusterRole rules",
        &sorted(chart_cluster_role),
        &sorted(operator_cluster_role),
        &mut out.differences,
    );
    out
}

/// Number of leaf values of a JSON value (fields compared).
fn leaves(value: &Value) -> usize {
    match value {
        Value::Object(m) => m.values().map(leaves).sum(),
        Value::Array(a) => a.iter().map(leaves).sum(),
        _ => 1,
    }
}

/// What one case found.
#[derive(Default)]
struct Outcome {
    /// `(path, chart → operator)` of every difference not explained by a deliberate one.
    differences: Vec<(String, String)>,
    /// Deliberate differences that occurred.
    deliberate: Vec<&'static str>,
    /// Leaf fields of the chart's plugin parts and rules compared.
    fields: usize,
}

/// Every vCluster version of the matrix ([`vcp_tests::VCLUSTER_VERSIONS`]), its own chart against
/// the same operator and the same values files.
#[tokio::test]
async fn operator_installs_what_the_vcluster_chart_renders() {
    let admin = vcp_tests::start_shared_operator(RUNTIME_IMAGE).await;
    for (version, _) in vcp_tests::VCLUSTER_VERSIONS {
        chart_matches(&admin, version).await;
    }
}

async fn chart_matches(admin: &Client, version: &str) {
    let tag = version.replace('.', "");
    let fixtures = repo_root().join("tests/fixtures/chart-oracle");

    // The tutorial's values as published are refused by the v0.30 chart's values schema.
    let refused = render(
        version,
        &format!("tutorial-{tag}"),
        Some(&repo_root().join("tests/fixtures/import/plugin.yaml")),
    )
    .expect_err("the chart's schema refuses rbac.clusterRole.create");
    assert!(
        refused.contains("additional properties 'create' not allowed"),
        "{refused}"
    );

    // Its schema also refuses `env` under `plugins:` (a v2 plugin's init container gets none);
    // `import` drops it with a warning instead of installing what the chart never renders.
    let env_values = fixtures.join("env.yaml");
    let refused = render(version, &format!("env-{tag}"), Some(&env_values))
        .expect_err("the chart's schema refuses env");
    assert!(
        refused.contains("'/plugins/gamma': additional properties 'env' not allowed"),
        "{refused}"
    );
    let imported = vcluster_plugin_operator::import::import(
        &std::fs::read_to_string(&env_values).expect("env.yaml"),
        "my-vcluster",
        "ns",
    )
    .expect("import");
    assert_eq!(imported.plugins[0].spec.env, None);
    assert!(
        imported
            .warnings
            .iter()
            .any(|w| w.path == "plugins.gamma.env"),
        "{:?}",
        imported.warnings
    );

    let mut unexplained = Vec::new();
    let mut applied: BTreeMap<&str, usize> = BTreeMap::new();
    let mut fields = 0;
    for case in ["tutorial", "legacy", "several"] {
        let values = fixtures.join(format!("{case}.yaml"));
        let outcome = differences(admin, version, case, &values).await;
        for name in &outcome.deliberate {
            *applied.entry(name).or_default() += 1;
            eprintln!("oracle_chart: {version} {case}: deliberate difference {name}");
        }
        for (path, change) in outcome.differences {
            unexplained.push(format!("{version} {case}: {path}: {change}"));
        }
        eprintln!(
            "oracle_chart: {version} {case}: {} fields of the chart's plugin parts and rules compared",
            outcome.fields
        );
        fields += outcome.fields;
    }
    assert!(
        unexplained.is_empty(),
        "the operator's install differs from vCluster {version}'s chart:\n{}",
        unexplained.join("\n")
    );
    for (name, why) in DELIBERATE_DIFFERENCES {
        assert!(
            applied.contains_key(name),
            "deliberate difference {name} ({why}) never occurred at {version}: remove it"
        );
    }
    println!(
        "oracle_chart: {fields} fields identical to vCluster {version}'s chart (3 values files)"
    );
}
