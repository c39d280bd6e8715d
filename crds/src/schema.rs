//! Hand-written schema fragments where a derived schema would not be structural.

use schemars::{Schema, SchemaGenerator, json_schema};

/// `config`: any YAML object, kept as given (`x-kubernetes-preserve-unknown-fields`).
pub fn free_form_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A JSON Patch `value`: any JSON value (`x-kubernetes-preserve-unknown-fields` with
/// `x-kubernetes-int-or-string` is not enough, so no type is given; the API server accepts an
/// untyped schema only with preserve-unknown-fields).
pub fn any_value(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
