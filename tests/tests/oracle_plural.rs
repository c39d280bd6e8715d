//! The plural admission checks for a kind (`vcp_crds::admission_plural`, the rule
//! `config/admission/requester.yaml` writes in CEL) against Kubernetes' own code and against the
//! plurals really served, for every kind of the test CRDs and every kind the API server serves.
//!
//! Two referees, because the admission policy must agree with two things:
//! - Kubernetes' guess, `k8s.io/apimachinery/pkg/api/meta.UnsafeGuessKindToResource` (what
//!   kubectl and vCluster use for a kind without discovery), asked of the Go code itself through
//!   the plural oracle (`tests/vcluster-go/cmd/plural-oracle`, [`vcp_tests::kubernetes_plurals`]):
//!   admission has no discovery, so this guess is what it checks, and `admission_plural` must be
//!   exactly it for every kind;
//! - the truth, which the Role the operator writes grants: a CRD's own `spec.names.plural`,
//!   and for the API server's built-in kinds its discovery. Where the guess is not the truth,
//!   admission checked the requester's rights on another resource than the one granted, so the
//!   operator must refuse the plugin (`PolicyDenied`, `check_admitted_resources`) unless
//!   `syncedTypes[].resource` names the served plural (then admission checks that one); where it
//!   is, the operator must accept it.
//!
//! The test CRDs: the committed ones (`crds/*.yaml`), those of `tests/fixtures/` (any YAML file
//! holding a `CustomResourceDefinition`), the real controllers' CRDs of `vcp_tests::real_crds`
//! (cert-manager, Gateway API's standard channel, Prometheus' ServiceMonitor, from their pinned
//! Go modules), and the CRDs the end-to-end tests write inline (`tests/tests/*.rs`: each
//! `names` block that spells out a literal `plural` and `kind`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kube::discovery::Discovery;
use serde_json::json;
use vcluster_plugin_operator::policy::check_admitted_resources;
use vcluster_plugin_operator::rbac::{Plurals, Served};
use vcp_crds::{VClusterPlugin, admission_plural};
use vcp_tests::{Cluster, ControlPlane, Identity, kubernetes_plurals, oracle_paths, repo_root};

/// One kind as served: `apiVersion`, kind, plural, and where it was found.
#[derive(Clone, Debug)]
struct Kind {
    api_version: String,
    kind: String,
    plural: String,
    source: String,
}

