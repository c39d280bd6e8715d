use super::*;
use serde_json::json;

const TUTORIAL: &str = include_str!("../../../tests/fixtures/import/plugin.yaml");
const LEGACY: &str = include_str!("../../../tests/fixtures/import/legacy-v1.yaml");

fn ok(text: &str) -> Imported {
    import(text, "my-vcluster", "team-a").unwrap_or_else(|e| panic!("import failed: {e}"))
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(s(groups)),
        resources: Some(s(resources)),
        verbs: s(verbs),
        ..Default::default()
    }
}

fn paths(out: &Imported) -> Vec<&str> {
    out.warnings.iter().map(|w| w.path.as_str()).collect()
}

#[test]
fn tutorial_plugin_yaml_becomes_one_v2_plugin_with_its_rules() {
    let out = ok(TUTORIAL);
    assert_eq!(out.plugins.len(), 1);
    let p = &out.plugins[0];
    assert_eq!(p.metadata.name.as_deref(), Some("crd-sync"));
    assert_eq!(p.metadata.namespace.as_deref(), Some("team-a"));
    let want = VClusterPluginSpec {
        vcluster: VClusterRef {
            name: "my-vcluster".into(),
        },
        image: Some("ghcr.io/loft-sh/vcluster-example-crd-sync:v3".into()),
        version: Some(PluginVersion::V2),
        image_pull_policy: Some(PullPolicy::IfNotPresent),
        rbac: Some(PluginRbac {
            role: Some(RoleRules {
                extra_rules: vec![rule(
                    &["example.loft.sh"],
                    &["cars"],
                    &[
                        "create", "delete", "patch", "update", "get", "list", "watch",
                    ],
                )],
            }),
            cluster_role: Some(RoleRules {
                extra_rules: vec![rule(
                    &["apiextensions.k8s.io"],
                    &["customresourcedefinitions"],
                    &["get", "list", "watch"],
                )],
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(p.spec, want);
    // The top-level `rbac:` is the vCluster's own setting: named, not silently dropped.
    assert_eq!(paths(&out), vec!["rbac"]);
}

#[test]
fn output_is_the_plugins_as_yaml_documents() {
    let out = ok(LEGACY);
    let docs: Vec<VClusterPlugin> = serde_yaml::Deserializer::from_str(&out.yaml)
        .map(|d| VClusterPlugin::deserialize(d).expect("a VClusterPlugin document"))
        .collect();
    let json = |p: &[VClusterPlugin]| serde_json::to_value(p).expect("as JSON");
    assert_eq!(json(&docs), json(&out.plugins));
    let first: serde_json::Value =
        serde_yaml::from_str(out.yaml.split("---\n").next().unwrap()).expect("first document");
    assert_eq!(first["apiVersion"], "vcp.dev/v1alpha1");
    assert_eq!(first["kind"], "VClusterPlugin");
    assert_eq!(
        first["metadata"],
        json!({"name": "car-sync", "namespace": "team-a"})
    );
    assert!(first.get("status").is_none(), "{first}");
}

use serde::Deserialize as _;

#[test]
fn legacy_map_without_version_is_v1_with_container_fields_and_config() {
    let out = ok(LEGACY);
    let names: Vec<_> = out
        .plugins
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["car-sync", "pod-labels"], "file order");
    let car = &out.plugins[0].spec;
    assert_eq!(car.version, Some(PluginVersion::V1));
    assert_eq!(car.image_pull_policy, Some(PullPolicy::Always));
    assert_eq!(
        car.args.as_deref(),
        Some(&["--log-level".to_string(), "debug".to_string()][..])
    );
    let env = car.env.as_ref().expect("env");
    assert_eq!(env[0].name, "SYNC_INTERVAL");
    assert_eq!(env[0].value.as_deref(), Some("30s"));
    let res = car.resources.as_ref().expect("resources");
    assert_eq!(res.limits.as_ref().unwrap()["memory"].0, "256Mi");
    assert_eq!(res.requests.as_ref().unwrap()["cpu"].0, "50m");
    let sc = car.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        car.config,
        Some(json!({"brands": ["BMW", "Tesla"], "seats": {"max": 7}}))
    );
    let role = car.rbac.as_ref().unwrap().role.as_ref().unwrap();
    assert_eq!(
        role.extra_rules[0].resources.as_deref(),
        Some(&["cars".to_string()][..])
    );
    assert!(car.rbac.as_ref().unwrap().cluster_role.is_none());

    let pods = &out.plugins[1].spec;
    assert_eq!(pods.version, Some(PluginVersion::V2));
    assert_eq!(
        pods.command.as_deref(),
        Some(&["/plugin/pod-labels".to_string()][..])
    );
    assert!(pods.rbac.is_none());
    assert_eq!(paths(&out), vec!["plugin.car-sync.livenessProbe"]);
    assert!(
        out.warnings[0].message.contains("not supported"),
        "{:?}",
        out.warnings
    );
}

#[test]
fn unknown_keys_are_named_with_their_full_path() {
    let out = ok(
        "plugin:\n  crd-sync:\n    image: a:1\n    foo: 1\n    rbac:\n      role:\n        extraRules: []\n        bar: x\n      baz: {}\nplugins:\n  other:\n    image: b:1\n    imagePullPolicy: Never\n    qux: [1]\ncontrolPlane:\n  distro: {}\n",
    );
    assert_eq!(
        paths(&out),
        vec![
            "plugin.crd-sync.foo",
            "plugin.crd-sync.rbac.role.bar",
            "plugin.crd-sync.rbac.baz",
            "plugins.other.qux",
            "controlPlane",
        ]
    );
    assert_eq!(out.plugins.len(), 2);
    // An empty rule list grants nothing: no rbac at all.
    assert!(out.plugins[0].spec.rbac.is_none());
    assert_eq!(
        out.warnings[0].to_string(),
        "plugin.crd-sync.foo: unknown plugin key; ignored"
    );
}

#[test]
fn malformed_yaml_reports_line_and_column() {
    let err = import("plugins:\n  crd-sync:\n    image: [unclosed\n", "v", "ns").unwrap_err();
    match &err {
        ImportError::Yaml {
            line,
            column,
            message,
        } => {
            assert!(*line >= 3, "line {line}");
            assert!(*column >= 1, "column {column}");
            assert!(!message.contains(" at line "), "{message}");
        }
        other => panic!("expected a YAML error, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.starts_with("malformed YAML at line "), "{text}");

    let err = import("plugins:\n  a:\n    image: x\n   bad: indent\n", "v", "ns").unwrap_err();
    assert!(matches!(err, ImportError::Yaml { line: 4, .. }), "{err:?}");
    let err = import("plugins:\n  a: {image: x}\n  a: {image: y}\n", "v", "ns").unwrap_err();
    assert!(
        matches!(&err, ImportError::Yaml { line: 2, message, .. } if message.contains("duplicate entry with key \"a\"")),
        "duplicate key: {err:?}"
    );
}

#[test]
fn wrong_types_name_the_value() {
    let cases = [
        (
            "plugin:\n  a:\n    image: x\n    env: nope\n",
            "plugin.a.env",
        ),
        (
            "plugins:\n  a:\n    image: x\n    imagePullPolicy: Sometimes\n",
            "plugins.a.imagePullPolicy",
        ),
        ("plugins:\n  a:\n    image: [x]\n", "plugins.a.image"),
        (
            "plugins:\n  a:\n    image: x\n    rbac:\n      role:\n        extraRules: {}\n",
            "plugins.a.rbac.role.extraRules",
        ),
        (
            "plugins:\n  a:\n    image: x\n    rbac: yes\n",
            "plugins.a.rbac",
        ),
        (
            "plugin:\n  a:\n    image: x\n    config: just-text\n",
            "plugin.a.config",
        ),
        ("plugins:\n  a: 3\n", "plugins.a"),
        ("plugins: [a]\n", "plugins"),
    ];
    for (text, want) in cases {
        match import(text, "v", "ns") {
            Err(ImportError::Invalid { path, .. }) => assert_eq!(path, want, "{text}"),
            other => panic!("{text}: expected Invalid at {want}, got {other:?}"),
        }
    }
}

#[test]
fn nothing_to_import_is_an_error() {
    for text in [
        "",
        "controlPlane: {}\n",
        "plugins: {}\nplugin:\n",
        "plugins:\n  a:\n    config: {x: 1}\n",
    ] {
        assert_eq!(
            import(text, "v", "ns").unwrap_err(),
            ImportError::NoPlugins,
            "{text:?}"
        );
    }
    assert_eq!(
        import("- a\n", "v", "ns").unwrap_err(),
        ImportError::NotAMap("a list")
    );
}

#[test]
fn entry_without_image_is_skipped_with_a_warning() {
    let out = ok(
        "plugin:\n  settings-only:\n    version: v2\n    config: {x: 1}\n  real:\n    image: r:1\n    version: v2\n",
    );
    assert_eq!(out.plugins.len(), 1);
    assert_eq!(
        paths(&out),
        vec!["plugin.settings-only.config", "plugin.settings-only"]
    );
}

#[test]
fn v2_config_is_not_carried_over() {
    for text in [
        "plugin:\n  a:\n    version: v2\n    image: x\n    config: {k: v}\n",
        "plugins:\n  a:\n    image: x\n    config: {k: v}\n",
    ] {
        let out = ok(text);
        assert_eq!(out.plugins[0].spec.config, None, "{text}");
        assert_eq!(out.plugins[0].spec.version, Some(PluginVersion::V2));
        assert_eq!(out.warnings.len(), 1);
        assert!(out.warnings[0].path.ends_with(".a.config"));
        assert!(out.warnings[0].message.contains("vCluster's own values"));
    }
}

#[test]
fn versions_follow_the_chart() {
    let version = |text: &str| ok(text).plugins[0].spec.version;
    assert_eq!(
        version("plugin:\n  a:\n    image: x\n"),
        Some(PluginVersion::V1)
    );
    assert_eq!(
        version("plugin:\n  a:\n    image: x\n    version: v1\n"),
        Some(PluginVersion::V1)
    );
    assert_eq!(
        version("plugin:\n  a:\n    image: x\n    version: v2\n"),
        Some(PluginVersion::V2)
    );
    assert_eq!(
        version("plugins:\n  a:\n    image: x\n"),
        Some(PluginVersion::V2)
    );
    // Anything but `v2` under `plugin:` is a sidecar for the chart: said so.
    let out = ok("plugin:\n  a:\n    image: x\n    version: 2\n");
    assert_eq!(out.plugins[0].spec.version, Some(PluginVersion::V1));
    assert_eq!(paths(&out), vec!["plugin.a.version"]);
    let out = ok("plugins:\n  a:\n    image: x\n    version: v1\n");
    assert_eq!(out.plugins[0].spec.version, Some(PluginVersion::V2));
    assert_eq!(paths(&out), vec!["plugins.a.version"]);
}

#[test]
fn container_name_override_is_reported() {
    let out = ok("plugins:\n  a:\n    image: x\n    name: other\n");
    assert_eq!(paths(&out), vec!["plugins.a.name"]);
    assert!(
        ok("plugins:\n  a:\n    image: x\n    name: a\n")
            .warnings
            .is_empty()
    );
}

#[test]
fn same_name_in_both_maps_is_refused() {
    assert_eq!(
        import(
            "plugin:\n  a: {image: x}\nplugins:\n  a: {image: y}\n",
            "v",
            "ns"
        )
        .unwrap_err(),
        ImportError::Duplicate("a".into())
    );
}

#[test]
fn vcluster_and_namespace_are_applied_to_every_plugin() {
    let out = import(LEGACY, "prod", "vcluster-prod").expect("import");
    for p in &out.plugins {
        assert_eq!(p.spec.vcluster.name, "prod");
        assert_eq!(p.metadata.namespace.as_deref(), Some("vcluster-prod"));
    }
}

/// The v2 plugins' volume `plugins` is the operator's (the CRD refuses a plugin's own mount of
/// it): the chart's usual repetition of `plugins` at `/plugins` in a v2 entry, and any other
/// mount of it, are dropped, each with a warning naming the mount; other mounts are kept.
#[test]
fn mounts_of_the_plugins_volume_are_dropped_with_a_warning() {
    let out = ok(
        "plugins:\n  beta:\n    image: b:1\n    volumeMounts:\n      - {name: plugins, mountPath: /plugins}\n      - {name: data, mountPath: /data}\n  gamma:\n    image: g:1\n    volumeMounts:\n      - {name: plugins, mountPath: /plugins}\nplugin:\n  side:\n    image: s:1\n    volumeMounts:\n      - {name: plugins, mountPath: /x}\n",
    );
    let mounts = |name: &str| -> Option<Vec<(String, String)>> {
        let p = out
            .plugins
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .expect(name);
        p.spec.volume_mounts.as_ref().map(|ms| {
            ms.iter()
                .map(|m| (m.name.clone(), m.mount_path.clone()))
                .collect()
        })
    };
    assert_eq!(mounts("beta"), Some(vec![("data".into(), "/data".into())]));
    assert_eq!(mounts("gamma"), None);
    assert_eq!(mounts("side"), None);
    let mut warned: Vec<(String, String)> = out
        .warnings
        .iter()
        .map(|w| (w.path.clone(), w.message.clone()))
        .collect();
    warned.sort();
    let ours = "`plugins` at `/plugins`: vcluster-plugin-operator mounts it into every v2 init container itself; dropped";
    assert_eq!(
        warned,
        [
            ("plugin.side.volumeMounts[0]".to_string(), "`plugins` at `/x`: the volume of the v2 plugins' binaries, which vCluster's syncer runs, is mounted only by vcluster-plugin-operator's v2 init containers (at `/plugins`) and the syncer, and the VClusterPlugin schema refuses a plugin's own mount of it; dropped".to_string()),
            ("plugins.beta.volumeMounts[0]".to_string(), ours.to_string()),
            ("plugins.gamma.volumeMounts[0]".to_string(), ours.to_string()),
        ]
    );
}

// ---- sync.toHost.customResources / sync.fromHost.customResources (vcluster.yaml, v0.21+) ----

use std::collections::BTreeMap;
use vcp_crds::{
    FromHostMappings, ProducedObject, SyncDirection, SyncedType, TranslatePatch,
    TranslatePatchLabels, TranslatePatchReference,
};

const CERT_MANAGER: &str =
    include_str!("../../../tests/fixtures/import/cert-manager.vcluster.yaml");
const MIXED: &str = include_str!("../../../tests/fixtures/import/mixed.vcluster.yaml");

/// What a host serving cert-manager's CRDs (cert-manager.io/v1, namespaced, status subresource)
/// and the tutorial's Car answers in discovery.
fn host_types() -> BTreeMap<String, ResolvedType> {
    let t = |key: &str, api_version: &str, kind: &str, namespaced: bool| {
        (
            key.to_string(),
            ResolvedType {
                api_version: api_version.into(),
                kind: kind.into(),
                resource: key.split('.').next().unwrap().into(),
                namespaced,
                status_subresource: true,
            },
        )
    };
    [
        t(
            "issuers.cert-manager.io",
            "cert-manager.io/v1",
            "Issuer",
            true,
        ),
        t(
            "certificates.cert-manager.io",
            "cert-manager.io/v1",
            "Certificate",
            true,
        ),
        t(
            "clusterissuers.cert-manager.io",
            "cert-manager.io/v1",
            "ClusterIssuer",
            false,
        ),
        t("cars.example.loft.sh", "example.loft.sh/v1", "Car", true),
    ]
    .into_iter()
    .collect()
}

fn with_host(text: &str, namespace: &str) -> Result<Imported, ImportError> {
    import_with(
        text,
        "my-vcluster",
        namespace,
        &ImportOptions {
            resolved: Some(host_types()),
            name: None,
        },
    )
}

fn reference(api_version: &str, kind: &str) -> Option<TranslatePatchReference> {
    Some(TranslatePatchReference {
        api_version: api_version.into(),
        kind: kind.into(),
        ..Default::default()
    })
}

/// The fixture imports into the plugin of the cert-manager example: Issuer, and
/// Certificate with its two reference patches, `syncStatus`, and the produced Secret the import
/// adds for cert-manager's Certificate, said in a note.
#[test]
fn cert_manager_vcluster_yaml_becomes_the_example_plugin() {
    let out = with_host(CERT_MANAGER, "team-a").expect("import");
    assert_eq!(out.plugins.len(), 1);
    let p = &out.plugins[0];
    assert_eq!(p.metadata.name.as_deref(), Some(CUSTOM_RESOURCES_PLUGIN));
    assert_eq!(p.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(p.spec.vcluster.name, "my-vcluster");
    assert_eq!(p.spec.image, None, "the embedded runtime");
    let want = vec![
        SyncedType {
            api_version: "cert-manager.io/v1".into(),
            kind: "Issuer".into(),
            resource: Some("issuers".into()),
            direction: SyncDirection::ToHost,
            sync_status: true,
            patches: vec![
                TranslatePatch {
                    path: "spec".into(),
                    expression: Some("({selfSigned: value.selfSigned, ca: value.ca})".into()),
                    ..Default::default()
                },
                TranslatePatch {
                    path: "spec.ca.secretName".into(),
                    reference: reference("v1", "Secret"),
                    ..Default::default()
                },
            ],
            ..Default::default()
        },
        SyncedType {
            api_version: "cert-manager.io/v1".into(),
            kind: "Certificate".into(),
            resource: Some("certificates".into()),
            direction: SyncDirection::ToHost,
            sync_status: true,
            patches: vec![
                TranslatePatch {
                    path: "spec.secretName".into(),
                    reference: reference("v1", "Secret"),
                    ..Default::default()
                },
                TranslatePatch {
                    path: "spec.issuerRef.name".into(),
                    reference: reference("cert-manager.io/v1", "Issuer"),
                    ..Default::default()
                },
            ],
            produced: vec![ProducedObject {
                api_version: "v1".into(),
                kind: "Secret".into(),
                name_path: "spec.secretName".into(),
            }],
            ..Default::default()
        },
    ];
    assert_eq!(p.spec.synced_types, want);
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    let notes: Vec<&str> = out.notes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(
        notes,
        [
            "sync.toHost.customResources[\"certificates.cert-manager.io\"]",
            "sync.toHost.customResources",
        ]
    );
    assert!(
        out.notes[0].message.contains("added `produced"),
        "{}",
        out.notes[0]
    );
    assert!(
        out.notes[1].message.contains("paid build"),
        "{}",
        out.notes[1]
    );
}

#[test]
fn kind_and_version_need_the_host() {
    // No host asked: refused, naming every entry, and saying how to give the host.
    let err = import(CERT_MANAGER, "v", "ns").unwrap_err();
    assert_eq!(
        err,
        ImportError::Unresolved {
            paths: vec![
                "sync.toHost.customResources[\"issuers.cert-manager.io\"]".into(),
                "sync.toHost.customResources[\"certificates.cert-manager.io\"]".into(),
            ],
            asked: false,
        }
    );
    assert!(err.to_string().contains("--kubeconfig"), "{err}");
    // The host asked, and it serves neither.
    let err = import_with(
        CERT_MANAGER,
        "v",
        "ns",
        &ImportOptions {
            resolved: Some(BTreeMap::new()),
            name: None,
        },
    )
    .unwrap_err();
    assert!(
        matches!(&err, ImportError::Unresolved { paths, asked: true } if paths.len() == 2),
        "{err:?}"
    );
    assert!(err.to_string().contains("is its CRD installed"), "{err}");
    assert_eq!(
        custom_resource_keys(CERT_MANAGER).expect("keys"),
        ["certificates.cert-manager.io", "issuers.cert-manager.io"]
    );
    // Disabled entries and subresource keys are not asked for.
    assert_eq!(
        custom_resource_keys(MIXED).expect("keys"),
        [
            "cars.example.loft.sh",
            "clusterissuers.cert-manager.io",
            "issuers.cert-manager.io"
        ]
    );
}

/// Everything the mixed fixture cannot carry over is named by its full path; what it can is
/// carried over unchanged (vCluster's `""` and `/name` keys of its host namespace included).
#[test]
fn mixed_vcluster_yaml_names_what_is_not_carried_over() {
    let out = with_host(MIXED, "vcluster-prod").expect("import");
    assert_eq!(
        paths(&out),
        vec![
            "controlPlane",
            "sync.toHost.pods",
            "sync.toHost.customResources[\"widgets.example.com\"].enabled",
            "sync.toHost.customResources[\"cars/status.example.loft.sh\"]",
            "sync.fromHost.customResources[\"clusterissuers.cert-manager.io\"].scope",
            "sync.fromHost.customResources[\"issuers.cert-manager.io\"].mappings.byName[\"other/*\"]",
            "sync.fromHost.nodes",
        ]
    );
    let names: Vec<_> = out
        .plugins
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["pod-labels", CUSTOM_RESOURCES_PLUGIN]);
    let types = &out.plugins[1].spec.synced_types;
    assert_eq!(types.len(), 2);
    let car = &types[0];
    assert_eq!(
        (car.kind.as_str(), car.direction),
        ("Car", SyncDirection::ToHost)
    );
    assert!(
        car.produced.is_empty(),
        "only cert-manager's Certificate gets `produced`"
    );
    assert_eq!(
        car.patches,
        vec![
            TranslatePatch {
                path: "spec.type".into(),
                expression: Some("value.toUpperCase()".into()),
                reverse_expression: Some("value.toLowerCase()".into()),
                ..Default::default()
            },
            TranslatePatch {
                path: "spec.selector".into(),
                labels: Some(TranslatePatchLabels {}),
                ..Default::default()
            },
            TranslatePatch {
                path: "spec.owner".into(),
                reference: Some(TranslatePatchReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name_path: Some("name".into()),
                    namespace_path: Some("namespace".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            // A reverseExpression alone, as vCluster allows it.
            TranslatePatch {
                path: "metadata.annotations[\"example.com/back\"]".into(),
                reverse_expression: Some("value + '-seen'".into()),
                ..Default::default()
            },
        ]
    );
    let issuers = &types[1];
    assert_eq!(
        (
            issuers.kind.as_str(),
            issuers.direction,
            issuers.sync_status
        ),
        ("Issuer", SyncDirection::FromHost, false)
    );
    assert_eq!(
        issuers.mappings,
        Some(FromHostMappings {
            by_name: [
                (String::new(), "shared/*".to_string()),
                ("/root".to_string(), "kube-system/root-ca".to_string()),
                ("vcluster-prod/web".to_string(), "web/issuer".to_string()),
            ]
            .into_iter()
            .collect()
        })
    );
    let notes: Vec<&str> = out.notes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(
        notes,
        [
            "sync.toHost.customResources",
            "sync.fromHost.customResources",
        ]
    );
}

fn one_entry(direction: &str, entry: &str) -> String {
    format!("sync:\n  {direction}:\n    customResources:\n      cars.example.loft.sh:\n{entry}")
}

#[test]
fn what_is_skipped_and_why() {
    let cases = [
        (one_entry("toHost", "        enabled: false\n"), "sync.toHost.customResources[\"cars.example.loft.sh\"].enabled", "vCluster does not sync"),
        (one_entry("toHost", "        patches: []\n"), "sync.toHost.customResources[\"cars.example.loft.sh\"].enabled", "vCluster does not sync"),
        (one_entry("toHost", "        enabled: true\n        scope: Cluster\n"), "sync.toHost.customResources[\"cars.example.loft.sh\"].scope", "its validation refuses"),
        (one_entry("fromHost", "        enabled: true\n        scope: Cluster\n"), "sync.fromHost.customResources[\"cars.example.loft.sh\"].scope", "host namespace only"),
        (one_entry("toHost", "        enabled: true\n        scope: Global\n"), "sync.toHost.customResources[\"cars.example.loft.sh\"].scope", "neither"),
        (one_entry("fromHost", "        enabled: true\n        scope: Namespaced\n        mappings:\n          byName:\n            \"elsewhere/*\": \"a/*\"\n"), "sync.fromHost.customResources[\"cars.example.loft.sh\"].mappings.byName", "no entry reads"),
        ("sync:\n  toHost:\n    customResources:\n      clusterissuers.cert-manager.io:\n        enabled: true\n".to_string(), "sync.toHost.customResources[\"clusterissuers.cert-manager.io\"]", "cluster-scoped"),
    ];
    for (text, path, says) in cases {
        let err = with_host(&text, "ns").unwrap_err();
        assert_eq!(err, ImportError::NoPlugins, "{text}");
        // Nothing imported: the warnings are what the CLI prints; check them through the keys.
        let root: Value = serde_yaml::from_str(&text).unwrap();
        let mut warnings = Vec::new();
        let out = custom_resources::convert(
            root.get("sync").unwrap(),
            "ns",
            &Some(host_types()),
            &mut warnings,
        )
        .expect("convert");
        assert!(out.types.is_empty(), "{text}");
        let hit = warnings.iter().find(|w| w.path == path);
        assert!(
            hit.is_some_and(|w| w.message.contains(says)),
            "{text}: want {path} saying {says:?}, got {warnings:?}"
        );
    }
    // A FromHost entry without mappings keeps the runtime's default, and says so.
    let out = with_host(
        &one_entry(
            "fromHost",
            "        enabled: true\n        scope: Namespaced\n",
        ),
        "ns",
    )
    .expect("import");
    assert_eq!(out.plugins[0].spec.synced_types[0].mappings, None);
    assert_eq!(
        paths(&out),
        ["sync.fromHost.customResources[\"cars.example.loft.sh\"].mappings"]
    );
}

#[test]
fn patches_vcluster_refuses_are_refused_with_its_words() {
    let patch = |p: &str| {
        one_entry(
            "toHost",
            &format!("        enabled: true\n        patches:\n{p}"),
        )
    };
    let cases = [
        (
            patch("          - path: a\n"),
            "patches[0]",
            "need to use one of",
        ),
        (
            patch("          - path: a\n            expression: x\n            labels: {}\n"),
            "patches[0]",
            "can only use one of",
        ),
        (
            patch(
                "          - path: a\n            reverseExpression: x\n            reference: {apiVersion: v1, kind: Secret}\n",
            ),
            "patches[0]",
            "can only use one of",
        ),
        (
            patch(
                "          - path: a\n            labels: {}\n          - path: a\n            expression: x\n",
            ),
            "patches[1]",
            "same path",
        ),
        (
            patch("          - labels: {}\n"),
            "patches[0].path",
            "required",
        ),
        (patch("          - nope\n"), "patches[0]", "a patch"),
    ];
    for (text, at, says) in cases {
        match with_host(&text, "ns") {
            Err(ImportError::Invalid { path, message }) => {
                assert_eq!(
                    path,
                    format!("sync.toHost.customResources[\"cars.example.loft.sh\"].{at}"),
                    "{text}"
                );
                assert!(message.contains(says), "{text}: {message}");
            }
            other => panic!("{text}: expected Invalid, got {other:?}"),
        }
    }
    // vCluster's omitted strings: `""` is absent.
    let out = with_host(
        &patch("          - path: a\n            expression: \"\"\n            reverseExpression: \"\"\n            reference: {apiVersion: v1, kind: Secret, namePath: \"\"}\n"),
        "ns",
    )
    .expect("import");
    assert_eq!(
        out.plugins[0].spec.synced_types[0].patches,
        vec![TranslatePatch {
            path: "a".into(),
            reference: reference("v1", "Secret"),
            ..Default::default()
        }]
    );
}

#[test]
fn unknown_keys_of_an_entry_are_named() {
    let out = with_host(
        &one_entry(
            "toHost",
            "        enabled: true\n        selector: {}\n        patches:\n          - path: a\n            labels: {}\n            note: x\n          - path: b\n            reference: {apiVersion: v1, kind: Secret, name: c}\n",
        ),
        "ns",
    )
    .expect("import");
    let at = "sync.toHost.customResources[\"cars.example.loft.sh\"]";
    assert_eq!(
        paths(&out),
        [
            format!("{at}.selector"),
            format!("{at}.patches[0].note"),
            format!("{at}.patches[1].reference.name"),
        ]
    );
    assert_eq!(out.plugins[0].spec.synced_types[0].patches.len(), 2);
}

#[test]
fn certificate_without_a_secret_reference_is_warned_about() {
    let out = with_host(
        "sync:\n  toHost:\n    customResources:\n      certificates.cert-manager.io:\n        enabled: true\n",
        "ns",
    )
    .expect("import");
    assert_eq!(out.plugins[0].spec.synced_types[0].produced.len(), 1);
    assert_eq!(
        paths(&out),
        ["sync.toHost.customResources[\"certificates.cert-manager.io\"].patches"]
    );
    assert!(out.warnings[0].message.contains("share one host Secret"));
}

#[test]
fn the_plugin_name_is_an_option_and_must_be_free() {
    let opts = |name: &str| ImportOptions {
        resolved: Some(host_types()),
        name: Some(name.into()),
    };
    let out = import_with(CERT_MANAGER, "v", "ns", &opts("cert-manager-sync")).expect("import");
    assert_eq!(
        out.plugins[0].metadata.name.as_deref(),
        Some("cert-manager-sync")
    );
    assert_eq!(
        import_with(MIXED, "v", "ns", &opts("pod-labels")).unwrap_err(),
        ImportError::NameTaken("pod-labels".into())
    );
}

#[test]
fn sync_blocks_of_the_wrong_shape_name_the_value() {
    let cases = [
        ("sync: 3\n", "sync"),
        ("sync:\n  toHost: []\n", "sync.toHost"),
        (
            "sync:\n  toHost:\n    customResources: [a]\n",
            "sync.toHost.customResources",
        ),
        (
            "sync:\n  toHost:\n    customResources:\n      cars.example.loft.sh: 1\n",
            "sync.toHost.customResources[\"cars.example.loft.sh\"]",
        ),
        (
            "sync:\n  toHost:\n    customResources:\n      cars.example.loft.sh:\n        enabled: yes please\n",
            "sync.toHost.customResources[\"cars.example.loft.sh\"].enabled",
        ),
        (
            "sync:\n  fromHost:\n    customResources:\n      cars.example.loft.sh:\n        enabled: true\n        mappings:\n          byName:\n            \"ns/*\": 3\n",
            "sync.fromHost.customResources[\"cars.example.loft.sh\"].mappings.byName[\"ns/*\"]",
        ),
    ];
    for (text, want) in cases {
        match with_host(text, "ns") {
            Err(ImportError::Invalid { path, .. }) => assert_eq!(path, want, "{text}"),
            other => panic!("{text}: expected Invalid at {want}, got {other:?}"),
        }
    }
}

/// `config/samples/cert-manager.yaml` is what the import makes of the cert-manager fixture
/// (its comment says so).
#[test]
fn the_cert_manager_sample_is_the_imported_fixture() {
    let sample: VClusterPlugin =
        serde_yaml::from_str(include_str!("../../../config/samples/cert-manager.yaml"))
            .expect("the sample");
    let out = import_with(
        CERT_MANAGER,
        "my-vcluster",
        "my-vcluster",
        &ImportOptions {
            resolved: Some(host_types()),
            name: Some("cert-manager-sync".into()),
        },
    )
    .expect("import");
    let json = |p: &VClusterPlugin| serde_json::to_value(p).expect("as JSON");
    assert_eq!(json(&out.plugins[0]), json(&sample));
}
