//! `config/` against the local control plane's host cluster, with kubectl as a user runs it:
//! `kubectl apply -k config/default` installs the CRDs, the operator's RBAC and its Deployment;
//! every sample passes a server-side dry run; `kubectl explain` and `kubectl get` show what
//! the CRD promises.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use vcp_tests::{Cluster, ControlPlane, Identity, repo_root};

const NAMESPACE: &str = "vcp-system";
const OPERATOR: &str = "vcluster-plugin-operator";

/// The kubectl `scripts/control-plane` chose (the machine's own, else the one it built), as
/// written in the first `PATH` entry of the control plane's `env` file.
fn kubectl_binary(cp: &ControlPlane) -> PathBuf {
    let env = std::fs::read_to_string(cp.dir().join("env")).unwrap_or_default();
    env.lines()
        .find_map(|l| l.strip_prefix("export PATH="))
        .and_then(|p| p.split(':').next())
        .map(|dir| PathBuf::from(dir).join("kubectl"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("kubectl"))
}

/// Runs kubectl as the host cluster's admin from the repository root, `stdin` piped in.
fn kubectl_with_input(args: &[&str], stdin: Option<&str>) -> Output {
    let cp = ControlPlane::shared();
    let mut cmd = Command::new(kubectl_binary(cp));
    cmd.arg("--kubeconfig")
        .arg(cp.kubeconfig(Cluster::Host, Identity::Admin))
        .args(args)
        .current_dir(repo_root())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run kubectl");
    if let Some(input) = stdin {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write kubectl stdin");
    }
    child.wait_with_output().expect("wait for kubectl")
}

/// Runs kubectl and returns its stdout; panics with stdout and stderr when it fails.
fn kubectl(args: &[&str]) -> String {
    let out = kubectl_with_input(args, None);
    expect_success(args, &out)
}

fn expect_success(args: &[&str], out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {} failed ({}):\n{stdout}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Retries `kubectl args` for up to 60 s until it succeeds (the API server publishes a new
/// CRD's discovery and OpenAPI a little after it is Established).
fn kubectl_eventually(args: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = kubectl_with_input(args, None);
        if out.status.success() || Instant::now() > deadline {
            return expect_success(args, &out);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `kubectl apply -k config/default`, once per test binary, then waits for the CRDs to be
/// Established; returns what the apply printed.
fn install() -> &'static str {
    static INSTALLED: OnceLock<String> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let out = kubectl(&["apply", "-k", "config/default"]);
        kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/vclusterplugins.vcp.dev",
        ]);
        out
    })
}

