//! Objects that come back (`syncedTypes[].produced`, `syncer-runtime/src/produced.rs`) end to
//! end on the real host and virtual API servers (RBAC on), the runtime in-process as
//! `vcp-syncer`.
//!
//! A test CRD `Cert` (`e2e.vcp.test/v1`, `spec.secretName`) stands in for cert-manager's
//! Certificate (the real cert-manager is the subject of its own end-to-end test), synced
//! `ToHost` with vCluster's `reference` patch on `spec.secretName` and `produced` of the `v1`
//! `Secret` named there. The test plays cert-manager: it writes the host Secret named by the
//! host copy's `spec.secretName`.
//!
//! The first test needs the runtime's `reference` patch (the host copy's `secretName` is the
//! translated name); the second shows what happens without one. [`isolation`]: one object or
//! one type does not stop what the others bring back. [`support`]: the CRD and grants all of
//! them share.

mod isolation;
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
};
use serde_json::json;
use vcp_crds::{Reason, VClusterPlugin};
use vcp_syncer_runtime::PodSync;
use vcp_tests::runtime::{TIMEOUT, apply_dynamic as apply, start_runtime, world_with};
use vcp_tests::{Audit, Cluster, ControlPlane, Identity, poll_event_where, wait_for};

use support::{cert_crd, certs, prepare};

const TEST: &str = "produced";
const VCLUSTER: &str = "vc-produced";
const NS_A: &str = "produced-a";
const NS_B: &str = "produced-b";

/// `<name>-x-<ns>-x-vc-produced`, written out (vCluster's host name of a short name).
fn host_name(name: &str, ns: &str) -> String {
    format!("{name}-x-{ns}-x-{VCLUSTER}")
}

