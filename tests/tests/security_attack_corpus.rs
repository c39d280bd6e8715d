//! The attack corpus (`tests/fixtures/attacks/*.yaml`): every hole of the trust
//! boundary and its variants, each applied with kubectl as a tenant user of the local control
//! plane, against vCluster's own chart (v0.30.0, rendered by helm) with a good plugin installed beside it,
//! the operator running in-process as `vcp-operator` under the admission policies of
//! `config/admission` (tests/src/lib.rs, `start_shared_operator_with_policy`).
//!
//! Each fixture starts with header lines:
//! - `# hole: <what it tries>`;
//! - `# as: <identity>` (`tenant-edit`, `tenant-nosecrets`, `tenant-nopatch`, `tenant-norbac`:
//!   their rights are `vcp_tests::TENANT_RBAC`);
//! - `# namespace: <ns>` (optional; default `attacks`);
//! - `# expect: admission: <fragment>`: the API server refuses the apply (a CRD rule or an
//!   admission policy) with a message containing `<fragment>`, and nothing is stored; or
//!   `# expect: reason: <Reason>`: the apply is accepted, the operator sets `Ready=False` with
//!   that reason for the current generation, and the plugin is then deleted by its author;
//! - `# message: <fragment>` (optional, with `expect: reason:` only): the `Ready=False`
//!   condition's message contains `<fragment>` (such as the refused field's path).
//!
//! Whatever the outcome, the audit log shows no write *attempt* (dry runs aside; refused ones
//! included, such as a write the operator-bounds admission policy refused) by anyone but the
//! test's own setup (`admin`) to any StatefulSet, Deployment, Role, RoleBinding, ClusterRole or
//! ClusterRoleBinding from the first fixture until the operator has finished a reconcile poked
//! after the last deletion, and the good plugin is still Ready with its container exactly as
//! before.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Client;
use kube::api::Api;
use serde_json::Value;
use vcp_crds::VClusterPlugin;
use vcp_tests::{
    Cluster, ControlPlane, Identity, apply_yaml, apply_yaml_file, bind_tenant_rights,
    create_namespace, poll_for, repo_root,
};

const NS: &str = "attacks";
const OPERATOR_NS: &str = "vcp-system";
const TIMEOUT: Duration = Duration::from_secs(30);

/// The operator's policy in this test: the defaults, and `secrets` refused even in namespaced
/// rules (so that `kind: Secret` in syncedTypes must be caught on its discovered plural).
const POLICY: &str = "forbiddenResources: [secrets]\n";

/// The rest of the attacked namespace, beside vCluster's own chart ([`vcp_tests::vcluster_workload`]):
/// the chart's Role bound to the vCluster's account and, shared, to `postgres`'s; a `postgres`
/// StatefulSet and a `web` Deployment that are not vClusters; a StatefulSet `lookalike` that
/// only looks like one (the chart's labels, a `syncer` container, no replicas) and runs as
/// `postgres` (what anyone who may create StatefulSets can make); a Secret
/// of credentials and a ConfigMap.
const NAMESPACE_FIXTURES: &str = r#"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: { name: vc-my-vcluster, labels: { app: vcluster, release: my-vcluster } }
rules:
  - apiGroups: [""]
    resources: [pods, services, configmaps]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: { name: vc-my-vcluster, labels: { app: vcluster, release: my-vcluster } }
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: Role, name: vc-my-vcluster }
subjects:
  - { kind: ServiceAccount, name: vc-my-vcluster, namespace: attacks }
  - { kind: ServiceAccount, name: postgres, namespace: attacks }
---
apiVersion: v1
kind: ServiceAccount
metadata: { name: postgres }
---
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: postgres, labels: { app: postgres } }
spec:
  serviceName: postgres
  selector: { matchLabels: { app: postgres } }
  template:
    metadata: { labels: { app: postgres } }
    spec:
      serviceAccountName: postgres
      containers: [{ name: postgres, image: "postgres:17" }]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: { name: lookalike, labels: { app: vcluster, release: lookalike } }
spec:
  replicas: 0
  serviceName: lookalike
  selector: { matchLabels: { app: vcluster, release: lookalike } }
  template:
    metadata: { labels: { app: vcluster, release: lookalike } }
    spec:
      serviceAccountName: postgres
      containers: [{ name: syncer, image: "postgres:17" }]