#[tokio::test]
async fn default_installs_crds_rbac_and_a_hardened_operator_deployment() {
    let printed = install();
    for object in [
        "namespace/vcp-system",
        "customresourcedefinition.apiextensions.k8s.io/vclusterplugins.vcp.dev",
        "serviceaccount/vcluster-plugin-operator",
        "clusterrole.rbac.authorization.k8s.io/vcluster-plugin-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/vcluster-plugin-operator",
        "service/vcluster-plugin-operator-metrics",
        "deployment.apps/vcluster-plugin-operator",
        "networkpolicy.networking.k8s.io/vcluster-plugin-operator-allow-metrics",
    ] {
        assert!(
            printed
                .lines()
                .any(|l| l.starts_with(&format!("{object} "))),
            "`kubectl apply -k config/default` did not apply {object}:\n{printed}"
        );
    }

    // The tutorial's Car CRD is an example (config/samples/crd), not part of the install.
    assert!(
        !printed.contains("cars.example.loft.sh"),
        "`kubectl apply -k config/default` applied the tutorial's Car CRD:\n{printed}"
    );

    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;

    for name in ["vclusterplugins.vcp.dev"] {
        let crd = Api::<CustomResourceDefinition>::all(client.clone())
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get CRD {name}: {e}"));
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established, "CRD {name} is not Established");
    }

    Api::<Namespace>::all(client.clone())
        .get(NAMESPACE)
        .await
        .expect("namespace vcp-system");
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .get(OPERATOR)
        .await
        .expect("the operator's ServiceAccount in vcp-system");
    let part_of = sa
        .metadata
        .labels
        .unwrap_or_default()
        .get("app.kubernetes.io/part-of")
        .cloned();
    assert_eq!(part_of.as_deref(), Some(OPERATOR), "config/default labels");

    let role = Api::<ClusterRole>::all(client.clone())
        .get(OPERATOR)
        .await
        .expect("the operator's ClusterRole");
    let rules = role.rules.unwrap_or_default();
    assert!(
        rules.iter().any(|r| {
            r.api_groups.as_deref().unwrap_or_default() == ["vcp.dev"]
                && r.resources
                    .as_deref()
                    .unwrap_or_default()
                    .contains(&"vclusterplugins".to_string())
        }),
        "the ClusterRole grants nothing on vclusterplugins: {rules:?}"
    );
    let binding = Api::<ClusterRoleBinding>::all(client.clone())
        .get(OPERATOR)
        .await
        .expect("the operator's ClusterRoleBinding");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, OPERATOR);
    let subjects = binding.subjects.unwrap_or_default();
    assert!(
        subjects.iter().any(|s| s.kind == "ServiceAccount"
            && s.name == OPERATOR
            && s.namespace.as_deref() == Some(NAMESPACE)),
        "the ClusterRoleBinding does not bind the operator's ServiceAccount: {subjects:?}"
    );

    let service = Api::<Service>::namespaced(client.clone(), NAMESPACE)
        .get("vcluster-plugin-operator-metrics")
        .await
        .expect("the operator's metrics Service");
    let ports = service.spec.and_then(|s| s.ports).unwrap_or_default();
    assert!(
        ports.iter().any(|p| p.port == 8080
            && p.target_port
                == Some(
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(
                        "http".into()
                    )
                )),
        "{ports:?}"
    );

    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(OPERATOR)
        .await
        .expect("the operator's Deployment in vcp-system");
    // The NetworkPolicy selects the operator's pods (the Deployment's template labels) and
    // lets in only port 8080 from namespaces labelled `metrics: enabled`.
    let policy = Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
        client.clone(),
        NAMESPACE,
    )
    .get("vcluster-plugin-operator-allow-metrics")
    .await
    .expect("the operator's NetworkPolicy");
    let policy = policy.spec.expect("NetworkPolicy spec");
    let template_labels = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let selected = policy
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    assert!(
        !selected.is_empty()
            && selected
                .iter()
                .all(|(k, v)| template_labels.get(k) == Some(v)),
        "the NetworkPolicy's podSelector {selected:?} does not select the operator's pods {template_labels:?}"
    );
    assert_eq!(
        policy.policy_types.as_deref(),
        Some(&["Ingress".to_string()][..])
    );
    let ingress = policy.ingress.unwrap_or_default();
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    let ports: Vec<_> = ingress[0]
        .ports
        .iter()
        .flatten()
        .map(|p| p.port.clone())
        .collect();
    assert_eq!(
        ports,
        [Some(
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8080)
        )]
    );
    let from = ingress[0].from.clone().unwrap_or_default();
    assert_eq!(from.len(), 1, "{from:?}");
    assert_eq!(
        from[0]
            .namespace_selector
            .as_ref()
            .and_then(|n| n.match_labels.clone())
            .unwrap_or_default()
            .get("metrics")
            .map(String::as_str),
        Some("enabled")
    );
    let pod = deployment
        .spec
        .expect("deployment spec")
        .template
        .spec
        .expect("pod spec");
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some(OPERATOR),
        "the Deployment must run as the ServiceAccount the ClusterRoleBinding binds"
    );
    let pod_security = pod.security_context.expect("pod securityContext");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert!(pod_security.run_as_user.is_some_and(|uid| uid != 0));
    assert_eq!(
        pod_security.seccomp_profile.map(|p| p.type_).as_deref(),
        Some("RuntimeDefault")
    );
    assert_eq!(pod.containers.len(), 1, "{:?}", pod.containers);
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some(concat!(
            "ghcr.io/vcp-dev/vcluster-plugin-operator:",
            env!("CARGO_PKG_VERSION")
        ))
    );
    assert!(
        c.args
            .as_deref()
            .unwrap_or_default()
            .contains(&"--leader-elect".to_string()),
        "{:?}",
        c.args
    );
    let security = c
        .security_context
        .clone()
        .expect("container securityContext");
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.privileged, None);
    assert_eq!(
        security.capabilities.and_then(|c| c.drop),
        Some(vec!["ALL".to_string()])
    );
    let resources = c.resources.clone().expect("resources");
    for (what, list) in [
        ("requests", &resources.requests),
        ("limits", &resources.limits),
    ] {
        let list = list.clone().unwrap_or_default();
        assert!(
            list.contains_key("cpu") || what == "limits",
            "no cpu {what}"
        );
        assert!(list.contains_key("memory"), "no memory {what}");
    }
    let ports = c.ports.clone().unwrap_or_default();
    assert!(
        ports
            .iter()
            .any(|p| p.name.as_deref() == Some("http") && p.container_port == 8080),
        "{ports:?}"
    );
    let http = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into());
    for (probe, path) in [
        (c.liveness_probe.clone(), "/healthz"),
        (c.readiness_probe.clone(), "/readyz"),
    ] {
        let get = probe
            .and_then(|p| p.http_get)
            .unwrap_or_else(|| panic!("no httpGet probe on {path}"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, http);
    }

    // Applying again changes nothing: every object is reported `unchanged`.
    let again = kubectl(&["apply", "-k", "config/default"]);
    let changed: Vec<&str> = again
        .lines()
        .filter(|l| !l.ends_with(" unchanged"))
        .collect();
    assert!(
        changed.is_empty(),
        "a second apply changed objects: {changed:?}"
    );
}