#[tokio::test]
async fn produced_secrets_come_back_under_their_virtual_names() {
    let host_ns = format!("vc-{TEST}");
    prepare(&host_ns).await;
    let spec = json!({
        "vcluster": {"name": VCLUSTER},
        "syncedTypes": [{
            "apiVersion": "e2e.vcp.test/v1", "kind": "Cert",
            "selector": {"matchLabels": {"e2e": TEST}},
            "patches": [{"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}}],
            "produced": [{"apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName"}]
        }]
    });
    let mut w = world_with(TEST, &[NS_A, NS_B], spec, PodSync::Hooks).await;
    let started = std::time::Instant::now();
    let cert = |ns: &'static str, name: &'static str, secret: &'static str| {
        let client = w.virtual_.clone();
        async move {
            // the CRD's discovery may lag behind its creation: retry until served
            wait_for(TIMEOUT, || {
                let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &certs());
                let obj: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "e2e.vcp.test/v1", "kind": "Cert",
                    "metadata": {"name": name, "namespace": ns, "labels": {"e2e": TEST}},
                    "spec": {"secretName": secret}
                }))
                .unwrap();
                async move {
                    api.patch(
                        name,
                        &PatchParams::apply("e2e").force(),
                        &Patch::Apply(&obj),
                    )
                    .await
                    .ok()
                }
            })
            .await
        }
    };
    let host_secrets: Api<Secret> = Api::namespaced(w.host.clone(), &host_ns);
    let virtual_secrets = |ns: &str| -> Api<Secret> { Api::namespaced(w.virtual_.clone(), ns) };
    // the test plays cert-manager: the Secret named by the host copy's secretName
    let issue = |name: String, crt: &'static str| {
        let api = host_secrets.clone();
        async move {
            let secret: Secret = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "labels": {"controller.cert-manager.io/fao": "true"},
                             "annotations": {"cert-manager.io/certificate-name": "issued"}},
                "type": "kubernetes.io/tls",
                "data": {"tls.crt": crt, "tls.key": "a2V5"}
            }))
            .unwrap();
            api.patch(
                &name,
                &PatchParams::apply("cert-manager").force(),
                &Patch::Apply(&secret),
            )
            .await
            .expect("issue the host Secret")
        }
    };
    let virtual_secret_where =
        |ns: &'static str, name: &'static str, check: Box<dyn Fn(&Secret) -> bool>| {
            let api = virtual_secrets(ns);
            async move {
                wait_for(TIMEOUT, || {
                    let api = api.clone();
                    let check = &check;
                    async move { api.get_opt(name).await.ok().flatten().filter(|s| check(s)) }
                })
                .await
            }
        };
    let crt = |s: &Secret| {
        s.data
            .as_ref()
            .and_then(|d| d.get("tls.crt"))
            .map(|b| String::from_utf8_lossy(&b.0).to_string())
    };

    // 1. two virtual namespaces, the same Cert and Secret names: two host copies whose
    //    secretName names two host Secrets (the reference patch)
    cert(NS_A, "web", "web-tls").await;
    cert(NS_B, "web", "web-tls").await;
    let host_certs = Api::<DynamicObject>::namespaced_with(w.host.clone(), &host_ns, &certs());
    for ns in [NS_A, NS_B] {
        let copy = wait_for(TIMEOUT, || {
            let api = host_certs.clone();
            async move { api.get_opt(&host_name("web", ns)).await.ok().flatten() }
        })
        .await;
        assert_eq!(
            copy.data["spec"]["secretName"],
            json!(host_name("web-tls", ns))
        );
    }
    issue(host_name("web-tls", NS_A), "YQ==").await; // "a"
    issue(host_name("web-tls", NS_B), "Yg==").await; // "b"
    let a = virtual_secret_where(NS_A, "web-tls", Box::new(|_| true)).await;
    let b = virtual_secret_where(NS_B, "web-tls", Box::new(|_| true)).await;
    assert_eq!(crt(&a).as_deref(), Some("a"));
    assert_eq!(
        crt(&b).as_deref(),
        Some("b"),
        "the namespaces do not collide"
    );
    assert_eq!(a.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        a.annotations(),
        &vcp_tests::string_map([
            ("cert-manager.io/certificate-name", "issued"),
            ("vcp.dev/produced-for", "Cert.e2e.vcp.test/web"),
            ("vcp.dev/produced-path", "spec.secretName"),
            (
                "vcluster.loft.sh/object-host-name",
                host_name("web-tls", NS_A).as_str()
            ),
            ("vcluster.loft.sh/object-host-namespace", host_ns.as_str()),
        ])
    );
    assert_eq!(
        a.labels(),
        &vcp_tests::string_map([("controller.cert-manager.io/fao", "true")])
    );

    // 2. a renewal on the host reaches the virtual Secret
    issue(host_name("web-tls", NS_A), "YTI=").await; // "a2"
    virtual_secret_where(
        NS_A,
        "web-tls",
        Box::new(move |s| crt(s).as_deref() == Some("a2")),
    )
    .await;

    // 3. a virtual Secret the runtime did not make is never overwritten: a conflict
    let mine: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "mine", "namespace": NS_A},
        "data": {"tls.crt": "bWluZQ=="}
    }))
    .unwrap();
    let mine = virtual_secrets(NS_A)
        .create(&Default::default(), &mine)
        .await
        .expect("the user's own Secret");
    cert(NS_A, "taken", "mine").await;
    issue(host_name("mine", NS_A), "dGhlaXJz").await;
    let conflict = poll_event_where(&w.host, &host_ns, TIMEOUT, |e| {
        e.reason.as_deref() == Some(Reason::HostObjectConflict.as_str())
            && e.note
                .as_deref()
                .is_some_and(|n| n.contains(&format!("{NS_A}/mine")))
    })
    .await
    .expect("a HostObjectConflict Event naming the virtual Secret");
    println!("conflict: {:?}", conflict.note);
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &host_ns);
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            let s = status.synced_objects.iter().find(|s| s.kind == "Secret")?;
            (s.count == 2 && s.conflicts == Some(1)).then_some(())
        }
    })
    .await;
    let still_mine = virtual_secrets(NS_A).get("mine").await.expect("mine");
    assert_eq!(still_mine.resource_version(), mine.resource_version());
    assert_eq!(crt(&still_mine).as_deref(), Some("mine"));
    let virtual_writes = |ns: &str, part: &str| {
        Audit::writes()
            .on(Cluster::Virtual)
            .by(Identity::Syncer)
            .in_namespace(ns)
            .uri_contains(part)
            .requests()
    };
    assert_eq!(
        virtual_writes(NS_A, "/secrets/mine"),
        Vec::<(String, String)>::new()
    );

    // 4. restart mid-way: the runtime stops, the host Secret of b is renewed and the Cert of a
    //    gone meanwhile; a new runtime converges, and nothing is made twice
    w.runtime.abort();
    let _ = (&mut w.runtime).await;
    let uid_b = virtual_secrets(NS_B).get("web-tls").await.expect("b").uid();
    issue(host_name("web-tls", NS_B), "YjI=").await; // "b2"
    Api::<DynamicObject>::namespaced_with(w.virtual_.clone(), NS_A, &certs())
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete virtual Cert a/web");
    // The runtime's task has ended (awaited above), so nothing removes the Secret until the
    // restart: its removal below is the restarted runtime's.
    assert!(
        virtual_secrets(NS_A)
            .get_opt("web-tls")
            .await
            .unwrap()
            .is_some(),
        "the Secret that came back for a/web is still there before the restart"
    );
    let cp = ControlPlane::shared();
    let restarted = start_runtime(
        cp.client(Cluster::Host, Identity::Syncer).await,
        cp.client(Cluster::Virtual, Identity::Syncer).await,
        &host_ns,
        "car-plugin",
        |config| config.status_interval = Duration::from_millis(300),
    );
    w.runtime = restarted.task;
    // deleting the virtual source removes the Secret that came back
    wait_for(TIMEOUT, || {
        let api = virtual_secrets(NS_A);
        async move { api.get_opt("web-tls").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let b2 = virtual_secret_where(
        NS_B,
        "web-tls",
        Box::new(move |s| crt(s).as_deref() == Some("b2")),
    )
    .await;
    assert_eq!(
        b2.uid(),
        uid_b,
        "the copy made before the restart is updated, not made again"
    );
    for ns in [NS_A, NS_B] {
        let creates: Vec<_> = virtual_writes(ns, "/secrets")
            .into_iter()
            .filter(|(verb, _)| verb == "create")
            .collect();
        assert_eq!(
            creates.len(),
            1,
            "{ns}: one create of web-tls in all: {creates:?}"
        );
    }
    assert_eq!(
        virtual_writes(NS_A, "/secrets/mine"),
        Vec::<(String, String)>::new()
    );

    // 5. the host object goes: its copy goes
    host_secrets
        .delete(&host_name("web-tls", NS_B), &DeleteParams::default())
        .await
        .expect("delete the host Secret of b");
    wait_for(TIMEOUT, || {
        let api = virtual_secrets(NS_B);
        async move { api.get_opt("web-tls").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let names: Vec<String> = virtual_secrets(NS_A)
        .list(&Default::default())
        .await
        .expect("virtual secrets")
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    assert_eq!(
        names,
        ["mine"],
        "the user's Secret stays, nothing else is left"
    );
    println!(
        "produced: 2 namespaces, 1 renewal, 1 conflict left untouched, restart converged; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Without a `reference` patch on `namePath`, the host copy's `secretName` is the virtual value
/// itself, which is not the host name of the virtual name (`<name>-x-<ns>-x-<vcluster>`): a
/// tenant could otherwise name any Secret of the host namespace (another namespace's host
/// copies, the vCluster's own Secrets) and have it copied into their namespace. Nothing is
/// brought back: a `Warning` Event `ProducedNameRefused` naming the object, the object counted
/// as failed (`RuntimeHealthy=False`, `SyncErrors`), no write of a Secret in the virtual cluster.
#[tokio::test]
async fn a_host_name_no_reference_translated_is_not_brought_back() {
    let test = "produced-raw";
    let host_ns = format!("vc-{test}");
    let ns = "produced-raw-a";
    prepare(&host_ns).await;
    let spec = json!({
        "vcluster": {"name": format!("vc-{test}")},
        "syncedTypes": [{
            "apiVersion": "e2e.vcp.test/v1", "kind": "Cert",
            "selector": {"matchLabels": {"e2e": test}},
            "produced": [{"apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName"}]
        }]
    });
    let w = world_with(test, &[ns], spec, PodSync::Hooks).await;
    // a Secret of the host namespace that a tenant must never see
    let host_secrets: Api<Secret> = Api::namespaced(w.host.clone(), &host_ns);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "vc-config-vc-produced-raw"}, "data": {"config": "c2VjcmV0"}
    }))
    .unwrap();
    host_secrets
        .create(&Default::default(), &secret)
        .await
        .expect("the vCluster's own Secret");
    let certs_api = Api::<DynamicObject>::namespaced_with(w.virtual_.clone(), ns, &certs());
    let cert: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "e2e.vcp.test/v1", "kind": "Cert",
        "metadata": {"name": "steal", "namespace": ns, "labels": {"e2e": test}},
        "spec": {"secretName": "vc-config-vc-produced-raw"}
    }))
    .unwrap();
    wait_for(TIMEOUT, || {
        let api = certs_api.clone();
        let cert = cert.clone();
        async move {
            api.patch(
                "steal",
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&cert),
            )
            .await
            .ok()
        }
    })
    .await;
    let host_certs = Api::<DynamicObject>::namespaced_with(w.host.clone(), &host_ns, &certs());
    let copy = wait_for(TIMEOUT, || {
        let api = host_certs.clone();
        async move {
            api.get_opt(&format!("steal-x-{ns}-x-vc-{test}"))
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(
        copy.data["spec"]["secretName"],
        json!("vc-config-vc-produced-raw"),
        "no reference patch: the value reaches the host as it is"
    );
    let event = poll_event_where(&w.host, &host_ns, TIMEOUT, |e| {
        e.reason.as_deref() == Some(Reason::ProducedNameRefused.as_str())
    })
    .await
    .expect("a ProducedNameRefused Event");
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&format!("Cert {ns}/steal"))
            && note.contains(&format!("vc-config-vc-produced-raw-x-{ns}-x-vc-{test}")),
        "{note}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &host_ns);
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let status = plugins.get("car-plugin").await.ok()?.status?;
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "RuntimeHealthy" && c.reason == "SyncErrors")
                .then_some(())
        }
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(w.virtual_.clone(), ns);
    assert!(
        secrets
            .get_opt("vc-config-vc-produced-raw")
            .await
            .unwrap()
            .is_none()
    );
    let writes = Audit::writes()
        .on(Cluster::Virtual)
        .by(Identity::Syncer)
        .in_namespace(ns)
        .uri_contains("/secrets")
        .requests();
    assert_eq!(writes, Vec::<(String, String)>::new());
}

