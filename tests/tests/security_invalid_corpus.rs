//! The invalid-input corpus (`tests/fixtures/invalid/*.yaml`) against the real host API server
//! and the operator running in-process under the `vcp-operator` identity (RBAC on).
//!
//! Each fixture starts with a header line `# expect: <outcome>`:
//! - `refused <field>`: `kubectl apply` fails, and the API server's message names `<field>`
//!   (the CRD's OpenAPI constraints and CEL rules);
//! - `Ready=False reason=<Reason> [message=<text>]`: `kubectl apply` succeeds, then the
//!   operator sets `Ready=False` with that reason (and a message containing `<text>`) for the
//!   current generation and publishes an Event with that reason on the plugin.
//!
//! In both cases, and again after the accepted ones are deleted, the vCluster's StatefulSet,
//! every Role of the namespace (the chart's and the baseline plugin's) and the baseline's
//! ClusterRoles keep their `resourceVersion`: nothing was written for a bad object.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use vcp_crds::VClusterPlugin;
use vcp_tests::{
    Audit, Cluster, ControlPlane, Identity, apply_yaml, condition, poll_event, poll_ready,
    repo_root, vcluster_workload, wait_ready,
};

const NS: &str = "invalid-corpus";
const TIMEOUT: Duration = Duration::from_secs(30);
/// How long an Event may take to appear after the status write it follows.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// CRDs, the operator's RBAC, and one operator for this test binary on its own runtime.
async fn setup() -> Client {
    vcp_tests::start_shared_operator("vcp-test/runtime:corpus").await
}

/// The rest of the vCluster-chart-shaped namespace after [`vcluster_workload`]: the chart's
/// Role and RoleBinding, and an installed baseline plugin syncing Cars (with a cluster rule, so
/// that it has RBAC objects of all four kinds).
const VCLUSTER_REST: &str = r#"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: vc-my-vcluster }
rules:
  - apiGroups: [""]
    resources: [pods, services]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: vc-my-vcluster }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-my-vcluster }
subjects:
  - { kind: ServiceAccount, name: vc-my-vcluster, namespace: invalid-corpus }
---
apiVersion: vcp.dev/v1alpha1
kind: VClusterPlugin
metadata: { name: baseline }
spec:
  vcluster: { name: my-vcluster }
  syncedTypes:
    - { apiVersion: example.loft.sh/v1, kind: Car }
  rbac:
    clusterRole:
      extraRules:
        - { apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions], verbs: [get, list, watch] }
"#;

/// What a fixture expects.
#[derive(Debug)]
enum Expect {
    Refused {
        field: String,
    },
    NotReady {
        reason: String,
        message: Option<String>,
    },
}

fn parse_expect(path: &std::path::Path, text: &str) -> Expect {
    let header = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# expect: "))
        .unwrap_or_else(|| panic!("{}: first line must be `# expect: ...`", path.display()));
    if let Some(field) = header.strip_prefix("refused ") {
        return Expect::Refused {
            field: field.trim().to_string(),
        };
    }
    let rest = header
        .strip_prefix("Ready=False ")
        .unwrap_or_else(|| panic!("{}: unknown expectation {header:?}", path.display()));
    let mut reason = None;
    let mut message = None;
    for part in rest.split_whitespace() {
        match part.split_once('=') {
            Some(("reason", r)) => reason = Some(r.to_string()),
            Some(("message", m)) => message = Some(m.to_string()),
            _ => panic!("{}: unknown part {part:?}", path.display()),
        }
    }
    Expect::NotReady {
        reason: reason.unwrap_or_else(|| panic!("{}: no reason=", path.display())),
        message,
    }
}

fn plugin_name(text: &str) -> String {
    let doc: serde_yaml::Value = serde_yaml::from_str(text).expect("fixture YAML");
    doc["metadata"]["name"]
        .as_str()
        .expect("metadata.name")
        .to_string()
}

