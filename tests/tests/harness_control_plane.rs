//! The local control plane itself: two API servers, RBAC on, identities as documented.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use vcp_tests::{Cluster, ControlPlane, Identity};

#[tokio::test]
async fn host_and_virtual_are_separate_clusters_with_rbac() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virt = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::create_namespace(&host, "only-on-host").await;
    let names = |c: kube::Client| async move {
        Api::<Namespace>::all(c)
            .list(&ListParams::default())
            .await
            .expect("list namespaces")
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect::<Vec<_>>()
    };
    assert!(names(host).await.contains(&"only-on-host".to_string()));
    assert!(!names(virt).await.contains(&"only-on-host".to_string()));

    // The operator identity holds nothing until RBAC grants it: a 403, not an error of ours.
    let operator = cp.client(Cluster::Host, Identity::Operator).await;
    let err = Api::<Namespace>::all(operator)
        .list(&ListParams::default())
        .await
        .expect_err("the operator identity must not list namespaces without RBAC");
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403, got {other}"),
    }
}

#[tokio::test]
async fn service_account_tokens_are_minted() {
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::create_namespace(&host, "sa-test").await;
    let sa = cp
        .service_account_client(Cluster::Host, "sa-test", "vc-test")
        .await
        .expect("service account client");
    // Authenticated as the service account (403, not 401): RBAC grants it nothing yet.
    let err = Api::<Namespace>::all(sa)
        .list(&ListParams::default())
        .await
        .expect_err("no RBAC yet");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 403);
            assert!(
                status
                    .message
                    .contains("system:serviceaccount:sa-test:vc-test"),
                "{}",
                status.message
            );
        }
        other => panic!("expected 403, got {other}"),
    }
}

#[tokio::test]
async fn crds_install_on_both_clusters() {
    let cp = ControlPlane::shared();
    for cluster in [Cluster::Host, Cluster::Virtual] {
        let client = cp.client(cluster, Identity::Admin).await;
        vcp_tests::install_crds(&client).await;
        let cars: Api<vcp_crds::Car> = Api::all(client);
        assert!(
            cars.list(&ListParams::default())
                .await
                .expect("list cars")
                .items
                .is_empty()
        );
    }
}