/// The kinds of the CRDs in the YAML file `path` (its `spec.names`, every served version).
fn kinds_of_crd_file(path: &Path) -> Vec<Kind> {
    let crds = vcp_tests::real_crds::read_crds(path).unwrap_or_else(|e| panic!("{e:#}"));
    crds.into_iter()
        .flat_map(|crd| {
            let group = crd.spec.group.clone();
            let names = crd.spec.names.clone();
            crd.spec
                .versions
                .iter()
                .filter(|v| v.served)
                .map(|v| Kind {
                    api_version: format!("{group}/{}", v.name),
                    kind: names.kind.clone(),
                    plural: names.plural.clone(),
                    source: path.display().to_string(),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The YAML files under `dir`, recursively, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            out.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The CRD files of the test fixtures and of `real_crds`.
fn crd_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files: Vec<PathBuf> = yaml_files(&root.join("crds"));
    files.extend(
        yaml_files(&root.join("tests/fixtures"))
            .into_iter()
            .filter(|f| {
                std::fs::read_to_string(f)
                    .is_ok_and(|t| t.contains("kind: CustomResourceDefinition"))
            }),
    );
    files.extend(vcp_tests::cert_manager_crd_files());
    files.extend(yaml_files(&oracle_paths()["GATEWAY_API_CRDS"]));
    files.push(vcp_tests::service_monitor_crd_file());
    files
}

/// The `(kind, plural)` of every `names` block of the end-to-end tests' sources that spells
/// both out as literals: YAML flow (`names: { plural: people, kind: Person }`) or JSON
/// (`"names": {"plural": "certs", "kind": "Cert"}`); a value that is a Rust variable (JSON
/// without quotes) is left out.
fn inline_crd_kinds() -> Vec<Kind> {
    let dir = repo_root().join("tests/tests");
    let mut out = Vec::new();
    // the test files, and the modules of a test made of a folder (`<name>/main.rs`, ...)
    let mut paths = Vec::new();
    for file in std::fs::read_dir(&dir).expect("tests/tests") {
        let path = file.expect("entry").path();
        if path.is_dir() {
            for module in std::fs::read_dir(&path).expect("a test's folder") {
                paths.push(module.expect("entry").path());
            }
        } else {
            paths.push(path);
        }
    }
    for path in paths {
        // This file's own docs show the two shapes: not a CRD.
        if path.extension().is_none_or(|x| x != "rs") || path.ends_with("oracle_plural.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a test");
        for (at, _) in text.match_indices("names") {
            let rest = &text[at + "names".len()..];
            let rest = rest.strip_prefix('"').unwrap_or(rest).trim_start();
            let Some(block) = rest
                .strip_prefix(':')
                .map(str::trim_start)
                .and_then(|r| r.strip_prefix('{'))
                .and_then(|r| r.split_once('}'))
                .map(|(b, _)| b)
            else {
                continue;
            };
            let json = block.contains('"');
            let mut fields = BTreeMap::new();
            for pair in block.split(',') {
                let Some((key, value)) = pair.split_once(':') else {
                    continue;
                };
                let (key, value) = (key.trim(), value.trim());
                let literal = if json {
                    value
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .filter(|v| !v.contains('{'))
                } else {
                    Some(value)
                };
                if let Some(v) = literal {
                    fields.insert(key.trim_matches('"').to_string(), v.to_string());
                }
            }
            if let (Some(kind), Some(plural)) = (fields.get("kind"), fields.get("plural")) {
                out.push(Kind {
                    api_version: "inline.test/v1".into(),
                    kind: kind.clone(),
                    plural: plural.clone(),
                    source: path.display().to_string(),
                });
            }
        }
    }
    out
}

/// Every kind the host API server serves (discovery, every group version; subresources are not
/// resources of their own there).
async fn served_kinds() -> Vec<Kind> {
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    let discovery = Discovery::new(client).run().await.expect("discovery");
    let mut out = Vec::new();
    for group in discovery.groups() {
        for version in group.versions() {
            for (resource, _) in group.versioned_resources(version) {
                out.push(Kind {
                    api_version: resource.api_version.clone(),
                    kind: resource.kind.clone(),
                    plural: resource.plural.clone(),
                    source: "the API server's discovery".into(),
                });
            }
        }
    }
    out
}

/// A plugin syncing `kind` of `api_version`, naming `resource` when given.
fn plugin(api_version: &str, kind: &str, resource: Option<&str>) -> VClusterPlugin {
    let mut synced = json!({ "apiVersion": api_version, "kind": kind });
    if let Some(r) = resource {
        synced["resource"] = json!(r);
    }
    serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": { "name": "p", "namespace": "ns" },
        "spec": { "vcluster": { "name": "vc" }, "syncedTypes": [synced] },
    }))
    .expect("plugin")
}

/// Every kind of the test CRDs and of the API server's discovery (module docs), after checking
/// that the harvest found what the suite is known to define; and a summary of where they came
/// from.
async fn all_kinds() -> (Vec<Kind>, String) {
    let mut kinds: Vec<Kind> = crd_files()
        .iter()
        .flat_map(|f| kinds_of_crd_file(f))
        .collect();
    let crd_kinds = kinds.len();
    let inline = inline_crd_kinds();
    let inline_kinds = inline.len();
    // The tutorial's Car, a real CRD of each source, and the inline CRD whose plural
    // Kubernetes cannot guess (security_trust.rs).
    for (kind, plural) in [
        ("Car", "cars"),
        ("VClusterPlugin", "vclusterplugins"),
        ("Certificate", "certificates"),
        ("HTTPRoute", "httproutes"),
        ("ServiceMonitor", "servicemonitors"),
        ("Person", "people"),
    ] {
        assert!(
            kinds
                .iter()
                .chain(&inline)
                .any(|k| k.kind == kind && k.plural == plural),
            "{kind} ({plural}) not found among the test CRDs"
        );
    }
    kinds.extend(inline);
    let served = served_kinds().await;
    let served_count = served.len();
    assert!(
        served.iter().any(|k| k.kind == "Endpoints")
            && served.iter().any(|k| k.kind == "NetworkPolicy"),
        "discovery lists the built-in kinds"
    );
    kinds.extend(served);
    let summary = format!(
        "{} kinds: {crd_kinds} from CRD files, {inline_kinds} inline test CRDs, {served_count} \
         served by the API server",
        kinds.len()
    );
    (kinds, summary)
}

/// The distinct kind names of `kinds`, sorted.
fn distinct(kinds: &[Kind]) -> Vec<String> {
    kinds
        .iter()
        .map(|k| k.kind.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[tokio::test]
async fn admission_plural_is_kubernetes_guess_and_the_operator_refuses_where_it_is_wrong() {
    let (kinds, summary) = all_kinds().await;

    // 1. Kubernetes' guess, from its own code, for every distinct kind.
    let distinct = distinct(&kinds);
    let guessed = kubernetes_plurals(&distinct);
    let differ: Vec<(String, String, String)> = distinct
        .iter()
        .zip(&guessed)
        .filter(|(kind, guess)| admission_plural(kind) != **guess)
        .map(|(kind, guess)| (kind.clone(), admission_plural(kind), guess.clone()))
        .collect();
    assert!(
        differ.is_empty(),
        "admission_plural differs from UnsafeGuessKindToResource (kind, ours, Kubernetes'): {differ:?}"
    );

    // 2. Against the truth: where the guess is the served plural, the operator accepts a plugin
    // syncing the kind by name; where it is not, it refuses it unless `resource` names it.
    let mut wrong_guesses = BTreeSet::new();
    for k in &kinds {
        let plurals: Plurals = [(
            (k.api_version.clone(), k.kind.clone()),
            Served::namespaced(&k.plural),
        )]
        .into_iter()
        .collect();
        let guess = admission_plural(&k.kind);
        let by_kind = check_admitted_resources(&plugin(&k.api_version, &k.kind, None), &plurals);
        if guess == k.plural {
            assert_eq!(
                by_kind,
                Ok(()),
                "{k:?}: admission checked the served plural"
            );
        } else {
            let Err(denial) = by_kind else {
                panic!(
                    "{k:?}: admission checked {guess:?}, the Role would grant {:?}: must be refused",
                    k.plural
                );
            };
            let message = denial.message();
            assert!(
                message.contains(&format!("resource: {}", k.plural)) && message.contains(&guess),
                "{k:?}: the refusal names both resources and the remedy: {message}"
            );
            assert_eq!(
                check_admitted_resources(
                    &plugin(&k.api_version, &k.kind, Some(&k.plural)),
                    &plurals
                ),
                Ok(()),
                "{k:?}: with `resource` naming the served plural, admission checks that one"
            );
            wrong_guesses.insert(format!(
                "{} ({}, guessed {guess}) in {}",
                k.kind, k.plural, k.source
            ));
        }
    }
    println!(
        "{summary} ({} distinct): admission_plural equals Kubernetes' guess for all; the guess \
         is not the served plural for {wrong_guesses:?}",
        distinct.len()
    );
}

/// The group of the probe's types: nothing serves it (admission has no discovery and needs
/// none), so no right of the probe on a real resource can hide a refusal.
const PROBE_GROUP: &str = "plural-probe.test";

/// The probe's plugin in `vcp-system` (the admission probe of
/// `vcp_tests::install_admission_policies`: user `vcp-syncer`, who may create VClusterPlugins,
/// Roles and RoleBindings there and update the workload `probe`), with `spec` merged in.
fn probe_plugin(name: &str, spec: serde_json::Value) -> VClusterPlugin {
    let mut full = json!({ "vcluster": { "name": "probe" }, "image": "example.com/probe:1" });
    full.as_object_mut()
        .unwrap()
        .extend(spec.as_object().cloned().unwrap_or_default());
    serde_json::from_value(json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": { "name": name, "namespace": "vcp-system" },
        "spec": full,
    }))
    .expect("probe plugin")
}

/// The resource the requester policy checked first for `plugin`, created as a server-side dry
/// run by `probe`: the `<what> needs get on <PROBE_GROUP>/<resource> in namespace vcp-system`
/// of its refusal, whose `<what>` must start with `what`.
async fn checked_resource(
    probe: &kube::Api<VClusterPlugin>,
    plugin: &VClusterPlugin,
    what: &str,
) -> String {
    let dry = kube::api::PostParams {
        dry_run: true,
        field_manager: None,
    };
    let refusal = match probe.create(&dry, plugin).await {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("{plugin:?}: admission must refuse the probe, got {other:?}"),
    };
    let needs = format!(": {what}");
    let words = format!(" needs get on {PROBE_GROUP}/");
    let at = refusal
        .find(&needs)
        .and_then(|i| refusal[i..].find(&words).map(|j| i + j + words.len()))
        .unwrap_or_else(|| panic!("no \"{what} ...{words}\" in the refusal: {refusal}"));
    let rest = &refusal[at..];
    rest[..rest.find(" in namespace vcp-system").unwrap_or(rest.len())].to_string()
}

/// The plural the requester admission policy itself computes (its four CEL copies, for a
/// synced type, a `reference` patch's kind, a `produced` kind and a hook on physical events:
/// `config/admission/requester.yaml`) is Kubernetes' guess, for every kind of
/// [`all_kinds`]. Each copy is read from the refusal of a server-side dry run by a probe that
/// holds nothing on the kind (the policy names the resource it checked).
#[tokio::test]
async fn the_admission_policys_cel_guess_is_kubernetes_guess() {
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::prepare_operator_host(cp, &admin).await;
    // The parent type of the reference and produced probes: every verb, so that the first
    // refused check is the one on the kind under test.
    vcp_tests::apply_yaml(
        &admin,
        &format!(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: vcp-plural-probe, namespace: vcp-system }}
rules:
  - {{ apiGroups: [{PROBE_GROUP}], resources: [parents], verbs: [get, list, watch, create, update, patch, delete] }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: vcp-plural-probe, namespace: vcp-system }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: vcp-plural-probe }}
