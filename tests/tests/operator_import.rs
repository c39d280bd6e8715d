//! `vcluster-plugin-operator import` end to end: the tutorial's `plugin.yaml` and a legacy v1
//! values file, converted by the same function the binary calls (the binary's own stdout,
//! stderr and exit code are checked in `operator/tests/cli.rs`, where cargo provides its path),
//! are accepted by the host API server with exactly the expected spec.
//!
//! The plugins are applied in a namespace without a vCluster workload: the test is about the
//! manifests, not the operator (which is not running here).
//!
//! The `vcluster.yaml` fixtures (`*.vcluster.yaml`, `sync.*.customResources`) are first read by
//! vCluster's own config parser (the `config-oracle` of `tests/vcluster-go`:
//! `pkg/config.ParseConfigBytes` over the chart's default values): it accepts each, and what it
//! reads (patches, mappings) is what the import carries over. Their kinds and versions come from
//! the host API server's discovery, with stand-ins of cert-manager's CRDs installed
//! (`tests/fixtures/import/cert-manager-crds.yaml`).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::Api;
use serde_json::{Value, json};
use vcluster_plugin_operator::import::{
    ImportOptions, custom_resource_keys, import, import_with, resolve::resolve,
};
use vcp_crds::{PluginVersion, PullPolicy, SyncDirection, VClusterPlugin};
use vcp_tests::{
    Cluster, ControlPlane, Identity, apply_yaml, create_namespace, install_crds, oracle_paths,
    repo_root, wait_for, workspace_binary,
};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("tests/fixtures/import").join(name))
        .unwrap_or_else(|e| panic!("read fixture {name}: {e}"))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn tutorial_plugin_yaml_is_accepted_with_its_spec() {
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    install_crds(&client).await;
    let ns = "import-tutorial";
    create_namespace(&client, ns).await;

    let out = import(&fixture("plugin.yaml"), "my-vcluster", ns).expect("import the tutorial");
    let applied = apply_yaml(&client, &out.yaml, None)
        .await
        .expect("the API server accepts the imported manifests");
    assert_eq!(applied.len(), 1);

    let api: Api<VClusterPlugin> = Api::namespaced(client, ns);
    let p = api.get("crd-sync").await.expect("get crd-sync");
    assert_eq!(p.spec.vcluster.name, "my-vcluster");
    assert_eq!(
        p.spec.image.as_deref(),
        Some("ghcr.io/loft-sh/vcluster-example-crd-sync:v3")
    );
    assert_eq!(p.spec.version, Some(PluginVersion::V2));
    assert_eq!(p.spec.image_pull_policy, Some(PullPolicy::IfNotPresent));
    assert!(p.spec.synced_types.is_empty() && p.spec.hooks.is_empty());
    assert_eq!(p.spec.config, None);
    let rbac = p.spec.rbac.as_ref().expect("rbac");
    assert_eq!(
        rbac.role.as_ref().expect("role").extra_rules,
        vec![PolicyRule {
            api_groups: Some(strings(&["example.loft.sh"])),
            resources: Some(strings(&["cars"])),
            verbs: strings(&[
                "create", "delete", "patch", "update", "get", "list", "watch"
            ]),
            ..Default::default()
        }]
    );
    assert_eq!(
        rbac.cluster_role.as_ref().expect("clusterRole").extra_rules,
        vec![PolicyRule {
            api_groups: Some(strings(&["apiextensions.k8s.io"])),
            resources: Some(strings(&["customresourcedefinitions"])),
            verbs: strings(&["get", "list", "watch"]),
            ..Default::default()
        }]
    );
    // What the server stored is what import produced (no field dropped or defaulted away).
    assert_eq!(
        serde_json::to_value(&p.spec).expect("spec"),
        serde_json::to_value(&out.plugins[0].spec).expect("spec")
    );
}

#[tokio::test]
async fn legacy_v1_values_are_accepted_with_config_and_container_fields() {
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    install_crds(&client).await;
    let ns = "import-legacy";
    create_namespace(&client, ns).await;

    let out = import(&fixture("legacy-v1.yaml"), "old-vcluster", ns).expect("import legacy");
    apply_yaml(&client, &out.yaml, None).await.expect(
        "the API server accepts the imported manifests (v1 with config passes the CEL rule)",
    );

    let api: Api<VClusterPlugin> = Api::namespaced(client, ns);
    for want in &out.plugins {
        let name = want.metadata.name.as_deref().expect("name");
        let have = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get {name}: {e}"));
        assert_eq!(
            serde_json::to_value(&have.spec).expect("spec"),
            serde_json::to_value(&want.spec).expect("spec"),
            "{name}"
        );
    }
    let car = api.get("car-sync").await.expect("car-sync");
    assert_eq!(car.spec.version, Some(PluginVersion::V1));
    assert_eq!(
        car.spec.config,
        Some(serde_json::json!({"brands": ["BMW", "Tesla"], "seats": {"max": 7}}))
    );
    assert_eq!(car.spec.env.as_ref().expect("env")[0].name, "SYNC_INTERVAL");
    let pods = api.get("pod-labels").await.expect("pod-labels");
    assert_eq!(pods.spec.version, Some(PluginVersion::V2));
}

