//! The cert-manager harness itself (`vcp_tests::CertManager`): the driver built from
//! cert-manager's Go module runs cert-manager's own controllers against the host API server, with
//! the CRDs of the module's `deploy/crds`. Before the end-to-end tests lean on it, this shows it
//! does what cert-manager does, with nothing of this project in the way: a self-signed `Issuer`
//! and a `Certificate` created directly on the host get a Ready Issuer, an issued Secret whose
//! `tls.crt` is an X.509 certificate for the requested DNS name, and a Ready Certificate; a
//! CA Issuer made from that Secret issues a second certificate signed by it (its signature
//! verified with the root's key).

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;
use vcp_tests::{
    CertManager, Cluster, ControlPlane, Identity, cert_manager_resource, condition_status,
    create_namespace, tls_dns_names, tls_signed_by, wait_for,
};

const TIMEOUT: Duration = Duration::from_secs(60);

async fn apply(api: &Api<DynamicObject>, obj: serde_json::Value) {
    let obj: DynamicObject = serde_json::from_value(obj).expect("object");
    let name = obj.metadata.name.clone().expect("name");
    api.patch(
        &name,
        &PatchParams::apply("harness").force(),
        &Patch::Apply(&obj),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

async fn wait_condition(api: &Api<DynamicObject>, name: &str, type_: &str) -> DynamicObject {
    wait_for(TIMEOUT, || async move {
        let obj = api.get_opt(name).await.ok().flatten()?;
        (condition_status(&obj, type_).as_deref() == Some("True")).then_some(obj)
    })
    .await
}

#[tokio::test]
async fn self_signed_and_ca_issuers_issue_certificates_on_the_host() {
    let driver = CertManager::shared().await;
    let mut expected = vec![
        "certificaterequests-approver",
        "certificaterequests-issuer-ca",
        "certificaterequests-issuer-selfsigned",
        "certificates-issuing",
        "certificates-key-manager",
        "certificates-readiness",
        "certificates-request-manager",
        "certificates-revision-manager",
        "certificates-trigger",
        "issuers",
    ];
    expected.sort_unstable();
    assert_eq!(
        driver.controllers, expected,
        "the controllers the driver runs"
    );

    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let ns = "harness-cert-manager";
    create_namespace(&host, ns).await;
    let issuers =
        Api::<DynamicObject>::namespaced_with(host.clone(), ns, &cert_manager_resource("Issuer"));
    let certificates = Api::<DynamicObject>::namespaced_with(
        host.clone(),
        ns,
        &cert_manager_resource("Certificate"),
    );
    let secrets: Api<Secret> = Api::namespaced(host.clone(), ns);

    apply(
        &issuers,
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": {"name": "selfsigned", "namespace": ns},
            "spec": {"selfSigned": {}}
        }),
    )
    .await;
    apply(
        &certificates,
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "root", "namespace": ns},
            "spec": {"secretName": "root-tls", "isCA": true, "commonName": "harness root",
                     "dnsNames": ["root.harness.test"],
                     "issuerRef": {"name": "selfsigned", "kind": "Issuer"}}
        }),
    )
    .await;
    wait_condition(&issuers, "selfsigned", "Ready").await;
    wait_condition(&certificates, "root", "Ready").await;
    // The issuing controller records the revision after it wrote the Secret, which the readiness
    // controller may already have found valid: wait for both.
    wait_for(TIMEOUT, || async {
        let root = certificates.get("root").await.ok()?;
        (root.data["status"]["revision"] == json!(1)).then_some(())
    })
    .await;
    let secret = secrets.get("root-tls").await.expect("the issued Secret");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        tls_dns_names(&secret).expect("tls.crt is an X.509 certificate"),
        ["root.harness.test"]
    );
    let annotations = secret.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("cert-manager.io/certificate-name")
            .map(String::as_str),
        Some("root"),
        "cert-manager's own annotation names the Certificate"
    );

    // A CA Issuer from the issued Secret, and a leaf certificate it signs.
    apply(
        &issuers,
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": {"name": "ca", "namespace": ns},
            "spec": {"ca": {"secretName": "root-tls"}}
        }),
    )
    .await;
    apply(
        &certificates,
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": "leaf", "namespace": ns},
            "spec": {"secretName": "leaf-tls", "dnsNames": ["leaf.harness.test"],
                     "issuerRef": {"name": "ca", "kind": "Issuer"}}
        }),
    )
    .await;
    wait_condition(&issuers, "ca", "Ready").await;
    wait_condition(&certificates, "leaf", "Ready").await;
    let leaf = secrets.get("leaf-tls").await.expect("the leaf Secret");
    assert_eq!(tls_dns_names(&leaf).expect("X.509"), ["leaf.harness.test"]);
    // the leaf's signature verifies with the root's key (and the check refuses a certificate
    // that did not sign it: the leaf is not self-signed)
    tls_signed_by(&leaf, &secret).expect("the leaf is signed by the root the CA Issuer holds");
    assert!(
        tls_signed_by(&leaf, &leaf).is_err(),
        "the leaf's signature does not verify with its own key"
    );
    tls_signed_by(&secret, &secret).expect("the root is self-signed");
    let ca_of_leaf = &leaf.data.as_ref().expect("data")["ca.crt"];
    let root_crt = &secret.data.as_ref().expect("data")["tls.crt"];
    assert_eq!(
        ca_of_leaf, root_crt,
        "the leaf's Secret carries the root as its ca.crt"
    );
    assert!(driver.running(), "the driver is still running");
}
