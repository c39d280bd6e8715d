//! One object or one type must not stop what the others bring back (`syncedTypes[].produced`,
//! `syncer-runtime/src/produced.rs`).
//!
//! 1. One synced type that is not served must not stop the objects of the *other* types from
//!    coming back (`Claims`).
//!    Nothing is brought back until every `produced` entry of the runtime has listed its synced
//!    objects (so that the host names all types declare are known first). A `ToHost` type whose
//!    kind the virtual API server does not serve (its CRD not installed there, or deleted by a
//!    user of the virtual cluster, then any restart of the runtime) never lists, and before the
//!    fix every other type's `produced` objects then stayed on the host
//!    (`ProducedNotSettled`, retried forever). Here the plugin syncs the test CRD `Cert`
//!    (`produced` Secret, as the tests of `main.rs`) and a kind `Ghost` of the
//!    same group that no cluster serves, with a `produced` entry too: the Cert's Secret comes
//!    back within the usual timeout. A type not served has no virtual object, so it declares no
//!    host name and nothing is lost by not waiting for it.
//!
//! 2. One synced object whose name at `namePath` holds a multi-byte character (`é-tls`, any
//!    string a virtual user writes in a Cert) must fail alone: the check of its host name
//!    sliced the string inside the character and panicked, which ended the task of the whole
//!    type (every Cert of the vCluster stopped syncing, none came back).

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use vcp_syncer_runtime::PodSync;
use vcp_tests::poll_for;
use vcp_tests::runtime::{TIMEOUT, world_with};

use crate::support::{certs, prepare};

const TEST: &str = "pblock";
const VCLUSTER: &str = "vc-pblock";
const NS: &str = "pblock-a";

#[tokio::test]
async fn an_unserved_type_does_not_hold_back_what_another_type_brings_back() {
    let host_ns = format!("vc-{TEST}");
    prepare(&host_ns).await;
    let reference =
        json!([{"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}}]);
    let produced = json!([{"apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName"}]);
    let spec = json!({"vcluster": {"name": VCLUSTER}, "syncedTypes": [
        {"apiVersion": "e2e.vcp.test/v1", "kind": "Cert", "selector": {"matchLabels": {"e2e": TEST}},
         "patches": reference, "produced": produced},
        {"apiVersion": "e2e.vcp.test/v1", "kind": "Ghost", "patches": reference, "produced": produced},
    ]});
    let w = world_with(TEST, &[NS], spec, PodSync::Hooks).await;
    // the Cert (retried until the CRD's discovery serves it), then its host copy
    let api = Api::<DynamicObject>::namespaced_with(w.virtual_.clone(), NS, &certs());
    let cert: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "e2e.vcp.test/v1", "kind": "Cert",
        "metadata": {"name": "web", "namespace": NS, "labels": {"e2e": TEST}},
        "spec": {"secretName": "web-tls"}
    }))
    .unwrap();
    poll_for(TIMEOUT, || {
        let (api, cert) = (api.clone(), cert.clone());
        async move {
            api.patch(
                "web",
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&cert),
            )
            .await
            .ok()
        }
    })
    .await
    .expect("the Cert created in the virtual cluster");
    let host_certs = Api::<DynamicObject>::namespaced_with(w.host.clone(), &host_ns, &certs());
    let copy = poll_for(TIMEOUT, || {
        let api = host_certs.clone();
        async move { api.get_opt(&host_name("web")).await.ok().flatten() }
    })
    .await
    .expect("the Cert's host copy: the Cert type syncs");
    assert_eq!(copy.data["spec"]["secretName"], json!(host_name("web-tls")));
    // the test plays cert-manager: the Secret named by the host copy
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": host_name("web-tls")},
        "data": {"tls.crt": "YQ=="}
    }))
    .unwrap();
    Api::<Secret>::namespaced(w.host.clone(), &host_ns)
        .patch(
            &host_name("web-tls"),
            &PatchParams::apply("cert-manager").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("issue the host Secret");
    let virtual_secrets = Api::<Secret>::namespaced(w.virtual_.clone(), NS);
    let back = poll_for(TIMEOUT, || {
        let api = virtual_secrets.clone();
        async move { api.get_opt("web-tls").await.ok().flatten() }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the Cert's Secret not brought back within {TIMEOUT:?} beside the unserved Ghost type"
        )
    });
    let crt = back
        .data
        .as_ref()
        .and_then(|d| d.get("tls.crt"))
        .map(|b| b.0.clone());
    assert_eq!(crt.as_deref(), Some(&b"a"[..]));
}