/// The VClusterPlugin sample files, as `config/samples/kustomization.yaml` lists them.
fn samples() -> Vec<String> {
    let dir = repo_root().join("config/samples");
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).expect("read kustomization");
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("parse kustomization");
    let mut listed: Vec<String> = doc["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_string())
        .collect();
    listed.sort();
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .expect("read config/samples")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml") && f != "kustomization.yaml")
        .collect();
    present.sort();
    assert_eq!(
        listed, present,
        "config/samples/kustomization.yaml must list every sample"
    );
    listed
}

#[tokio::test]
async fn every_sample_passes_a_server_side_dry_run() {
    install();
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::create_namespace(&client, "my-vcluster").await;

    let samples = samples();
    assert!(samples.len() >= 3, "{samples:?}");
    let mut kinds = Vec::new();
    for sample in &samples {
        let path = format!("config/samples/{sample}");
        let text = std::fs::read_to_string(repo_root().join(&path)).expect("read sample");
        let plugin: vcp_crds::VClusterPlugin =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        kinds.push((
            plugin.spec.image.is_some(),
            !plugin.spec.synced_types.is_empty(),
            !plugin.spec.hooks.is_empty(),
        ));
        let args = ["apply", "--dry-run=server", "-f", path.as_str()];
        let printed = kubectl_eventually(&args);
        assert!(
            printed.contains("(server dry run)"),
            "kubectl {}: {printed}",
            args.join(" ")
        );
    }
    // The three kinds of plugin: the tutorial's Car syncer (embedded runtime), an image, hooks only.
    assert!(kinds.contains(&(false, true, true)), "{kinds:?}");
    assert!(
        kinds.iter().any(|k| k.0),
        "no image plugin sample: {kinds:?}"
    );
    assert!(
        kinds.contains(&(false, false, true)),
        "no hooks-only sample: {kinds:?}"
    );

    // The whole kustomization too; and a dry run creates nothing.
    let printed = kubectl_eventually(&["apply", "--dry-run=server", "-k", "config/samples"]);
    assert_eq!(
        printed.matches("(server dry run)").count(),
        samples.len(),
        "{printed}"
    );
    let listed = kubectl(&["get", "vclusterplugins", "-n", "my-vcluster", "-o", "name"]);
    assert_eq!(listed.trim(), "", "a dry run must not create objects");
}