/// Applies the synced object `name` of `resource` (kind from it, label `e2e: <label>`) in
/// virtual namespace `ns`, naming `secret` at `spec.secretName`; retried while its CRD is not
/// served yet.
async fn apply_named(
    virtual_: &kube::Client,
    resource: &ApiResource,
    ns: &str,
    name: &str,
    secret: &str,
    label: &str,
) {
    let api = Api::<DynamicObject>::namespaced_with(virtual_.clone(), ns, resource);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": resource.api_version, "kind": resource.kind,
        "metadata": {"name": name, "namespace": ns, "labels": {"e2e": label}},
        "spec": {"secretName": secret}
    }))
    .unwrap();
    wait_for(TIMEOUT, || {
        let (api, obj) = (api.clone(), obj.clone());
        async move {
            api.patch(
                name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&obj),
            )
            .await
            .ok()
        }
    })
    .await;
}

/// Plays cert-manager: the host Secret `name` of type `kubernetes.io/tls` with `crt` (base64)
/// as its certificate and key.
async fn issue_tls(host_secrets: &Api<Secret>, name: &str, crt: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "type": "kubernetes.io/tls", "data": {"tls.crt": crt, "tls.key": crt}
    }))
    .unwrap();
    host_secrets
        .patch(
            name,
            &PatchParams::apply("cert-manager").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("issue the host Secret");
}

