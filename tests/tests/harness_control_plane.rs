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

/// `vcp_crds::built_in::BUILT_IN_GROUPS` holds every group the real kube-apiserver serves
/// itself: its discovery, less the groups of the CRDs installed (which the list must not
/// hold, Gateway API's `gateway.networking.k8s.io` among the names it could be confused with).
#[tokio::test]
async fn built_in_groups_are_the_api_servers_own() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use vcp_crds::built_in::{BUILT_IN_GROUPS, is_built_in_group};
    let cp = ControlPlane::shared();
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    vcp_tests::install_crds(&host).await;
    let crd_groups: Vec<String> = Api::<CustomResourceDefinition>::all(host.clone())
        .list(&ListParams::default())
        .await
        .expect("list CRDs")
        .items
        .into_iter()
        .map(|c| c.spec.group)
        .collect();
    assert!(
        !crd_groups.is_empty(),
        "the shared control plane installs CRDs"
    );
    let served: Vec<String> = host
        .list_api_groups()
        .await
        .expect("discovery")
        .groups
        .into_iter()
        .map(|g| g.name)
        .chain([String::new()])
        .collect();
    let own: Vec<&String> = served.iter().filter(|g| !crd_groups.contains(g)).collect();
    assert!(own.len() >= 20, "{own:?}");
    for group in own {
        assert!(
            BUILT_IN_GROUPS.contains(&group.as_str()),
            "kube-apiserver serves {group:?}, missing from BUILT_IN_GROUPS"
        );
    }
    for group in crd_groups
        .iter()
        .map(String::as_str)
        .chain(["gateway.networking.k8s.io"])
    {
        assert!(!is_built_in_group(group), "{group} is a CRD's group");
    }
}
