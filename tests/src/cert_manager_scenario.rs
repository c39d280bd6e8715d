//! The cert-manager story (the README, "The cert-manager example"), end to end, with the real
//! cert-manager ([`crate::cert_manager`]) on the host, the plugin installed by the real
//! operator ([`crate::plugins::start_shared_operator`]) into vCluster's chart-rendered
//! StatefulSet, and the embedded runtime in-process ([`crate::runtime::start_runtime`]) with a
//! token of the service account the operator bound: on the host it holds exactly the RBAC the
//! operator derived from the plugin (the synced, referenced and produced kinds), nothing
//! written by the test. Shared by `tests/tests/e2e_cert_manager.rs` (the plugin written by
//! hand, as the README shows it) and `tests/tests/e2e_cert_manager_import.rs` (the plugin
//! `vcluster-plugin-operator import` makes of a `vcluster.yaml`), each in its own test binary
//! and so its own virtual cluster and operator (a plugin without a selector syncs every
//! Certificate of the virtual cluster).
//!
//! The expected host names come from vCluster's own code (the translate oracle,
//! [`crate::oracle::vcluster_host_name`]); what is issued comes from cert-manager's own
//! controllers; the test only writes virtual objects (and, once, does on the host what
//! `cmctl renew` does).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use vcp_crds::VClusterPlugin;
use vcp_syncer_runtime::PodSync;

use crate::audit::Audit;
use crate::cert_manager::{CertManager, cert_manager_resource, condition_status, tls_dns_names};
use crate::control_plane::{Cluster, ControlPlane, Identity};
use crate::fixtures::{apply_yaml, create_namespace, vcluster_workload};
use crate::oracle::vcluster_host_name;
use crate::plugins::{condition, create_plugin, start_shared_operator, wait_ready};
use crate::real_crds::{cert_manager_crd_files, install_crd_files};
use crate::runtime::{Runtime, World, start_runtime, syncer_is_cluster_admin};
use crate::vcluster_syncer::VCLUSTER_RELEASE;
use crate::wait::{poll_for, wait_for};

/// How long each step waits (cert-manager issues a self-signed certificate in about a second).
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The two virtual namespaces, each with the same Issuer, Certificate and Secret names.
pub const NAMESPACES: [&str; 2] = ["cm-team-a", "cm-team-b"];