/// vCluster's own config parser on each text of `texts`: its answer (`toHost`, `fromHost`,
/// `proFeature`, or `error`), in order.
fn vcluster_reads(texts: &[&str]) -> Vec<Value> {
    let requests: Vec<String> = texts
        .iter()
        .map(|text| json!({"yaml": text, "name": "my-vcluster"}).to_string())
        .collect();
    vcp_tests::json_lines_oracle(&oracle_paths()["CONFIG_ORACLE"], "config-oracle", &requests)
}

/// Installs the stand-ins of cert-manager's CRDs and waits until the host's discovery serves
/// every key of `keys`; returns what it serves.
async fn host_serves(
    client: &kube::Client,
    keys: &[String],
) -> BTreeMap<String, vcluster_plugin_operator::import::ResolvedType> {
    install_crds(client).await;
    apply_yaml(client, &fixture("cert-manager-crds.yaml"), None)
        .await
        .expect("the stand-in CRDs");
    wait_for(Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            let found = resolve(client, keys).await.ok()?;
            (found.len() == keys.len()).then_some(found)
        }
    })
    .await
}

/// vCluster's parser accepts each fixture the import reads, as a feature of its paid build
/// (`proFeature`: the open-source build refuses it, which the README says); the patches and
/// mappings it reads are those the import carries over (for the host namespace
/// `vcluster-prod`: another namespace's mapping entry dropped), and each entry it reads as enabled, namespaced and not a subresource is imported.
#[tokio::test]
async fn vclusters_own_parser_reads_what_import_carries_over() {
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    let names = ["cert-manager.vcluster.yaml", "mixed.vcluster.yaml"];
    let texts: Vec<String> = names.iter().map(|n| fixture(n)).collect();
    let answers = vcluster_reads(&texts.iter().map(String::as_str).collect::<Vec<_>>());
    let mut all_keys: Vec<String> = Vec::new();
    for text in &texts {
        all_keys.extend(custom_resource_keys(text).expect("keys"));
    }
    all_keys.sort();
    all_keys.dedup();
    let served = host_serves(&client, &all_keys).await;
    let ns = "vcluster-prod";
    for ((name, text), answer) in names.iter().zip(&texts).zip(&answers) {
        assert!(
            answer.get("error").is_none(),
            "vCluster refuses {name}: {answer}"
        );
        assert_eq!(answer["proFeature"], true, "{name}: {answer}");
        let out = import_with(
            text,
            "my-vcluster",
            ns,
            &ImportOptions {
                resolved: Some(served.clone()),
                name: None,
            },
        )
        .unwrap_or_else(|e| panic!("import {name}: {e}"));
        let plugin = out.plugins.last().expect("the custom-resources plugin");
        let mut carried = 0;
        for (direction, block) in [
            ("toHost", &answer["toHost"]),
            ("fromHost", &answer["fromHost"]),
        ] {
            for (key, entry) in block.as_object().into_iter().flatten() {
                let enabled = entry["enabled"] == true;
                let scope = entry["scope"].as_str().unwrap_or("Namespaced");
                let Some(t) = plugin.spec.synced_types.iter().find(|t| {
                    let group = t.api_version.rsplit_once('/').map_or("", |(g, _)| g);
                    format!("{}.{group}", t.resource.as_deref().unwrap_or_default()) == *key
                        && t.direction
                            == if direction == "toHost" {
                                SyncDirection::ToHost
                            } else {
                                SyncDirection::FromHost
                            }
                }) else {
                    assert!(
                        !enabled || scope == "Cluster" || key.contains('/'),
                        "{name}: {direction} {key} is enabled in vCluster's reading but not imported"
                    );
                    continue;
                };
                carried += 1;
                assert!(enabled, "{name}: {key}");
                // Patches: vCluster's reading, field for field.
                let want = entry["patches"].as_array().cloned().unwrap_or_default();
                assert_eq!(
                    serde_json::to_value(&t.patches).expect("patches"),
                    Value::Array(want),
                    "{name}: {direction} {key}"
                );
                // Mappings.
                let want: BTreeMap<String, String> = entry["mappings"]["byName"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(host, _)| {
                        host.is_empty()
                            || host.starts_with('/')
                            || host.starts_with(&format!("{ns}/"))
                    })
                    .map(|(host, virt)| {
                        (host.clone(), virt.as_str().expect("a string").to_string())
                    })
                    .collect();
                assert_eq!(
                    t.mappings
                        .as_ref()
                        .map(|m| m.by_name.clone())
                        .unwrap_or_default(),
                    want,
                    "{name}: {direction} {key}"
                );
            }
        }
        assert_eq!(
            carried,
            plugin.spec.synced_types.len(),
            "{name}: every imported type is read by vCluster"
        );
    }

    // What the import's warnings say vCluster refuses, vCluster refuses.
    let entry = |body: &str| {
        format!(
            "sync:\n  toHost:\n    customResources:\n      cars.example.loft.sh:\n        enabled: true\n{body}"
        )
    };
    let refused = [
        (entry("        bogus: 1\n"), "unknown field"),
        (
            entry(
                "        patches:\n          - path: a\n            labels: {}\n            note: x\n",
            ),
            "unknown field",
        ),
        (
            entry("        scope: Cluster\n"),
            "Only 'Namespaced' is allowed",
        ),
        (
            entry("        patches:\n          - path: a\n"),
            "need to use one of",
        ),
        (
            entry(
                "        patches:\n          - path: a\n            expression: x\n            labels: {}\n",
            ),
            "can only use one of",
        ),
        (
            entry(
                "        patches:\n          - path: a\n            labels: {}\n          - path: a\n            expression: x\n",
            ),
            "have the same path",
        ),
    ];
    let answers = vcluster_reads(&refused.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>());
    for ((text, says), answer) in refused.iter().zip(&answers) {
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{text}: vCluster's answer {answer}");
    }
}