---
apiVersion: apps/v1
kind: Deployment
metadata: { name: web, labels: { app: web } }
spec:
  selector: { matchLabels: { app: web } }
  template:
    metadata: { labels: { app: web } }
    spec:
      containers: [{ name: web, image: "nginx:1.27" }]
---
apiVersion: v1
kind: Secret
metadata: { name: db-credentials }
stringData: { password: hunter2 }
---
apiVersion: v1
kind: ConfigMap
metadata: { name: settings }
data: { x: "1" }
"#;

/// The good plugin beside the attacks: the tutorial's Car syncer, created by `tenant-edit`.
const GOOD_PLUGIN: &str = r#"
apiVersion: vcp.dev/v1alpha1
kind: VClusterPlugin
metadata: { name: good }
spec:
  vcluster: { name: my-vcluster }
  syncedTypes:
    - { apiVersion: example.loft.sh/v1, kind: Car }
"#;

/// What a fixture expects.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Admission(String),
    Reason(String),
}

/// A parsed fixture.
#[derive(Debug)]
struct Fixture {
    file: String,
    path: PathBuf,
    name: String,
    identity: Identity,
    namespace: String,
    expect: Expect,
    /// `# message:`: a fragment of the `Ready=False` message.
    message: Option<String>,
}

fn identity(name: &str) -> Identity {
    match name {
        "tenant-edit" => Identity::TenantEdit,
        "tenant-nosecrets" => Identity::TenantNoSecrets,
        "tenant-nopatch" => Identity::TenantNoPatch,
        "tenant-norbac" => Identity::TenantNoRbac,
        other => panic!("unknown identity {other:?}"),
    }
}

/// The part of a fixture the harness reads itself: its name. Everything else is skipped
/// unread (serde_yaml skips ignored values iteratively), so a fixture nested deeper than
/// serde_yaml's recursion limit of 128 (`deep-config.yaml`) still parses.
#[derive(serde::Deserialize)]
struct NameOnly {
    metadata: NameOnlyMeta,
}

/// `metadata` of [`NameOnly`].
#[derive(serde::Deserialize)]
struct NameOnlyMeta {
    name: String,
}

fn parse(path: &Path) -> Fixture {
    let file = path.file_name().unwrap().to_string_lossy().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let header = |key: &str| {
        text.lines()
            .take_while(|l| l.starts_with('#'))
            .find_map(|l| l.strip_prefix(&format!("# {key}: ")))
            .map(str::trim)
    };
    assert!(header("hole").is_some(), "{file}: no `# hole:` line");
    let expect = header("expect").unwrap_or_else(|| panic!("{file}: no `# expect:` line"));
    let expect = if let Some(fragment) = expect.strip_prefix("admission: ") {
        Expect::Admission(fragment.to_string())
    } else if let Some(reason) = expect.strip_prefix("reason: ") {
        Expect::Reason(reason.to_string())
    } else {
        panic!("{file}: unknown expectation {expect:?}")
    };
    let message = header("message").map(str::to_string);
    assert!(
        message.is_none() || matches!(expect, Expect::Reason(_)),
        "{file}: `# message:` goes with `# expect: reason:` only"
    );
    let doc: NameOnly = serde_yaml::from_str(&text).expect("fixture YAML");
    Fixture {
        name: doc.metadata.name,
        identity: identity(header("as").unwrap_or("tenant-edit")),
        namespace: header("namespace").unwrap_or(NS).to_string(),
        file,
        path: path.to_path_buf(),
        expect,
        message,
    }
}