/// The plugin of the README and of the common brief: Issuers, and Certificates with their status,
/// `secretName` and `issuerRef.name` as `reference` patches, and the issued Secret brought back,
/// for vCluster `vcluster`.
pub fn readme_spec(vcluster: &str) -> Value {
    json!({
        "vcluster": {"name": vcluster},
        "syncedTypes": [
            {"apiVersion": "cert-manager.io/v1", "kind": "Issuer",
             "patches": [
                {"path": "spec", "expression": "({selfSigned: value.selfSigned, ca: value.ca})"},
                {"path": "spec.ca.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}}
             ]},
            {"apiVersion": "cert-manager.io/v1", "kind": "Certificate", "syncStatus": true,
             "patches": [
                {"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}},
                {"path": "spec.issuerRef.name",
                 "reference": {"apiVersion": "cert-manager.io/v1", "kind": "Issuer"}}
             ],
             "produced": [{"apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName"}]}
        ]
    })
}

/// The plugin's name (in the vCluster's host namespace).
pub const PLUGIN: &str = "cert-manager";

/// The embedded runtime's image the operator writes into the vCluster's StatefulSet (nothing runs
/// it: the runtime runs in-process).
const RUNTIME_IMAGE: &str = "vcp-test/runtime:cert-manager";

/// What the story runs with: the runtime's world, and the identity the operator bound.
struct Installed {
    world: World,
    /// A host client with a token of the service account the operator bound.
    runtime_host: Client,
    /// That account's user name, as the audit log records it.
    runtime_user: String,
}

/// Installs the plugin `spec` for the vCluster [`VCLUSTER_RELEASE`] in host namespace
/// `vc-<test>` through the operator, and starts the runtime as it would run there:
/// - cert-manager's CRDs in the virtual cluster (the host has them from [`CertManager::shared`]),
///   the virtual namespaces [`NAMESPACES`];
/// - vCluster's chart-rendered ServiceAccount, Secret, Service and StatefulSet in the host
///   namespace, without the chart's RBAC: the pod's account holds only what the operator grants;
/// - the plugin created, and the operator's acceptance awaited: `Ready=True` for its generation;
/// - the runtime on the host with a token of the account the operator bound (the subject of the
///   plugin's RoleBinding, asserted to be the pod template's `vc-<release>`), and in the virtual
///   cluster as `vcp-syncer` bound to `cluster-admin` there, what vCluster hands its plugins (its
///   own virtual admin config), kept apart from the test's own writes in the audit log.
async fn install(test: &str, spec: Value) -> Installed {
    let cp = ControlPlane::shared();
    let admin = start_shared_operator(RUNTIME_IMAGE).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    install_crd_files(&virtual_, &cert_manager_crd_files()).await;
    for ns in NAMESPACES {
        create_namespace(&virtual_, ns).await;
    }
    syncer_is_cluster_admin(&virtual_).await;
    let host_ns = format!("vc-{test}");
    create_namespace(&admin, &host_ns).await;
    apply_yaml(&admin, &vcluster_workload(&host_ns), Some(&host_ns))
        .await
        .expect("vCluster's chart-rendered workload");
    create_plugin(&admin, &host_ns, PLUGIN, spec).await;
    wait_ready(&admin, &host_ns, PLUGIN, "True", None, TIMEOUT).await;
    let binding = Api::<RoleBinding>::namespaced(admin.clone(), &host_ns)
        .get(&format!("vcp-plugin-{PLUGIN}"))
        .await
        .expect("the plugin's RoleBinding, written by the operator");
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(subjects[0].kind, "ServiceAccount");
    let account = subjects[0].name.clone();
    assert_eq!(
        account,
        format!("vc-{VCLUSTER_RELEASE}"),
        "the pod template's service account"
    );
    let runtime_host = cp
        .service_account_client(Cluster::Host, &host_ns, &account)
        .await
        .expect("a token of the account the operator bound");
    let Runtime {
        task: runtime,
        reconciles,
        metrics,
    } = start_story_runtime(cp, runtime_host.clone(), &host_ns).await;
    Installed {
        world: World {
            host: admin,
            virtual_,
            host_ns: host_ns.clone(),
            vcluster: VCLUSTER_RELEASE.to_string(),
            selector: test.to_string(),
            runtime,
            reconciles,
            metrics,
        },
        runtime_host,
        runtime_user: format!("system:serviceaccount:{host_ns}:{account}"),
    }
}

/// Starts the runtime of [`PLUGIN`] in `host_ns` with `host` (the bound account) and the virtual
/// cluster as `vcp-syncer`.
async fn start_story_runtime(cp: &ControlPlane, host: Client, host_ns: &str) -> Runtime {
    start_runtime(
        host,
        cp.client(Cluster::Virtual, Identity::Syncer).await,
        host_ns,
        PLUGIN,
        |config| {
            config.status_interval = Duration::from_millis(300);
            config.pod_sync = PodSync::Hooks;
        },
    )
}

/// Waits until the plugin is `Ready=True` with the runtime's `RuntimeHealthy=True`, both for its
/// current generation: the operator installed it and the runtime, holding only the RBAC the
/// operator derived, syncs every object (a denied list, watch or write makes it report
/// `RuntimeHealthy=False` and so `Ready=False`). Returns the two conditions' reasons.
///
/// # Panics
/// After [`TIMEOUT`], showing the status as last seen.
async fn ready_and_healthy(admin: &Client, ns: &str) -> (String, String) {
    let api = Api::<VClusterPlugin>::namespaced(admin.clone(), ns);
    let found = poll_for(TIMEOUT, || async {
        let p = api.get(PLUGIN).await.ok()?;
        let ready = condition(&p, "Ready")?;
        let healthy = condition(&p, "RuntimeHealthy")?;
        (ready.status == "True"
            && healthy.status == "True"
            && p.status.as_ref()?.observed_generation == p.metadata.generation
            && healthy.observed_generation == p.metadata.generation)
            .then(|| (ready.reason.clone(), healthy.reason.clone()))
    })
    .await;
    match found {
        Some(reasons) => reasons,
        None => panic!(
            "{ns}/{PLUGIN}: not Ready=True with RuntimeHealthy=True within {TIMEOUT:?}; its status: {:?}",
            api.get(PLUGIN).await.ok().and_then(|p| p.status)
        ),
    }
}

/// The story's names in one virtual namespace, and their host names from vCluster's oracle.
struct Names {
    ns: &'static str,
    issuer_host: String,
    web_host: String,
    web_tls_host: String,
    api_host: String,
    api_tls_host: String,
}

impl Names {
    fn new(ns: &'static str, vcluster: &str) -> Names {
        Names {
            ns,
            issuer_host: vcluster_host_name("selfsigned", ns, vcluster),
            web_host: vcluster_host_name("web", ns, vcluster),
            web_tls_host: vcluster_host_name("web-tls", ns, vcluster),
            api_host: vcluster_host_name("api", ns, vcluster),
            api_tls_host: vcluster_host_name("api-tls", ns, vcluster),
        }
    }
}

/// A step's objects and clients.
struct Story {
    world: World,
    /// The user the runtime acts as on the host (the account the operator bound).
    runtime_user: String,
    host_certificates: Api<DynamicObject>,
    host_issuers: Api<DynamicObject>,
    host_secrets: Api<Secret>,
}

impl Story {
    fn virtual_api(&self, ns: &str, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.world.virtual_.clone(),
            ns,
            &cert_manager_resource(kind),
        )
    }

    fn virtual_secrets(&self, ns: &str) -> Api<Secret> {
        Api::namespaced(self.world.virtual_.clone(), ns)
    }

    /// Creates or updates virtual Certificate `name` in `ns` (server-side apply as a user would),
    /// retrying while the virtual API server's discovery has not caught up with the CRD.
    async fn put_certificate(&self, ns: &str, name: &str, secret: &str, dns_names: &[String]) {
        let api = self.virtual_api(ns, "Certificate");
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"secretName": secret, "dnsNames": dns_names,
                     "issuerRef": {"name": "selfsigned", "kind": "Issuer", "group": "cert-manager.io"}}
        }))
        .expect("Certificate");
        wait_for(TIMEOUT, || {
            let (api, obj) = (api.clone(), obj.clone());
            async move {
                api.patch(
                    name,
                    &PatchParams::apply("e2e-user").force(),
                    &Patch::Apply(&obj),
                )
                .await
                .ok()
            }
        })
        .await;
    }

    async fn put_issuer(&self, ns: &str) {
        let api = self.virtual_api(ns, "Issuer");
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": {"name": "selfsigned", "namespace": ns},
            "spec": {"selfSigned": {}}
        }))
        .expect("Issuer");
        wait_for(TIMEOUT, || {
            let (api, obj) = (api.clone(), obj.clone());
            async move {
                api.patch(
                    "selfsigned",
                    &PatchParams::apply("e2e-user").force(),
                    &Patch::Apply(&obj),
                )
                .await
                .ok()
            }
        })
        .await;
    }

    /// Waits until `api`'s object `name` exists and satisfies `check`.
    ///
    /// # Panics
    /// After [`TIMEOUT`], naming the object and showing it as last seen.
    async fn object_where<K>(api: &Api<K>, name: &str, check: impl Fn(&K) -> bool) -> K
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + kube::Resource,
    {
        match Self::try_object_where(api, name, check).await {
            Some(obj) => obj,
            None => panic!(
                "{}/{name} not as expected within {TIMEOUT:?}; last seen: {:?}",
                api.resource_url(),
                api.get_opt(name).await
            ),
        }
    }

    /// Polls `api` until its object `name` exists and satisfies `check`: the object, or `None`
    /// after [`TIMEOUT`], for a caller that explains the failure itself.
    async fn try_object_where<K>(api: &Api<K>, name: &str, check: impl Fn(&K) -> bool) -> Option<K>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + kube::Resource,
    {
        poll_for(TIMEOUT, || async {
            api.get_opt(name).await.ok().flatten().filter(|o| check(o))
        })
        .await
    }

    /// Waits until `api` has no object `name`.
    ///
    /// # Panics
    /// After [`TIMEOUT`], naming the object.
    async fn gone<K>(api: &Api<K>, name: &str)
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + kube::Resource,
    {
        poll_for(TIMEOUT, || async {
            matches!(api.get_opt(name).await, Ok(None)).then_some(())
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "{}/{name} still there after {TIMEOUT:?}",
                api.resource_url()
            )
        });
    }

    /// The names of `api`'s objects.
    async fn names<K>(api: &Api<K>) -> BTreeSet<String>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + kube::Resource,
    {
        api.list(&Default::default())
            .await
            .expect("list")
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect()
    }

    /// The runtime's successful creates on `cluster` in namespace `ns` of `resource`, by name,
    /// once the audit log holds every request answered before the call.
    async fn runtime_creates(&self, cluster: Cluster, ns: &str, resource: &str) -> Vec<String> {
        let user = match cluster {
            Cluster::Host => self.runtime_user.as_str(),
            Cluster::Virtual => Identity::Syncer.user(),
        };
        let mut names: Vec<String> = Audit::writes()
            .on(cluster)
            .by_user(user)
            .in_namespace(ns)
            .resource(resource)
            .verb("create")
            .caught_up()
            .await
            .succeeded()
            .into_iter()
            .map(|w| w.object_name)
            .collect();
        names.sort();
        names
    }
}