/// The `ProducedNameRefused` Event in `host_ns` whose note starts with `prefix` (the refused
/// synced object, `"<Kind> <namespace>/<name>:"`).
async fn refusal(
    host: &kube::Client,
    host_ns: &str,
    prefix: &str,
) -> k8s_openapi::api::events::v1::Event {
    poll_event_where(host, host_ns, TIMEOUT, |e| {
        e.reason.as_deref() == Some(Reason::ProducedNameRefused.as_str())
            && e.note.as_deref().is_some_and(|n| n.starts_with(prefix))
    })
    .await
    .unwrap_or_else(|| panic!("a ProducedNameRefused Event \"{prefix}…\""))
}

/// The second and fourth attackers, end to end: `web-tls` in namespace `v-x-amb` and
/// `web-tls-x-v` in namespace `amb` have one host name. Such a name is brought back nowhere
/// ([`vcp_syncer_runtime::produced::ambiguous_host_name`]), so neither the forged copy marks of
/// the second attacker (a Secret carrying the runtime's marks, plain annotations any virtual user
/// may write, at the attacker's own name: under the earlier "first holder keeps it" rule it made
/// the attacker a holder and the victim's `tls.key` was copied in) nor the fourth attacker's
/// orphan (the host Secret left behind when the victim's Cert is deleted, with no rival left to
/// see) give the attacker anything: the runtime reconciles the attacker's Cert each time (it
/// looked) and writes no Secret.
#[tokio::test]
async fn an_ambiguous_host_name_is_brought_back_nowhere_even_with_forged_marks() {
    let test = "ambiguous";
    let (victim_ns, attacker_ns) = ("v-x-amb", "amb");
    let host_ns = format!("vc-{test}");
    prepare(&host_ns).await;
    let spec = json!({
        "vcluster": {"name": format!("vc-{test}")},
        "syncedTypes": [{
            "apiVersion": "e2e.vcp.test/v1", "kind": "Cert",
            "selector": {"matchLabels": {"e2e": test}},
            "patches": [{"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}}],
            "produced": [{"apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName"}]
        }]
    });
    let w = world_with(test, &[victim_ns, attacker_ns], spec, PodSync::Hooks).await;
    let host_name = format!("web-tls-x-{victim_ns}-x-vc-{test}");
    assert_eq!(
        host_name,
        format!("web-tls-x-v-x-{attacker_ns}-x-vc-{test}")
    );
    let host_secrets: Api<Secret> = Api::namespaced(w.host.clone(), &host_ns);
    let crt_of = |ns: &'static str, name: &'static str| {
        let api: Api<Secret> = Api::namespaced(w.virtual_.clone(), ns);
        async move {
            api.get_opt(name).await.ok().flatten().and_then(|s| {
                s.data?
                    .get("tls.crt")
                    .map(|b| String::from_utf8_lossy(&b.0).to_string())
            })
        }
    };
    let ambiguous = |note: &str| note.contains("holds the separator \"-x-\" 3 times");

    // the victim's Cert, its host copy and the host Secret: refused, as the name is ambiguous
    apply_named(&w.virtual_, &certs(), victim_ns, "web", "web-tls", test).await;
    let host_certs = Api::<DynamicObject>::namespaced_with(w.host.clone(), &host_ns, &certs());
    wait_for(TIMEOUT, || {
        let api = host_certs.clone();
        async move {
            api.get_opt(&format!("web-x-{victim_ns}-x-vc-{test}"))
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    issue_tls(&host_secrets, &host_name, "VklDVElN").await; // "VICTIM"
    let note = refusal(&w.host, &host_ns, &format!("Cert {victim_ns}/web:"))
        .await
        .note
        .unwrap_or_default();
    assert!(ambiguous(&note), "{note}");

    // the attacker declares the same host name with a Cert of their own: refused too
    apply_named(
        &w.virtual_,
        &certs(),
        attacker_ns,
        "grab",
        "web-tls-x-v",
        test,
    )
    .await;
    let note = refusal(&w.host, &host_ns, &format!("Cert {attacker_ns}/grab:"))
        .await
        .note
        .unwrap_or_default();
    assert!(ambiguous(&note), "{note}");

    // then plants a Secret carrying the runtime's copy marks for that Cert
    let forged: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "web-tls-x-v", "namespace": attacker_ns, "annotations": {
            "vcp.dev/produced-for": "Cert.e2e.vcp.test/grab",
            "vcp.dev/produced-path": "spec.secretName",
            "vcluster.loft.sh/object-host-name": host_name,
            "vcluster.loft.sh/object-host-namespace": host_ns,
        }},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "Rk9SR0VE", "tls.key": "Rk9SR0VE"} // "FORGED"
    }))
    .unwrap();
    Api::<Secret>::namespaced(w.virtual_.clone(), attacker_ns)
        .create(&Default::default(), &forged)
        .await
        .expect("the forged Secret");
    // a renewal on the host: the runtime reconciles the attacker's Cert (it looked)
    let key = format!("{attacker_ns}/grab");
    let before = w.reconciles.reconciles("Secret", &key);
    issue_tls(&host_secrets, &host_name, "VklDVElNMg==").await; // "VICTIM2"
    w.wait_reconciled("Secret", &key, before).await;

    // the victim's Cert goes and its host Secret stays (cert-manager keeps it by default): the
    // attacker is the only one left to declare the name, and the runtime reconciles its Cert
    let before = w.reconciles.reconciles("Secret", &key);
    Api::<DynamicObject>::namespaced_with(w.virtual_.clone(), victim_ns, &certs())
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete the victim's Cert");
    w.wait_reconciled("Secret", &key, before).await;
    let before = w.reconciles.reconciles("Secret", &key);
    issue_tls(&host_secrets, &host_name, "VklDVElNMw==").await; // "VICTIM3"
    w.wait_reconciled("Secret", &key, before).await;

    // nothing written into either namespace, and no Secret holds the victim's certificate
    vcp_tests::audit_caught_up(ControlPlane::shared(), Cluster::Virtual).await;
    for ns in [attacker_ns, victim_ns] {
        let writes = Audit::writes()
            .on(Cluster::Virtual)
            .by(Identity::Syncer)
            .in_namespace(ns)
            .uri_contains("/secrets")
            .requests();
        assert_eq!(
            writes,
            Vec::<(String, String)>::new(),
            "nothing written into {ns}"
        );
    }
    assert_eq!(
        crt_of(attacker_ns, "web-tls-x-v").await.as_deref(),
        Some("FORGED")
    );
    no_victim_data_in(&w.virtual_, attacker_ns).await;
    assert_eq!(crt_of(victim_ns, "web-tls").await, None);
}

