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