/// The binary, as a user runs it: `import --kubeconfig <host>` reads the kinds and versions of
/// the cert-manager fixture from the host's discovery, prints the note about the produced Secret
/// on stderr, and writes the plugin of the cert-manager example, which the API server
/// accepts unchanged; without `--kubeconfig` it refuses, naming both entries.
#[tokio::test]
async fn cert_manager_vcluster_yaml_imports_into_the_example_plugin() {
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    let keys = custom_resource_keys(&fixture("cert-manager.vcluster.yaml")).expect("keys");
    host_serves(&client, &keys).await;
    let ns = "import-cert-manager";
    create_namespace(&client, ns).await;

    let binary = workspace_binary("vcluster-plugin-operator", "vcluster-plugin-operator");
    let run = |extra: &[&str]| {
        Command::new(&binary)
            .args([
                "import",
                "-f",
                "tests/fixtures/import/cert-manager.vcluster.yaml",
                "--vcluster",
                "my-vcluster",
                "-n",
                ns,
                "--name",
                "cert-manager-sync",
            ])
            .args(extra)
            .current_dir(repo_root())
            .env_remove("KUBECONFIG")
            .output()
            .expect("run the operator binary")
    };
    let kubeconfig = cp.kubeconfig(Cluster::Host, Identity::Admin);
    let out = run(&["--kubeconfig", kubeconfig.to_str().expect("UTF-8 path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("note: tests/fixtures/import/cert-manager.vcluster.yaml: sync.toHost.customResources[\"certificates.cert-manager.io\"]: added `produced"),
        "{stderr}"
    );
    assert!(!stderr.contains("warning:"), "{stderr}");
    let yaml = String::from_utf8(out.stdout).expect("UTF-8");
    apply_yaml(&client, &yaml, None)
        .await
        .expect("the API server accepts the imported plugin");

    let api: Api<VClusterPlugin> = Api::namespaced(client, ns);
    let p = api.get("cert-manager-sync").await.expect("get");
    // The cert-manager example, written out here, not derived from import.
    assert_eq!(
        serde_json::to_value(&p.spec).expect("spec"),
        json!({
            "vcluster": {"name": "my-vcluster"},
            "syncedTypes": [
                {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "resource": "issuers",
                 "direction": "ToHost", "syncStatus": true,
                 "patches": [
                     {"path": "spec", "expression": "({selfSigned: value.selfSigned, ca: value.ca})"},
                     {"path": "spec.ca.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}}
                 ]},
                {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "resource": "certificates",
                 "direction": "ToHost", "syncStatus": true,
                 "patches": [
                     {"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}},
                     {"path": "spec.issuerRef.name", "reference": {"apiVersion": "cert-manager.io/v1", "kind": "Issuer"}}
                 ],
                 "produced": [{"apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName"}]}
            ]
        })
    );

    let out = run(&[]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sync.toHost.customResources[\"issuers.cert-manager.io\"], sync.toHost.customResources[\"certificates.cert-manager.io\"]: the kind and version")
            && stderr.contains("--kubeconfig"),
        "{stderr}"
    );
}

/// The mixed fixture, imported with the host's answers, is accepted by the API server (the
/// CRD's schema and CEL rules hold for every type, patch and mapping it carries over).
#[tokio::test]
async fn mixed_vcluster_yaml_is_accepted() {
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    let text = fixture("mixed.vcluster.yaml");
    let served = host_serves(&client, &custom_resource_keys(&text).expect("keys")).await;
    let ns = "vcluster-prod";
    create_namespace(&client, ns).await;
    let out = import_with(
        &text,
        "prod",
        ns,
        &ImportOptions {
            resolved: Some(served),
            name: None,
        },
    )
    .expect("import");
    apply_yaml(&client, &out.yaml, None)
        .await
        .expect("the API server accepts the imported manifests");
    let api: Api<VClusterPlugin> = Api::namespaced(client, ns);
    for want in &out.plugins {
        let name = want.metadata.name.as_deref().expect("name");
        let have = api.get(name).await.expect("get");
        assert_eq!(
            serde_json::to_value(&have.spec).expect("spec"),
            serde_json::to_value(&want.spec).expect("spec"),
            "{name}"
        );
    }
    // The import without the host refuses the same file.
    assert!(import(&text, "prod", ns).is_err());
}
