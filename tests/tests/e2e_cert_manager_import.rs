//! The cert-manager story of `e2e_cert_manager.rs` with the plugin that
//! `vcluster-plugin-operator import` makes of a platform team's `vcluster.yaml`
//! (`tests/fixtures/import/cert-manager.vcluster.yaml`: `sync.toHost.customResources` for
//! cert-manager's Issuers and Certificates with vCluster's `reference` patches), run as users
//! run it: the binary, with the host's kubeconfig for the kinds of its keys (the host serves the
//! real cert-manager CRDs). The story and what it asserts: `vcp_tests::cert_manager_scenario::run`.
//! A binary of its own: the imported plugin has no selector, so it syncs every Certificate of
//! its virtual cluster, and each test binary has its own. The plugin is installed by the operator
//! (`run`), whose `Ready=True` says it accepted what `import` made.

use std::process::Command;

use serde::Deserialize as _;
use vcp_crds::VClusterPlugin;
use vcp_tests::cert_manager_scenario::run;
use vcp_tests::{
    CertManager, Cluster, ControlPlane, Identity, VCLUSTER_RELEASE, repo_root, workspace_binary,
};

const TEST: &str = "cm-import";

#[tokio::test]
async fn the_imported_vcluster_yaml_passes_the_cert_manager_story() {
    // the host serves cert-manager's kinds before the import reads its discovery
    CertManager::shared().await;
    let cp = ControlPlane::shared();
    let namespace = format!("vc-{TEST}");
    let fixture = repo_root().join("tests/fixtures/import/cert-manager.vcluster.yaml");
    let out = Command::new(workspace_binary(
        "vcluster-plugin-operator",
        "vcluster-plugin-operator",
    ))
    .arg("import")
    .arg("-f")
    .arg(&fixture)
    .args(["--vcluster", VCLUSTER_RELEASE, "-n", &namespace])
    .arg("--kubeconfig")
    .arg(cp.kubeconfig(Cluster::Host, Identity::Admin))
    .output()
    .expect("run vcluster-plugin-operator import");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "import failed: {stderr}");
    println!("import said:\n{stderr}");
    let yaml = String::from_utf8(out.stdout).expect("UTF-8");
    let plugins: Vec<VClusterPlugin> = serde_yaml::Deserializer::from_str(&yaml)
        .map(|doc| VClusterPlugin::deserialize(doc).expect("a VClusterPlugin"))
        .collect();
    assert_eq!(
        plugins.len(),
        1,
        "one plugin of the customResources blocks:\n{yaml}"
    );
    let spec = serde_json::to_value(&plugins[0].spec).expect("JSON");
    println!("imported spec: {spec}");
    run(TEST, spec).await;
}