#[tokio::test]
async fn explain_describes_the_hooks() {
    install();
    let explained = kubectl_eventually(&["explain", "vclusterplugin.spec.hooks"]);
    // kubectl wraps descriptions at 80 columns: compare with whitespace runs collapsed.
    let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let words = flat(&explained);
    for text in [
        "GROUP: vcp.dev",
        "KIND: VClusterPlugin",
        "VERSION: v1alpha1",
        "FIELD: hooks <[]Object>",
        "Mutations applied to objects on their way between the virtual cluster and the host",
        "events <[]string> -required-",
        "Events on which the hook runs",
        "jsonPatch <[]Object>",
        "RFC 6902 JSON Patch operations",
        "removeLabels <[]string>",
        "Label keys to remove",
    ] {
        assert!(
            words.contains(text),
            "`kubectl explain vclusterplugin.spec.hooks` lacks {text:?}:\n{explained}"
        );
    }
    let deeper = kubectl_eventually(&["explain", "vcp.status.conditions"]);
    assert!(
        flat(&deeper)
            .contains("Conditions `Ready`, `WorkloadPatched`, `RBACReady`, `RuntimeHealthy`"),
        "{deeper}"
    );
}

#[tokio::test]
async fn get_prints_the_documented_columns() {
    install();
    let cp = ControlPlane::shared();
    let client = cp.client(Cluster::Host, Identity::Admin).await;
    let ns = "vcp-columns";
    vcp_tests::create_namespace(&client, ns).await;
    let sample = std::fs::read_to_string(repo_root().join("config/samples/car-plugin.yaml"))
        .expect("read sample")
        .replace("namespace: my-vcluster", &format!("namespace: {ns}"));
    let args = ["apply", "-f", "-"];
    let out = kubectl_with_input(&args, Some(&sample));
    expect_success(&args, &out);

    // What the operator and the runtime would report (no operator runs in this test).
    let status = serde_json::json!({"status": {
        "observedGeneration": 1,
        "phase": "Ready",
        "runtime": "embedded",
        "syncedTotal": 3,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "Installed", "message": "installed",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1
        }]
    }})
    .to_string();
    kubectl(&[
        "patch",
        "vclusterplugin",
        "car-sync",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status,
    ]);

    for resource in ["vclusterplugins", "vcp", "vcluster"] {
        let printed = kubectl_eventually(&["get", resource, "-n", ns]);
        let mut lines = printed.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            header,
            [
                "NAME", "VCLUSTER", "RUNTIME", "READY", "PHASE", "SYNCED", "AGE"
            ],
            "kubectl get {resource}:\n{printed}"
        );
        let row: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            row.get(..6),
            Some(&["car-sync", "my-vcluster", "embedded", "True", "Ready", "3"][..]),
            "kubectl get {resource}:\n{printed}"
        );
        assert_eq!(row.len(), 7, "{printed}");
        assert!(lines.next().is_none(), "{printed}");
    }
}

