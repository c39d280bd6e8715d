#![warn(missing_docs)]
//! API types of vcluster-plugin-operator.
//!
//! - [`VClusterPlugin`] (`vcp.dev/v1alpha1`): a vCluster plugin as a Kubernetes object (the
//!   README, "Concepts").
//! - [`Car`] (`example.loft.sh/v1`): the vcluster-sdk tutorial's resource, synced by the
//!   example plugin.
//!
//! The generated CRD YAML is committed beside this crate ([`CRD_FILES`]) and, where kustomize
//! reads it (it reads no file outside a kustomization's folder), once more ([`CRD_COPIES`]:
//! `config/crd/` for the default install, `config/samples/crd/` for the tutorial's Car); the
//! crate's test `crd_yaml` fails when a copy differs from [`crd_yaml`]'s output (run it with
//! `VCP_BLESS=1` to rewrite the files).
//!
//! Shared by both binaries besides the types: [`hooks`], the pure application of declared
//! hooks; [`bursts`], when each gives its heap's freed pages back to the kernel; with the
//! `test-faults` feature only, `fault`, their test-only fault point, and with `heap-count` only,
//! `heap`, the live-heap counter of their test endpoint (both absent from release builds); with
//! the `http` feature, `http`, the small server of their `/metrics` and probes.

pub mod admission;
#[cfg(feature = "http")]
pub mod build_info;
pub mod built_in;
pub mod bursts;
pub mod car;
#[cfg(feature = "test-faults")]
pub mod fault;
pub mod fold;
pub mod free_form;
#[cfg(feature = "heap-count")]
pub mod heap;
pub mod hooks;
#[cfg(feature = "http")]
pub mod http;
pub mod patch_path;
pub mod plugin;
pub mod reason;
mod schema;
pub mod status_bounds;
pub mod tolerant;

pub use admission::admission_plural;
pub use car::{Car, CarSpec, CarStatus};
pub use plugin::*;
pub use reason::Reason;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// File names (relative to the `crds/` folder) of the committed CRDs, with the CRD each holds.
pub fn crd_files() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("vclusterplugins.vcp.dev.yaml", VClusterPlugin::crd()),
        ("cars.example.loft.sh.yaml", Car::crd()),
    ]
}

/// The names [`crd_files`] returns, for scripts and tests that read the committed YAML.
pub const CRD_FILES: [&str; 2] = ["vclusterplugins.vcp.dev.yaml", "cars.example.loft.sh.yaml"];

/// The folder (relative to the repository root) that holds every file of [`CRD_FILES`], beside
/// the types.
pub const CRD_DIR: &str = "crds";

/// The other copy of each file of [`CRD_FILES`] (folder relative to the repository root, file),
/// where kustomize reads it (it reads no file outside a kustomization's folder): the
/// `VClusterPlugin` CRD in the default install's base `config/crd/`, the tutorial's `Car` CRD
/// among the examples in `config/samples/crd/` (not installed by default).
pub const CRD_COPIES: [(&str, &str); 2] = [
    ("config/crd", "vclusterplugins.vcp.dev.yaml"),
    ("config/samples/crd", "cars.example.loft.sh.yaml"),
];

/// One CRD as the YAML document committed in `crds/` (a header comment, then the object).
///
/// # Errors
/// Fails only when serde_yaml cannot serialize the CRD, which would be a bug in the types.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    Ok(format!(
        "# Generated from the Rust types in crds/src by `VCP_BLESS=1 cargo test -p vcp-crds`: do not edit.\n{}",
        serde_yaml::to_string(crd)?
    ))
}