/// Runs kubectl against the host as `identity`; returns (success, stdout + stderr).
fn kubectl(identity: Identity, args: &[&str]) -> (bool, String) {
    let cp = ControlPlane::shared();
    let out = Command::new(cp.kubectl())
        .arg("--kubeconfig")
        .arg(cp.kubeconfig(Cluster::Host, identity))
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

/// The `Ready=False` condition of plugin `name` once the operator has judged its current
/// generation; `None` after [`TIMEOUT`].
async fn not_ready(
    api: &Api<VClusterPlugin>,
    name: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    poll_for(TIMEOUT, || async move {
        let p = api.get(name).await.ok()?;
        let status = p.status.unwrap_or_default();
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .filter(|c| c.status == "False" && status.observed_generation == p.metadata.generation)
    })
    .await
}

/// Write attempts (not dry runs; whatever the answer, refusals included) to workloads and RBAC
/// objects received after `since`, by anyone but the test's setup ([`Identity::Admin`]).
fn protected_writes(since: SystemTime) -> Vec<String> {
    const PROTECTED: [&str; 6] = [
        "/statefulsets",
        "/deployments",
        "/roles",
        "/rolebindings",
        "/clusterroles",
        "/clusterrolebindings",
    ];
    vcp_tests::audited_write_events(ControlPlane::shared(), Cluster::Host)
        .expect("audit log")
        .into_iter()
        .filter(|w| w.received_at >= since)
        .filter(|w| w.user != Identity::Admin.user() && !w.uri.contains("dryRun="))
        .filter(|w| {
            let path = w.uri.split('?').next().unwrap_or_default();
            PROTECTED
                .iter()
                .any(|p| path.contains(&format!("{p}/")) || path.ends_with(p))
        })
        .map(|w| format!("{} {} {} ({})", w.user, w.verb, w.uri, w.code))
        .collect()
}

/// The good plugin's container in the StatefulSet, as JSON.
async fn good_container(admin: &Client) -> Value {
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), NS)
        .get("my-vcluster")
        .await
        .expect("StatefulSet");
    let containers = sts.spec.unwrap().template.spec.unwrap().containers;
    serde_json::to_value(
        containers
            .iter()
            .find(|c| c.name == "good")
            .expect("the good plugin's container"),
    )
    .unwrap()
}

