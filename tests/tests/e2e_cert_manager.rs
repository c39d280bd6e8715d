//! The cert-manager case (the README, "The cert-manager example") end to end with the real
//! cert-manager: its own controllers (built from its Go module, `vcp_tests::CertManager`) issue
//! on the host what the embedded runtime syncs there from the virtual cluster, with the RBAC
//! the operator derived (the plugin installed by the operator into vCluster's chart-rendered
//! StatefulSet, the runtime holding a token of the account it bound), and the plugin of the
//! README (Issuers, and Certificates with `reference` patches on `spec.secretName` and
//! `spec.issuerRef.name`, their status synced up and the issued Secret brought back). The story
//! and what it asserts: `vcp_tests::cert_manager_scenario::run`. The same story with the plugin
//! imported from a `vcluster.yaml`: `e2e_cert_manager_import.rs`.

use vcp_tests::VCLUSTER_RELEASE;
use vcp_tests::cert_manager_scenario::{readme_spec, run};

const TEST: &str = "cert-manager";

#[tokio::test]
async fn certificates_issued_on_the_host_come_back_into_their_virtual_namespaces() {
    run(TEST, readme_spec(VCLUSTER_RELEASE)).await;
}