/// `config/default` installs both admission policies of the trust model, and the API server
/// enforces them as shipped: the operator's ServiceAccount may not bind `cluster-admin`, and a
/// tenant may not ask for a plugin in a vCluster whose StatefulSet they may neither update nor
/// patch.
#[tokio::test]
async fn default_installs_the_enforced_admission_policies() {
    let printed = install();
    for object in [
        "validatingadmissionpolicy.admissionregistration.k8s.io/vcp-plugin-requester",
        "validatingadmissionpolicy.admissionregistration.k8s.io/vcp-plugin-requester-changes",
        "validatingadmissionpolicy.admissionregistration.k8s.io/vcluster-plugin-operator-bounds",
        "validatingadmissionpolicy.admissionregistration.k8s.io/vcp-plugin-free-form-depth",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/vcp-plugin-requester-0",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/vcp-plugin-requester-1",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/vcp-plugin-requester-2",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/vcp-plugin-requester-changes",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/vcluster-plugin-operator-bounds",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/vcp-plugin-free-form-depth",
        "configmap/vcp-plugin-requester-0",
    ] {
        assert!(
            printed
                .lines()
                .any(|l| l.starts_with(&format!("{object} "))),
            "`kubectl apply -k config/default` did not apply {object}:\n{printed}"
        );
    }
    let cp = ControlPlane::shared();
    let admin = cp.client(Cluster::Host, Identity::Admin).await;
    let operator = cp
        .service_account_client(Cluster::Host, NAMESPACE, OPERATOR)
        .await
        .expect("a token of the operator's ServiceAccount");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "operator-is-admin" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE }],
    }))
    .unwrap();
    let dry = kube::api::PostParams {
        dry_run: true,
        field_manager: None,
    };
    // A new policy takes effect within a few seconds of its creation.
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match Api::<ClusterRoleBinding>::all(operator.clone())
            .create(&dry, &binding)
            .await
        {
            Err(kube::Error::Api(e)) if e.message.contains("vcluster-plugin-operator-bounds") => {
                break e.message;
            }
            other if Instant::now() > deadline => {
                panic!("the operator's ServiceAccount binds cluster-admin: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    assert!(
        refused.contains("may only create the RBAC objects it makes for a plugin"),
        "{refused}"
    );

    let ns = "config-tenants";
    vcp_tests::create_namespace(&admin, ns).await;
    vcp_tests::bind_tenant_rights(&admin, ns).await;
    let tenant = cp.client(Cluster::Host, Identity::TenantNoPatch).await;
    let plugin: vcp_crds::VClusterPlugin = serde_json::from_value(serde_json::json!({
        "apiVersion": "vcp.dev/v1alpha1", "kind": "VClusterPlugin",
        "metadata": { "name": "p", "namespace": ns },
        "spec": { "vcluster": { "name": "lookalike" }, "image": "example.com/p:1" },
    }))
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match Api::<vcp_crds::VClusterPlugin>::namespaced(tenant.clone(), ns)
            .create(&dry, &plugin)
            .await
        {
            Err(kube::Error::Api(e)) if e.message.contains("vcp-plugin-requester") => {
                break e.message;
            }
            other if Instant::now() > deadline => {
                panic!("tenant-nopatch creates a plugin: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    assert!(
        refused.contains(&format!(
            "spec.vcluster.name needs update or patch on apps/statefulsets named lookalike in namespace {ns}"
        )),
        "{refused}"
    );
}

/// The GitHub anchor of a heading's text: lower case, each space a `-`, every character but
/// letters, digits, `-` and `_` dropped (GitHub's rendering of Markdown headings).
fn anchor_of(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The anchors of a Markdown text's headings (a repeated heading's later ones get `-1`, `-2`,
/// ... as on GitHub) and its relative link targets (outside code: a link in a code block or
/// span is not a link), in the order they appear.
fn headings_and_links(text: &str) -> (Vec<String>, Vec<String>) {
    use pulldown_cmark::{Event, Parser, Tag, TagEnd};
    let (mut anchors, mut links) = (Vec::<String>::new(), Vec::new());
    let mut heading: Option<String> = None;
    for event in Parser::new(text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => {
                let base = anchor_of(heading.take().unwrap_or_default().trim());
                let seen = anchors
                    .iter()
                    .filter(|a| {
                        **a == base
                            || a.strip_prefix(&format!("{base}-"))
                                .is_some_and(|n| n.parse::<u32>().is_ok())
                    })
                    .count();
                anchors.push(if seen == 0 {
                    base
                } else {
                    format!("{base}-{seen}")
                });
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Start(Tag::Link { dest_url, .. }) => {
                let url = dest_url.to_string();
                if !url.contains("://") && !url.starts_with("mailto:") {
                    links.push(url);
                }
            }
            _ => {}
        }
    }
    (anchors, links)
}

#[test]
fn anchors_and_links_are_read_as_github_renders_them() {
    let (anchors, links) = headings_and_links(
        "# The two commands\n## `VCP_RUNTIME_IMAGE` and the overlay\n## Install\n## Install\n\
         [a](docs/a.md#install) [web](https://example.com) `[not](x.md)`\n\n```\n[nor](y.md)\n```\n",
    );
    assert_eq!(
        anchors,
        [
            "the-two-commands",
            "vcp_runtime_image-and-the-overlay",
            "install",
            "install-1"
        ]
    );
    assert_eq!(links, ["docs/a.md#install"]);
}

/// Every relative link of the repository's Markdown files (README, docs/, the others git
/// tracks; the vendored C library's own excepted) names a file or folder that exists, and its
/// `#anchor`, when it has one, a heading of that file.
#[test]
fn every_relative_link_of_the_docs_resolves() {
    let root = repo_root();
    let listed = Command::new("git")
        .args(["ls-files", "*.md"])
        .current_dir(&root)
        .output()
        .expect("git ls-files");
    assert!(listed.status.success(), "git ls-files: {listed:?}");
    let files: Vec<PathBuf> = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .filter(|f| !f.contains("/vendor/"))
        .map(|f| root.join(f))
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with("README.md")) && files.len() >= 10,
        "the Markdown files read: {files:?}"
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let (own_anchors, links) = headings_and_links(&text);
        for link in links {
            checked += 1;
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", file.display()));
                continue;
            }
            if anchor.is_empty() || target.is_dir() {
                continue;
            }
            let anchors = if path.is_empty() {
                own_anchors.clone()
            } else if target.extension().is_some_and(|e| e == "md") {
                headings_and_links(&std::fs::read_to_string(&target).unwrap()).0
            } else {
                // a line anchor into a source file (`#L10`) is not checked
                continue;
            };
            if !anchors.iter().any(|a| a == anchor) {
                broken.push(format!("{}: {link} (no such heading)", file.display()));
            }
        }
    }
    assert!(checked >= 50, "only {checked} relative links read");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// `scripts/bundle`, the release bundle: one manifest holding exactly the objects that
/// `kubectl apply -k config/default` applied (as kubectl named them, `kind.group/name`), its
/// Deployment running the image of the workspace's version, the version every image reference
/// of the docs uses.
#[tokio::test]
async fn the_release_bundle_holds_what_config_default_installs_at_the_workspace_version() {
    let printed = install();
    let applied: std::collections::BTreeSet<String> = printed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(applied.len() >= 10, "applied: {applied:?}");

    let dir = std::env::temp_dir().join(format!("vcp-bundle-{}", std::process::id()));
    let out = dir.join("install.yaml");
    let bundle = Command::new(repo_root().join("scripts/bundle"))
        .arg(&out)
        .env("KUBECTL", kubectl_binary(ControlPlane::shared()))
        .output()
        .expect("run scripts/bundle");
    assert!(bundle.status.success(), "scripts/bundle: {bundle:?}");
    let text = std::fs::read_to_string(&out).expect("the bundle");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        text.starts_with(&format!("# vcluster-plugin-operator {version}:")),
        "the bundle's first line names the version: {}",
        text.lines().next().unwrap_or_default()
    );
    let documents: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("a YAML document"))
        .collect();
    let bundled: std::collections::BTreeSet<String> = documents
        .iter()
        .map(|doc| {
            let kind = doc["kind"].as_str().unwrap().to_lowercase();
            let name = doc["metadata"]["name"].as_str().unwrap();
            match doc["apiVersion"].as_str().unwrap().split_once('/') {
                Some((group, _)) => format!("{kind}.{group}/{name}"),
                None => format!("{kind}/{name}"),
            }
        })
        .collect();
    assert_eq!(bundled, applied, "the bundle's objects vs config/default's");

    let image = documents
        .iter()
        .find(|doc| doc["kind"] == "Deployment")
        .and_then(|doc| doc["spec"]["template"]["spec"]["containers"][0]["image"].as_str())
        .expect("the operator's image in the bundle");
    assert_eq!(
        image,
        format!("ghcr.io/vcp-dev/vcluster-plugin-operator:{version}")
    );

    // The docs' image references (`...vcluster-plugin-operator:<tag>` with a numeric tag).
    let listed = Command::new("git")
        .args(["ls-files", "*.md"])
        .current_dir(repo_root())
        .output()
        .expect("git ls-files");
    let mut tags = Vec::new();
    for file in String::from_utf8(listed.stdout).unwrap().lines() {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        for (at, _) in text.match_indices("vcluster-plugin-operator:") {
            let tag: String = text[at + "vcluster-plugin-operator:".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
                .collect();
            if tag.starts_with(|c: char| c.is_ascii_digit()) {
                tags.push((file.to_string(), tag));
            }
        }
    }
    assert!(
        !tags.is_empty(),
        "no image reference with a version in the docs"
    );
    let other: Vec<_> = tags.iter().filter(|(_, tag)| tag != version).collect();
    assert!(
        other.is_empty(),
        "image references of another version than {version}: {other:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
