//! The CRDs of real controllers, installed from the files their own Go modules ship, read from
//! the Go module cache where `scripts/oracles build` downloaded them at pinned versions (nothing
//! is copied into this repository):
//!
//! | CRDs | file | module and version |
//! | --- | --- | --- |
//! | cert-manager (`Certificate`, `Issuer`, ...) | `deploy/crds/*.yaml` | `github.com/cert-manager/cert-manager`, pinned in `tests/helm/go.mod` |
//! | Gateway API, standard channel (`Gateway`, `HTTPRoute`, ...) | `config/crd/standard/gateway.networking.k8s.io_<plural>.yaml` | `sigs.k8s.io/gateway-api`, pinned in `tests/helm/go.mod` |
//! | Prometheus `ServiceMonitor` | `example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml` | `github.com/prometheus-operator/prometheus-operator` v0.85.0, pinned in `scripts/oracles` |
//!
//! The files are plain `controller-gen` output (no Helm templating), applied as they are.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize as _;

use crate::fixtures::{TEST_FIELD_MANAGER, oracle_paths};
use crate::wait::wait_for;

/// Every cert-manager CRD file of the pinned module's `deploy/crds` (`CERT_MANAGER_CRDS` of
/// `scripts/oracles build`), sorted.
///
/// # Panics
/// When the folder cannot be read or holds no YAML file.
pub fn cert_manager_crd_files() -> Vec<PathBuf> {
    let dir = &oracle_paths()["CERT_MANAGER_CRDS"];
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no CRD file in {}", dir.display());
    files
}

/// The Gateway API standard-channel CRD file of resource `plural` (such as `httproutes`) in the
/// pinned module (`GATEWAY_API_CRDS` of `scripts/oracles build`).
pub fn gateway_api_crd_file(plural: &str) -> PathBuf {
    oracle_paths()["GATEWAY_API_CRDS"].join(format!("gateway.networking.k8s.io_{plural}.yaml"))
}

/// The `ServiceMonitor` CRD file of the pinned prometheus-operator module
/// (`SERVICE_MONITOR_CRD` of `scripts/oracles build`).
pub fn service_monitor_crd_file() -> PathBuf {
    oracle_paths()["SERVICE_MONITOR_CRD"].clone()
}

/// The CustomResourceDefinitions of a YAML file (every document whose kind is
/// `CustomResourceDefinition`; other documents are skipped).
///
/// # Errors
/// When the file cannot be read or a document cannot be parsed.
pub fn read_crds(path: &Path) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut crds = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc)
            .with_context(|| format!("parse {}", path.display()))?;
        if value["kind"].as_str() != Some("CustomResourceDefinition") {
            continue;
        }
        crds.push(
            serde_yaml::from_value(value).with_context(|| format!("parse {}", path.display()))?,
        );
    }
    Ok(crds)
}

/// Installs the CRDs of `files` with `client` by server-side apply (forced, as
/// [`TEST_FIELD_MANAGER`]) and waits until each is Established; returns their names.
///
/// # Panics
/// When a file cannot be read, holds no CRD, a CRD is refused, or one is not Established
/// within 30 s.
pub async fn install_crd_files(client: &Client, files: &[PathBuf]) -> Vec<String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for file in files {
        let crds = read_crds(file).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(!crds.is_empty(), "no CRD in {}", file.display());
        for crd in crds {
            let name = crd.metadata.name.clone().expect("CRD name");
            api.patch(
                &name,
                &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("apply CRD {name} of {}: {e}", file.display()));
            names.push(name);
        }
    }
    for name in &names {
        wait_for(Duration::from_secs(30), || {
            let api = api.clone();
            async move {
                let crd = api.get(name).await.ok()?;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            }
        })
        .await;
    }
    names
}
