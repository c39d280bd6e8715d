//! The tutorial's `Car` custom resource (`example.loft.sh/v1`), the type the example plugin
//! syncs from the virtual cluster to the host namespace (vcluster-sdk tutorial "crd-sync").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A car, as in the vcluster-sdk tutorial.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "example.loft.sh",
    version = "v1",
    kind = "Car",
    plural = "cars",
    singular = "car",
    namespaced,
    status = "CarStatus",
    doc = "A car (the vcluster-sdk tutorial's example resource).",
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Seats", type_ = "integer", json_path = ".spec.seats"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(transform = crate::schema::paragraphs)]
pub struct CarSpec {
    /// Make of the car, such as `BMW`, `Tesla` or `Audi`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Number of seats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seats: Option<i32>,
}

/// Observed state of a car.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::paragraphs)]
pub struct CarStatus {
    /// Free-text phase, such as `Parked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