subjects:
  - {{ apiGroup: rbac.authorization.k8s.io, kind: User, name: vcp-syncer }}
"#
        ),
        None,
    )
    .await
    .expect("the probe's rights on its parent type");
    let probe: kube::Api<VClusterPlugin> = kube::Api::namespaced(
        cp.client(Cluster::Host, Identity::Syncer).await,
        "vcp-system",
    );
    let api_version = format!("{PROBE_GROUP}/v1");
    let parent = json!({ "apiVersion": api_version, "kind": "Parent" });

    let (kinds, summary) = all_kinds().await;
    let distinct = distinct(&kinds);
    assert!(
        !distinct.iter().any(|k| admission_plural(k) == "parents"),
        "a kind under test shares the parent type's plural"
    );
    let guessed = kubernetes_plurals(&distinct);
    let mut differ = Vec::new();
    for (kind, guess) in distinct.iter().zip(&guessed) {
        let mut reference = parent.clone();
        reference["patches"] = json!([{
            "path": "spec.ref",
            "reference": { "apiVersion": api_version, "kind": kind },
        }]);
        let mut produced = parent.clone();
        produced["produced"] =
            json!([{ "apiVersion": api_version, "kind": kind, "namePath": "spec.name" }]);
        let probes = [
            (
                "spec.syncedTypes[0] (",
                json!({ "syncedTypes": [{ "apiVersion": api_version, "kind": kind, "direction": "FromHost" }] }),
            ),
            (
                "spec.syncedTypes[0].patches[0].reference (",
                json!({ "syncedTypes": [reference] }),
            ),
            (
                "spec.syncedTypes[0].produced[0] (",
                json!({ "syncedTypes": [produced] }),
            ),
            (
                "spec.hooks[0] (",
                json!({ "hooks": [{
                    "name": "probe", "apiVersion": api_version, "kind": kind,
                    "events": ["CreatePhysical"], "labels": { "probed": "true" },
                }] }),
            ),
        ];
        for (what, spec) in probes {
            let checked = checked_resource(&probe, &probe_plugin("plural-probe", spec), what).await;
            if checked != *guess {
                differ.push(format!(
                    "{kind}: {what}...) checked {checked:?}, Kubernetes guesses {guess:?}"
                ));
            }
        }
    }
    assert!(
        differ.is_empty(),
        "the admission policy's plural is not Kubernetes' guess:\n{}",
        differ.join("\n")
    );
    println!(
        "{summary}: for each of the {} distinct kinds, the four CEL copies of the requester \
         policy checked Kubernetes' guess",
        distinct.len()
    );
}