fn dns(ns: &str, host: &str) -> String {
    format!("{host}.{ns}.vcp.test")
}

fn crt(secret: &Secret) -> Vec<u8> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("tls.crt"))
        .map(|b| b.0.clone())
        .unwrap_or_default()
}

fn ready_condition(obj: &DynamicObject) -> Option<Value> {
    obj.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
}

/// Runs the cert-manager story with the plugin `spec` (for vCluster [`VCLUSTER_RELEASE`])
/// installed by the operator into host namespace `vc-<test>` ([`install`]), printing what it
/// proved and how long it took:
///
/// 1. a virtual self-signed Issuer and a Certificate in each of [`NAMESPACES`] become host copies
///    whose `issuerRef.name` and `secretName` name the host copies (the oracle's names);
/// 2. the real cert-manager makes the host Issuer Ready and issues the host Secret;
/// 3. the Secret appears in each virtual namespace under its virtual name, with the certificate
///    for that namespace's DNS name (the namespaces do not collide), and the Certificate's `Ready`
///    condition is synced up; the plugin is `Ready=True` with `RuntimeHealthy=True`: the RBAC
///    the operator derived for the synced, referenced and produced kinds is enough;
/// 4. renewals reach the virtual Secret: a change of `dnsNames` in the virtual cluster, and on
///    the host what `cmctl renew` does (the `Issuing` condition);
/// 5. the runtime stops; meanwhile a Certificate is added and one is renewed; a new runtime
///    converges, and nothing is made twice (the audit log's creates);
/// 6. deleting a virtual Certificate removes its host copy and the Secret that came back, and
///    leaves the other namespace's alone.
///
/// # Panics
/// When a step does not happen within [`TIMEOUT`] or an assertion fails.
pub async fn run(test: &str, spec: Value) {
    let started = Instant::now();
    CertManager::shared().await;
    let cp = ControlPlane::shared();
    let Installed {
        world,
        runtime_host,
        runtime_user,
    } = install(test, spec).await;
    let host = world.host.clone();
    let host_ns = world.host_ns.clone();
    let vcluster = world.vcluster.clone();
    let mut story = Story {
        runtime_user,
        host_certificates: Api::namespaced_with(
            host.clone(),
            &host_ns,
            &cert_manager_resource("Certificate"),
        ),
        host_issuers: Api::namespaced_with(
            host.clone(),
            &host_ns,
            &cert_manager_resource("Issuer"),
        ),
        host_secrets: Api::namespaced(host.clone(), &host_ns),
        world,
    };
    let names: Vec<Names> = NAMESPACES
        .iter()
        .map(|ns| Names::new(ns, &vcluster))
        .collect();
    for n in &names {
        assert_ne!(
            n.web_tls_host, "web-tls",
            "the oracle translates the Secret's name"
        );
    }

    // 1. virtual Issuers and Certificates, the same names in both namespaces
    for n in &names {
        story.put_issuer(n.ns).await;
        story
            .put_certificate(n.ns, "web", "web-tls", &[dns(n.ns, "web")])
            .await;
    }
    for n in &names {
        let copy = Story::object_where(&story.host_certificates, &n.web_host, |_| true).await;
        assert_eq!(
            copy.data["spec"]["secretName"],
            json!(n.web_tls_host),
            "{}: secretName",
            n.ns
        );
        assert_eq!(
            copy.data["spec"]["issuerRef"]["name"],
            json!(n.issuer_host),
            "{}: issuerRef.name",
            n.ns
        );
        assert_eq!(copy.data["spec"]["issuerRef"]["kind"], json!("Issuer"));
        assert_eq!(copy.data["spec"]["dnsNames"], json!([dns(n.ns, "web")]));
        // 2. the real cert-manager: the host Issuer Ready, the host Secret issued
        Story::object_where(&story.host_issuers, &n.issuer_host, |i| {
            condition_status(i, "Ready").as_deref() == Some("True")
        })
        .await;
        let issued =
            Story::object_where(&story.host_secrets, &n.web_tls_host, |s| !crt(s).is_empty()).await;
        assert_eq!(
            tls_dns_names(&issued).expect("X.509"),
            [dns(n.ns, "web")],
            "{}: the host Secret",
            n.ns
        );
        assert_eq!(
            issued.annotations().get("cert-manager.io/certificate-name"),
            Some(&n.web_host),
            "cert-manager issued it for the host copy"
        );
    }
    // 3. the Secret comes back under its virtual name; Ready is synced up
    for n in &names {
        let issued = story
            .host_secrets
            .get(&n.web_tls_host)
            .await
            .expect("host Secret");
        let back = Story::object_where(&story.virtual_secrets(n.ns), "web-tls", |s| {
            crt(s) == crt(&issued)
        })
        .await;
        assert_eq!(back.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(
            tls_dns_names(&back).expect("X.509"),
            [dns(n.ns, "web")],
            "{}: no collision",
            n.ns
        );
        let host_cert = Story::object_where(&story.host_certificates, &n.web_host, |c| {
            condition_status(c, "Ready").as_deref() == Some("True")
        })
        .await;
        let virtual_cert =
            Story::object_where(&story.virtual_api(n.ns, "Certificate"), "web", |c| {
                condition_status(c, "Ready").as_deref() == Some("True")
            })
            .await;
        assert_eq!(
            ready_condition(&virtual_cert),
            ready_condition(&host_cert),
            "{}: Ready synced up",
            n.ns
        );
    }
    let (a, b) = (&names[0], &names[1]);
    let (ready, healthy) = ready_and_healthy(&story.world.host, &host_ns).await;
    println!(
        "cert-manager e2e: issued and back in {:.1} s; the plugin Ready=True ({ready}), RuntimeHealthy=True ({healthy}) with the operator's RBAC only",
        started.elapsed().as_secs_f64()
    );

    // 4a. a renewal from the virtual cluster: new dnsNames
    let renewed_names = vec![dns(a.ns, "web"), dns(a.ns, "www")];
    story
        .put_certificate(a.ns, "web", "web-tls", &renewed_names)
        .await;
    let back = Story::object_where(&story.virtual_secrets(a.ns), "web-tls", |s| {
        tls_dns_names(s).is_ok_and(|d| d == renewed_names)
    })
    .await;
    let host_secret = story
        .host_secrets
        .get(&a.web_tls_host)
        .await
        .expect("host Secret");
    assert_eq!(
        crt(&back),
        crt(&host_secret),
        "the renewed certificate came back"
    );
    // 4b. a renewal on the host, as `cmctl renew` makes it: the Issuing condition
    let before = crt(&story
        .virtual_secrets(b.ns)
        .get("web-tls")
        .await
        .expect("b's Secret"));
    renew_on_host(&story.host_certificates, &b.web_host).await;
    let back = Story::object_where(&story.virtual_secrets(b.ns), "web-tls", |s| {
        crt(s) != before
    })
    .await;
    let host_secret = story
        .host_secrets
        .get(&b.web_tls_host)
        .await
        .expect("host Secret");
    assert_eq!(
        crt(&back),
        crt(&host_secret),
        "the reissued certificate came back"
    );

    // 5. restart mid-way
    story.world.runtime.abort();
    let _ = (&mut story.world.runtime).await;
    let uid_b = story
        .virtual_secrets(b.ns)
        .get("web-tls")
        .await
        .expect("b")
        .uid();
    story
        .put_certificate(a.ns, "api", "api-tls", &[dns(a.ns, "api")])
        .await;
    let before = crt(&story
        .virtual_secrets(b.ns)
        .get("web-tls")
        .await
        .expect("b's Secret"));
    renew_on_host(&story.host_certificates, &b.web_host).await;
    let reissued =
        Story::object_where(&story.host_secrets, &b.web_tls_host, |s| crt(s) != before).await;
    let restarted = start_story_runtime(cp, runtime_host.clone(), &host_ns).await;
    story.world.runtime = restarted.task;
    story.world.reconciles = restarted.reconciles;
    let api_copy = Story::object_where(&story.host_certificates, &a.api_host, |_| true).await;
    assert_eq!(api_copy.data["spec"]["secretName"], json!(a.api_tls_host));
    assert_eq!(
        api_copy.data["spec"]["issuerRef"]["name"],
        json!(a.issuer_host)
    );
    let api_back = Story::object_where(&story.virtual_secrets(a.ns), "api-tls", |s| {
        !crt(s).is_empty()
    })
    .await;
    assert_eq!(tls_dns_names(&api_back).expect("X.509"), [dns(a.ns, "api")]);
    let Some(b_back) = Story::try_object_where(&story.virtual_secrets(b.ns), "web-tls", |s| {
        crt(s) == crt(&reissued)
    })
    .await
    else {
        // which copy moved: cert-manager issuing once more after `reissued`, or the restarted
        // runtime not bringing the host Secret back
        let host_now = story
            .host_secrets
            .get_opt(&b.web_tls_host)
            .await
            .ok()
            .flatten();
        let virtual_now = story
            .virtual_secrets(b.ns)
            .get_opt("web-tls")
            .await
            .ok()
            .flatten();
        let is_reissued = |s: &Option<Secret>| s.as_ref().map(|s| crt(s) == crt(&reissued));
        panic!(
            "b's virtual web-tls did not get the reissued certificate within {TIMEOUT:?}: \
             the host Secret is the reissued one: {:?} (resourceVersion {:?} then, {:?} now); \
             the virtual one is: {:?}; the virtual one is the host's now: {:?}",
            is_reissued(&host_now),
            reissued.resource_version(),
            host_now.as_ref().and_then(|s| s.resource_version()),
            is_reissued(&virtual_now),
            host_now.zip(virtual_now).map(|(h, v)| crt(&h) == crt(&v)),
        )
    };
    assert_eq!(
        b_back.uid(),
        uid_b,
        "the copy made before the restart is updated, not made again"
    );
    let expected_certs: BTreeSet<String> = [&a.web_host, &b.web_host, &a.api_host]
        .into_iter()
        .cloned()
        .collect();
    let expected_issuers: BTreeSet<String> = [&a.issuer_host, &b.issuer_host]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(Story::names(&story.host_certificates).await, expected_certs);
    assert_eq!(Story::names(&story.host_issuers).await, expected_issuers);
    assert_eq!(
        Story::names(&story.virtual_secrets(a.ns)).await,
        BTreeSet::from(["api-tls".to_string(), "web-tls".to_string()])
    );
    assert_eq!(
        Story::names(&story.virtual_secrets(b.ns)).await,
        BTreeSet::from(["web-tls".to_string()])
    );
    let mut host_creates = story
        .runtime_creates(Cluster::Host, &host_ns, "certificates")
        .await;
    host_creates.extend(
        story
            .runtime_creates(Cluster::Host, &host_ns, "issuers")
            .await,
    );
    host_creates.sort();
    let mut expected: Vec<String> = expected_certs
        .iter()
        .chain(&expected_issuers)
        .cloned()
        .collect();
    expected.sort();
    assert_eq!(host_creates, expected, "each host copy was created once");
    assert_eq!(
        story
            .runtime_creates(Cluster::Virtual, a.ns, "secrets")
            .await,
        ["api-tls", "web-tls"]
    );
    assert_eq!(
        story
            .runtime_creates(Cluster::Virtual, b.ns, "secrets")
            .await,
        ["web-tls"]
    );

    // 6. deleting a virtual Certificate removes its host copy and the Secret that came back
    story
        .virtual_api(a.ns, "Certificate")
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete the virtual Certificate");
    Story::gone(&story.host_certificates, &a.web_host).await;
    Story::gone(&story.virtual_secrets(a.ns), "web-tls").await;
    let b_still = story
        .virtual_secrets(b.ns)
        .get("web-tls")
        .await
        .expect("b's Secret stays");
    assert_eq!(b_still.uid(), uid_b);
    assert!(
        story
            .host_certificates
            .get_opt(&b.web_host)
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        story
            .virtual_secrets(a.ns)
            .get_opt("api-tls")
            .await
            .expect("get")
            .is_some()
    );
    println!(
        "cert-manager e2e ({test}): 2 namespaces, 2 renewals, a restart, a deletion; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Does on the host what `cmctl renew` does to Certificate `name`: sets its `Issuing` condition
/// to `True` with reason `ManuallyTriggered` (keeping the other conditions), which makes
/// cert-manager issue it again, once no issuance is in progress (no `Issuing=True`). Retries
/// when cert-manager wrote the Certificate in between (the write carries the
/// `resourceVersion` it read).
async fn renew_on_host(certificates: &Api<DynamicObject>, name: &str) {
    wait_for(TIMEOUT, || async {
        let cert = certificates.get(name).await.ok()?;
        let mut conditions: Vec<Value> = cert.data["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        // Not while an issuance is still in progress: cert-manager writes the new Secret before
        // it takes its Issuing condition off, so a second renewal right after the first came
        // back would replace a condition cert-manager is about to remove, and be lost with it.
        if conditions
            .iter()
            .any(|c| c["type"] == "Issuing" && c["status"] == "True")
        {
            return None;
        }
        conditions.retain(|c| c["type"] != "Issuing");
        conditions.push(json!({
            "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
            "message": "Certificate re-issuance manually triggered",
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second).ok()?.to_string(),
            "observedGeneration": cert.metadata.generation
        }));
        certificates
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"resourceVersion": cert.resource_version()},
                                     "status": {"conditions": conditions}})),
            )
            .await
            .ok()
    })
    .await;
}