/// `<name>-x-<ns>-x-<vcluster>`, written out (vCluster's host name of a short name).
fn host_name(name: &str) -> String {
    host_name_in(name, NS, VCLUSTER)
}

/// `<name>-x-<ns>-x-<vcluster>`.
fn host_name_in(name: &str, ns: &str, vcluster: &str) -> String {
    format!("{name}-x-{ns}-x-{vcluster}")
}

/// Creates the Cert `name` in `ns` of the virtual cluster naming `secret` (retried until the
/// CRD's discovery serves it).
async fn cert(virtual_: &kube::Client, ns: &str, name: &str, secret: &str, label: &str) {
    let api = Api::<DynamicObject>::namespaced_with(virtual_.clone(), ns, &certs());
    let cert: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "e2e.vcp.test/v1", "kind": "Cert",
        "metadata": {"name": name, "namespace": ns, "labels": {"e2e": label}},
        "spec": {"secretName": secret}
    }))
    .unwrap();
    poll_for(TIMEOUT, || {
        let (api, cert) = (api.clone(), cert.clone());
        async move {
            api.patch(
                name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&cert),
            )
            .await
            .ok()
        }
    })
    .await
    .unwrap_or_else(|| panic!("the Cert {ns}/{name} created in the virtual cluster"));
}

const TEST2: &str = "pname";
const VCLUSTER2: &str = "vc-pname";
const NS2: &str = "pname-a";

#[tokio::test]
async fn a_multi_byte_name_fails_alone() {
    let host_ns = format!("vc-{TEST2}");
    prepare(&host_ns).await;
    let spec = json!({"vcluster": {"name": VCLUSTER2}, "syncedTypes": [
        {"apiVersion": "e2e.vcp.test/v1", "kind": "Cert", "selector": {"matchLabels": {"e2e": TEST2}},
         "patches": [{"path": "spec.secretName", "reference": {"apiVersion": "v1", "kind": "Secret"}}],
         "produced": [{"apiVersion": "v1", "kind": "Secret", "namePath": "spec.secretName"}]},
    ]});
    let w = world_with(TEST2, &[NS2], spec, PodSync::Hooks).await;
    let host_certs = Api::<DynamicObject>::namespaced_with(w.host.clone(), &host_ns, &certs());
    let host_copy = |name: &'static str| {
        let api = host_certs.clone();
        async move {
            poll_for(TIMEOUT, || {
                let api = api.clone();
                async move {
                    api.get_opt(&host_name_in(name, NS2, VCLUSTER2))
                        .await
                        .ok()
                        .flatten()
                }
            })
            .await
        }
    };
    // the virtual user's Cert: synced to the host (its reference translated), then judged
    cert(&w.virtual_, NS2, "odd", "é-tls", TEST2).await;
    let odd = host_copy("odd").await.expect("the odd Cert's host copy");
    assert_eq!(
        odd.data["spec"]["secretName"],
        json!(host_name_in("é-tls", NS2, VCLUSTER2))
    );
    // another user's Cert afterwards: synced, and its Secret comes back
    cert(&w.virtual_, NS2, "web", "web-tls", TEST2).await;
    host_copy("web")
        .await
        .expect("the next Cert's host copy: the type still syncs after the odd name");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": host_name_in("web-tls", NS2, VCLUSTER2)},
        "data": {"tls.crt": "YQ=="}
    }))
    .unwrap();
    Api::<Secret>::namespaced(w.host.clone(), &host_ns)
        .patch(
            &host_name_in("web-tls", NS2, VCLUSTER2),
            &PatchParams::apply("cert-manager").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("issue the host Secret");
    let virtual_secrets = Api::<Secret>::namespaced(w.virtual_.clone(), NS2);
    poll_for(TIMEOUT, || {
        let api = virtual_secrets.clone();
        async move { api.get_opt("web-tls").await.ok().flatten() }
    })
    .await
    .expect("the next Cert's Secret brought back beside the odd name");
}