/// No Secret of `ns` holds the victim's certificate (`VICTIM`, `VICTIM2`).
async fn no_victim_data_in(virtual_: &kube::Client, ns: &str) {
    let secrets = Api::<Secret>::namespaced(virtual_.clone(), ns)
        .list(&Default::default())
        .await
        .expect("list Secrets");
    for s in secrets.items {
        let crt = s
            .data
            .as_ref()
            .and_then(|d| d.get("tls.crt"))
            .map(|b| String::from_utf8_lossy(&b.0).to_string());
        assert!(
            !crt.as_deref().is_some_and(|c| c.starts_with("VICTIM")),
            "{ns}/{} holds the victim's certificate",
            s.name_any()
        );
    }
}

/// The third attacker's H2, end to end: the same host name declared through a *second* synced
/// type (a `Key`, also bringing back Secrets) in another namespace. Each `produced` entry had
/// an index of its own, so the `Key` saw no rival and copied the victim's Secret; the runtime's
/// entries now share their claims ([`vcp_syncer_runtime::produced::Claims`]), and since the
/// fourth attacker (the same hole across two plugins' runtimes, which share nothing) a name
/// with more than one reading is brought back nowhere by any runtime
/// ([`vcp_syncer_runtime::produced::ambiguous_host_name`]).
#[tokio::test]
async fn a_host_name_declared_through_another_synced_type_is_brought_back_nowhere() {
    let test = "crosstype";
    let (victim_ns, attacker_ns) = ("a-x-cross", "cross");
    let host_ns = format!("vc-{test}");
    prepare(&host_ns).await;
    let cp = ControlPlane::shared();
    let keys = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("e2e.vcp.test", "v1", "Key"),
        "keys",
    );
    let crds = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    let mut key_crd = cert_crd();
    key_crd["metadata"]["name"] = json!("keys.e2e.vcp.test");
    key_crd["spec"]["names"] = json!({"plural": "keys", "singular": "key", "kind": "Key"});
    let rbac = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
            plural,
        )
    };
    for cluster in [Cluster::Host, Cluster::Virtual] {
        let admin = cp.client(cluster, Identity::Admin).await;
        apply(&admin, &crds, None, key_crd.clone()).await;
        apply(&admin, &rbac("ClusterRole", "clusterroles"), None, json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "vcp-e2e-syncer-keys"},
            "rules": [{"apiGroups": ["e2e.vcp.test"], "resources": ["keys"],
                       "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
        }))
        .await;
        apply(&admin, &rbac("ClusterRoleBinding", "clusterrolebindings"), None, json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "vcp-e2e-syncer-keys"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vcp-e2e-syncer-keys"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": Identity::Syncer.user()}]
        }))
        .await;
    }
    let synced = |api_version: &str, kind: &str| {
        json!({
            "apiVersion": api_version, "kind": kind,
            "selector": {"matchLabels": {"e2e": test}},
            "patches": [{"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}}],
            "produced": [{"apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName"}]
        })
    };
    let spec = json!({
        "vcluster": {"name": format!("vc-{test}")},
        "syncedTypes": [synced("e2e.vcp.test/v1", "Cert"), synced("e2e.vcp.test/v1", "Key")]
    });
    let w = world_with(test, &[victim_ns, attacker_ns], spec, PodSync::Hooks).await;
    let host_name = format!("web-tls-x-{victim_ns}-x-vc-{test}");
    assert_eq!(
        host_name,
        format!("web-tls-x-a-x-{attacker_ns}-x-vc-{test}")
    );
    let host_secrets: Api<Secret> = Api::namespaced(w.host.clone(), &host_ns);
    // the victim's Cert and its copy
    apply_named(&w.virtual_, &certs(), victim_ns, "web", "web-tls", test).await;
    let host_certs = Api::<DynamicObject>::namespaced_with(w.host.clone(), &host_ns, &certs());
    wait_for(TIMEOUT, || {
        let api = host_certs.clone();
        async move {
            api.get_opt(&format!("web-x-{victim_ns}-x-vc-{test}"))
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    issue_tls(&host_secrets, &host_name, "VklDVElN").await; // "VICTIM"
    let ambiguous = |note: &str| note.contains("holds the separator \"-x-\" 3 times");
    let note = refusal(&w.host, &host_ns, &format!("Cert {victim_ns}/web:"))
        .await
        .note
        .unwrap_or_default();
    assert!(ambiguous(&note), "{note}");

    // the attacker's Key names the same host Secret: refused the same way
    apply_named(&w.virtual_, &keys, attacker_ns, "grab", "web-tls-x-a", test).await;
    let note = refusal(&w.host, &host_ns, &format!("Key {attacker_ns}/grab:"))
        .await
        .note
        .unwrap_or_default();
    assert!(ambiguous(&note), "{note}");
    // a renewal: the runtime reconciles the Key (it looked) and copies nothing to it
    let key = format!("{attacker_ns}/grab");
    let before = w.reconciles.reconciles("Secret", &key);
    issue_tls(&host_secrets, &host_name, "VklDVElNMg==").await; // "VICTIM2"
    w.wait_reconciled("Secret", &key, before).await;
    vcp_tests::audit_caught_up(cp, Cluster::Virtual).await;
    let writes = Audit::writes()
        .on(Cluster::Virtual)
        .by(Identity::Syncer)
        .in_namespace(attacker_ns)
        .uri_contains("/secrets")
        .requests();
    assert_eq!(
        writes,
        Vec::<(String, String)>::new(),
        "nothing written into {attacker_ns}"
    );
    no_victim_data_in(&w.virtual_, attacker_ns).await;
    assert!(
        Api::<Secret>::namespaced(w.virtual_.clone(), victim_ns)
            .get_opt("web-tls")
            .await
            .expect("read the victim's namespace")
            .is_none()
    );
}
