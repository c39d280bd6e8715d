//! A `labels` patch: the label selector at its path becomes vCluster's `HostLabelSelector` of
//! it on the way down, and its inverse on the way up.

use serde_json::Value;

use crate::translate::{TRANSLATED_LABELS, host_label};

use super::{Compiled, Direction, PatchError, Patches};

impl Patches {
    pub(super) fn labels(
        &self,
        patch: &Compiled,
        target: &mut Value,
        direction: Direction,
    ) -> Result<(), PatchError> {
        for location in patch.path.locate(target) {
            let Some(selector) = location.get_mut(target) else {
                continue;
            };
            match selector {
                Value::Null => continue,
                Value::Object(_) => {}
                _ => {
                    return Err(Self::wrong_shape(
                        patch,
                        "labels",
                        &location,
                        "a label selector is an object with matchLabels and/or matchExpressions",
                    ));
                }
            }
            let translated = self
                .selector(selector, direction)
                .map_err(|m| Self::wrong_shape(patch, "labels", &location, m))?;
            *selector = translated;
        }
        Ok(())
    }

    /// vCluster's `HostLabelSelector` (down) or its inverse (up) of `selector`, in the shape
    /// vCluster writes it: a `metav1.LabelSelector` serialized by Go, so only `matchLabels`
    /// (keys translated) and `matchExpressions` (`key` translated, `operator` and `values`
    /// kept) remain, and an empty map or list is left out (Go's `omitempty`).
    fn selector(&self, selector: &Value, direction: Direction) -> Result<Value, &'static str> {
        let key = |k: &str| match direction {
            Direction::Down => host_label(k, &self.vcluster),
            Direction::Up => TRANSLATED_LABELS
                .iter()
                .find(|t| host_label(t, &self.vcluster) == k)
                .map_or_else(|| k.to_string(), |t| (*t).to_string()),
        };
        let map = selector.as_object().ok_or("not an object")?;
        let mut out = serde_json::Map::new();
        match map.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(entries)) => {
                let mut labels = serde_json::Map::new();
                for (k, v) in entries {
                    if !v.is_string() {
                        return Err("a matchLabels value is not a string");
                    }
                    labels.insert(key(k), v.clone());
                }
                if !labels.is_empty() {
                    out.insert("matchLabels".into(), Value::Object(labels));
                }
            }
            Some(_) => return Err("matchLabels is not a map"),
        }
        match map.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                let mut expressions = Vec::with_capacity(items.len());
                for item in items {
                    let Some(k) = item.get("key").and_then(Value::as_str) else {
                        return Err("a matchExpressions entry has no string key");
                    };
                    let mut expression = serde_json::Map::new();
                    expression.insert("key".into(), Value::String(key(k)));
                    match item.get("operator") {
                        Some(Value::String(op)) => {
                            expression.insert("operator".into(), Value::String(op.clone()));
                        }
                        None | Some(Value::Null) => {
                            expression.insert("operator".into(), Value::String(String::new()));
                        }
                        Some(_) => return Err("a matchExpressions operator is not a string"),
                    }
                    match item.get("values") {
                        None | Some(Value::Null) => {}
                        Some(Value::Array(values)) if values.iter().all(Value::is_string) => {
                            if !values.is_empty() {
                                expression.insert("values".into(), Value::Array(values.clone()));
                            }
                        }
                        Some(_) => return Err("matchExpressions values are not a list of strings"),
                    }
                    expressions.push(Value::Object(expression));
                }
                if !expressions.is_empty() {
                    out.insert("matchExpressions".into(), Value::Array(expressions));
                }
            }
            Some(_) => return Err("matchExpressions is not a list"),
        }
        Ok(Value::Object(out))
    }
}