/// Runs the control plane's own kubectl ([`ControlPlane::kubectl`]: the one
/// `scripts/control-plane` chose or built) as the host admin.
fn kubectl(args: &[&str]) -> (bool, String) {
    let cp = ControlPlane::shared();
    let kubeconfig = cp.kubeconfig(Cluster::Host, Identity::Admin);
    let out = Command::new(cp.kubectl())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `kind/name` → resourceVersion of the objects a bad plugin must never touch.
async fn versions(admin: &Client) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), NS)
        .get("my-vcluster")
        .await
        .expect("StatefulSet");
    out.insert(
        "StatefulSet/my-vcluster".into(),
        sts.resource_version().unwrap(),
    );
    for r in Api::<Role>::namespaced(admin.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("Roles")
    {
        out.insert(
            format!("Role/{}", r.name_any()),
            r.resource_version().unwrap(),
        );
    }
    for r in Api::<RoleBinding>::namespaced(admin.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("RoleBindings")
    {
        out.insert(
            format!("RoleBinding/{}", r.name_any()),
            r.resource_version().unwrap(),
        );
    }
    let ours = ListParams::default().labels(&format!("{}={NS}", vcp_crds::PLUGIN_NAMESPACE_LABEL));
    for r in Api::<ClusterRole>::all(admin.clone())
        .list(&ours)
        .await
        .expect("ClusterRoles")
    {
        out.insert(
            format!("ClusterRole/{}", r.name_any()),
            r.resource_version().unwrap(),
        );
    }
    for r in Api::<ClusterRoleBinding>::all(admin.clone())
        .list(&ours)
        .await
        .expect("ClusterRoleBindings")
    {
        out.insert(
            format!("ClusterRoleBinding/{}", r.name_any()),
            r.resource_version().unwrap(),
        );
    }
    out
}

/// The operator's write requests (audit log) to the workload and RBAC of the test's vCluster:
/// everything in [`NS`] or named `vcp:<NS>:…` except its plugins (status, finalizer), Events
/// and dry runs (`dryRun=All`: the operator's admission probes, which persist nothing). A no-op
/// patch keeps an object's resourceVersion but is listed here. Read once the audit log holds
/// every request answered before the call.
async fn operator_workload_and_rbac_writes() -> Vec<(String, String)> {
    Audit::writes()
        .by(Identity::Operator)
        .in_namespace(NS)
        .and_its_cluster_objects()
        .excluding("/vclusterplugins/")
        .excluding("/events")
        .excluding("dryRun=All")
        .caught_up()
        .await
        .requests()
}

#[tokio::test]
async fn every_invalid_manifest_is_refused_or_reported_and_nothing_is_written() {
    let admin = setup().await;
    vcp_tests::create_namespace(&admin, NS).await;
    apply_yaml(
        &admin,
        &format!("{}{VCLUSTER_REST}", vcluster_workload(NS)),
        Some(NS),
    )
    .await
    .expect("vCluster fixtures");
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), NS);
    wait_ready(&admin, NS, "baseline", "True", None, TIMEOUT).await;
    // The baseline has settled once the operator finished a reconcile of it after a poke (its
    // RBAC and status are written after the workload, in earlier reconciles).
    vcp_tests::poke_plugin(&admin, NS, "baseline", TIMEOUT).await;
    let before = versions(&admin).await;
    let writes_before = operator_workload_and_rbac_writes().await;
    for kind in ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"] {
        assert!(
            before.contains_key(&format!("{kind}/vcp-plugin-baseline"))
                || before.contains_key(&format!("{kind}/vcp:{NS}:baseline")),
            "the baseline's {kind} is watched: {before:?}"
        );
    }

    let dir = repo_root().join("tests/fixtures/invalid");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures folder")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 30, "only {} fixtures", files.len());

    let mut failures = Vec::new();
    let (mut refused, mut reported) = (0, 0);
    for path in &files {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(path).unwrap();
        let name = plugin_name(&text);
        let path_str = path.to_string_lossy().to_string();
        let (ok, out) = kubectl(&["apply", "-n", NS, "-f", &path_str]);
        match parse_expect(path, &text) {
            Expect::Refused { field } => {
                refused += 1;
                if ok {
                    failures.push(format!("{file}: accepted, expected refused ({out})"));
                    kubectl(&["delete", "-n", NS, "-f", &path_str, "--wait=true"]);
                } else if !out.contains("is invalid") || !out.contains(&field) {
                    failures.push(format!("{file}: refused without naming {field}: {out}"));
                }
            }
            Expect::NotReady { reason, message } => {
                reported += 1;
                if !ok {
                    failures.push(format!("{file}: refused by kubectl apply: {out}"));
                    continue;
                }
                let not_ready = poll_ready(&admin, NS, &name, "False", None, TIMEOUT).await;
                match not_ready.as_ref().and_then(|p| condition(p, "Ready")) {
                    None => failures.push(format!("{file}: never Ready=False")),
                    Some(c) if c.reason != reason => failures.push(format!(
                        "{file}: reason {} ({}), expected {reason}",
                        c.reason, c.message
                    )),
                    Some(c) => {
                        if let Some(m) = &message
                            && !c.message.contains(m.as_str())
                        {
                            failures
                                .push(format!("{file}: message {:?} does not name {m}", c.message));
                        }
                        // The operator publishes the Event right after the status write
                        // that `poll_ready` saw: poll for it rather than list once.
                        let waited = Instant::now();
                        let has_event = poll_event(&admin, NS, &name, &reason, EVENT_TIMEOUT)
                            .await
                            .is_some();
                        println!("{file}: Event seen {:?} after the status", waited.elapsed());
                        if !has_event {
                            failures.push(format!("{file}: no Event with reason {reason}"));
                        }
                    }
                }
                let after_apply = versions(&admin).await;
                if after_apply != before {
                    failures.push(format!(
                        "{file}: written while applied: {before:?} -> {after_apply:?}"
                    ));
                }
                let (deleted, out) = kubectl(&[
                    "delete",
                    "-n",
                    NS,
                    "vclusterplugin",
                    &name,
                    "--wait=true",
                    "--timeout=30s",
                ]);
                if !deleted {
                    failures.push(format!("{file}: delete failed: {out}"));
                }
            }
        }
        let after = versions(&admin).await;
        if after != before {
            failures.push(format!("{file}: written: {before:?} -> {after:?}"));
        }
    }
    // Evidence that the operator looked after the last fixture: a reconcile of the poked
    // baseline finished; then no write of the workload or RBAC by the operator in the whole run
    // (also no no-op patch, which the resourceVersions above would not show).
    let reconciles = vcp_tests::poke_plugin(&admin, NS, "baseline", TIMEOUT).await;
    let writes_after = operator_workload_and_rbac_writes().await;
    let final_versions = versions(&admin).await;
    println!(
        "invalid corpus: {} fixtures; {} objects watched (StatefulSet, Roles, RoleBindings, \
         ClusterRoles, ClusterRoleBindings), {} changed; operator writes to the workload or RBAC: \
         {} before, {} after; baseline reconciled {reconciles} times",
        files.len(),
        before.len(),
        before
            .iter()
            .filter(|(k, v)| final_versions.get(*k) != Some(*v))
            .count(),
        writes_before.len(),
        writes_after.len(),
    );
    if writes_after != writes_before {
        failures.push(format!(
            "operator writes to the workload or RBAC during the corpus: {:?}",
            &writes_after[writes_before.len().min(writes_after.len())..]
        ));
    }
    // The baseline still works.
    let baseline = plugins.get("baseline").await.unwrap();
    assert!(
        baseline
            .status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "baseline lost Ready"
    );
    assert!(
        failures.is_empty(),
        "{} of {} fixtures failed ({refused} refused, {reported} reported):\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}