#[tokio::test]
async fn every_attack_is_refused_and_nothing_is_written() {
    let policy = vcluster_plugin_operator::policy::Policy::from_yaml(POLICY).expect("policy");
    let admin =
        vcp_tests::start_shared_operator_with_policy("vcp-test/runtime:attacks", policy).await;
    create_namespace(&admin, NS).await;
    let workload = vcp_tests::vcluster_workload(NS);
    apply_yaml(&admin, &format!("{workload}{NAMESPACE_FIXTURES}"), Some(NS))
        .await
        .expect("namespace fixtures");
    // The operator's own Deployment, as config/manager ships it, in its namespace.
    apply_yaml_file(&admin, "config/manager/manager.yaml", None)
        .await
        .expect("the operator's Deployment");
    for ns in [NS, OPERATOR_NS] {
        bind_tenant_rights(&admin, ns).await;
    }

    // The good plugin, by a tenant.
    let plugins = Api::<VClusterPlugin>::namespaced(admin.clone(), NS);
    let good = std::env::temp_dir().join(format!("vcp-attacks-good-{}.yaml", std::process::id()));
    std::fs::write(&good, GOOD_PLUGIN).unwrap();
    let (ok, out) = kubectl(
        Identity::TenantEdit,
        &["apply", "-n", NS, "-f", &good.to_string_lossy()],
    );
    assert!(ok, "the good plugin is refused: {out}");
    vcp_tests::wait_ready(&admin, NS, "good", "True", None, TIMEOUT).await;
    // Let the good plugin's own writes (workload, RBAC, status, and the no-op re-apply its
    // workload change triggers) settle before counting starts: a reconcile of the poked good
    // plugin finished after them. That nothing was written is asserted below only after the
    // operator is shown to have looked at every attack (its Ready=False for each fixture's
    // generation, and its status writes in the audit log).
    vcp_tests::poke_plugin(&admin, NS, "good", TIMEOUT).await;
    let container_before = good_container(&admin).await;
    let since = SystemTime::now();

    let dir = repo_root().join("tests/fixtures/attacks");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures folder")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let fixtures: Vec<Fixture> = files.iter().map(|p| parse(p)).collect();
    assert!(
        fixtures.len() >= 25,
        "only {} attack fixtures",
        fixtures.len()
    );

    let mut failures = Vec::new();
    let mut outcomes: BTreeMap<String, String> = BTreeMap::new();
    let (mut at_admission, mut by_operator) = (0, 0);
    for f in &fixtures {
        let path = f.path.to_string_lossy().to_string();
        let (ok, out) = kubectl(f.identity, &["apply", "-n", &f.namespace, "-f", &path]);
        let api = Api::<VClusterPlugin>::namespaced(admin.clone(), &f.namespace);
        match &f.expect {
            Expect::Admission(fragment) => {
                if ok {
                    failures.push(format!(
                        "{}: accepted, expected refused at admission",
                        f.file
                    ));
                    kubectl(
                        Identity::Admin,
                        &[
                            "delete",
                            "-n",
                            &f.namespace,
                            "vclusterplugin",
                            &f.name,
                            "--wait=true",
                        ],
                    );
                } else if !out.contains(fragment.as_str()) {
                    failures.push(format!("{}: refused without {fragment:?}: {out}", f.file));
                } else {
                    at_admission += 1;
                    outcomes.insert(f.file.clone(), format!("admission: {}", out.trim()));
                }
                if api.get_opt(&f.name).await.expect("get").is_some() {
                    failures.push(format!("{}: refused, yet stored", f.file));
                }
            }
            Expect::Reason(reason) => {
                if !ok {
                    failures.push(format!("{}: refused at admission: {out}", f.file));
                    continue;
                }
                match not_ready(&api, &f.name).await {
                    None => failures.push(format!("{}: never Ready=False", f.file)),
                    Some(c) if &c.reason != reason => failures.push(format!(
                        "{}: reason {} ({}), expected {reason}",
                        f.file, c.reason, c.message
                    )),
                    Some(c)
                        if f.message
                            .as_ref()
                            .is_some_and(|m| !c.message.contains(m.as_str())) =>
                    {
                        failures.push(format!(
                            "{}: message {:?} lacks {:?}",
                            f.file,
                            c.message,
                            f.message.as_deref().unwrap_or_default()
                        ))
                    }
                    Some(c) => {
                        by_operator += 1;
                        outcomes.insert(f.file.clone(), format!("{}: {}", c.reason, c.message));
                    }
                }
                let (deleted, out) = kubectl(
                    f.identity,
                    &[
                        "delete",
                        "-n",
                        &f.namespace,
                        "vclusterplugin",
                        &f.name,
                        "--wait=true",
                        "--timeout=30s",
                    ],
                );
                if !deleted {
                    failures.push(format!("{}: its author cannot delete it: {out}", f.file));
                }
            }
        }
    }
    for (file, outcome) in &outcomes {
        println!("{file}: {outcome}");
    }
    // Evidence that the operator has worked through everything the attacks queued (their
    // creations and deletions): a reconcile of the poked good plugin finished after them. Only
    // then is the audit log read.
    let reconciles = vcp_tests::poke_plugin(&admin, NS, "good", TIMEOUT).await;
    println!("good plugin reconciled {reconciles} times");

    // The audit log was live and read: every refusal at admission is in it as a refused write
    // of a VClusterPlugin, and every refusal by the operator as its status write.
    let events =
        vcp_tests::audited_write_events(ControlPlane::shared(), Cluster::Host).expect("audit log");
    let refused_in_log = events
        .iter()
        .filter(|w| w.received_at >= since && w.code >= 400)
        .filter(|w| w.uri.contains("/vclusterplugins") && w.user.starts_with("tenant-"))
        .count();
    let operator_status_writes = events
        .iter()
        .filter(|w| w.received_at >= since && w.user == Identity::Operator.user())
        .filter(|w| w.uri.contains("/vclusterplugins/") && w.uri.contains("/status"))
        .count();
    println!(
        "audit log since the first attack: {refused_in_log} refused VClusterPlugin writes by tenants, {operator_status_writes} status writes by the operator"
    );
    assert!(
        refused_in_log >= at_admission,
        "the audit log misses refusals"
    );
    assert!(
        by_operator == 0 || operator_status_writes >= by_operator,
        "the audit log misses the operator's status writes"
    );
    let writes = protected_writes(since);
    // Written to the process's stderr, not through the test harness's capture, so that the
    // counts are in the output of a passing run too.
    let _ = writeln!(
        std::io::stderr(),
        "attack corpus: {} fixtures, {at_admission} refused at admission, {by_operator} refused by the operator, {} failures, {} write attempts on workloads or RBAC",
        fixtures.len(),
        failures.len(),
        writes.len()
    );
    let good = plugins.get("good").await.expect("the good plugin");
    assert!(
        good.status.as_ref().is_some_and(|s| s
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")),
        "the good plugin lost Ready: {:?}",
        good.status
    );
    assert_eq!(
        good_container(&admin).await,
        container_before,
        "the good plugin's container changed"
    );
    assert!(
        writes.is_empty(),
        "write attempts on workloads or RBAC during the attacks:\n{}",
        writes.join("\n")
    );
    assert!(
        failures.is_empty(),
        "{} of {} attacks not refused as expected:\n{}",
        failures.len(),
        fixtures.len(),
        failures.join("\n")
    );
    assert_eq!(at_admission + by_operator, fixtures.len());
}
