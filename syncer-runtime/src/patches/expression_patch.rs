//! An `expression` / `reverseExpression` patch applied to every location of its path: one
//! evaluation per location in the JavaScript sandbox ([`super::expression`]), all of them
//! bounded together per object ([`super::OBJECT_BUDGET_FACTOR`],
//! [`super::expression::MAX_RESULT_BYTES`]), and none started while too many of the runtime's
//! evaluations overrun ([`super::running`]).

use std::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use serde_json::Value;

use super::expression::{self, ExpressionError, Input};
use super::running::Refusal;
use super::{Compiled, OBJECT_BUDGET_FACTOR, PatchError, Patches};

impl Patches {
    /// Applies the expression patch `patch` to every location of its path in `target`, on the
    /// calling thread (the runtime calls it on its blocking pool: [`Self::to_host_in_pool`]);
    /// refused at once while too many of the runtime's evaluations run past their bound
    /// ([`running`]).
    pub(super) fn expression(
        &self,
        patch: &Compiled,
        what: &'static str,
        source: &str,
        target: &mut Value,
        virtual_obj: Option<&Value>,
        host_obj: Option<&Value>,
    ) -> Result<(), PatchError> {
        self.evaluations
            .admit(Instant::now())
            .map_err(|r| Self::refused(patch, what, &r))?;
        self.expression_here(patch, what, source, target, virtual_obj, host_obj)
    }

    fn refused(patch: &Compiled, what: &'static str, refusal: &Refusal) -> PatchError {
        PatchError {
            path: patch.declared.clone(),
            what,
            message: refusal.to_string(),
        }
    }

    fn expression_here(
        &self,
        patch: &Compiled,
        what: &'static str,
        source: &str,
        target: &mut Value,
        virtual_obj: Option<&Value>,
        host_obj: Option<&Value>,
    ) -> Result<(), PatchError> {
        // The bounds of one object's evaluations of this patch, all locations together: a `[*]`
        // path reaches as many locations as the object has elements, each evaluation is
        // bounded on its own, and every one gets the whole object (a virtual user's Widget
        // with 8,000 tags took 306 s), while the results live outside QuickJS's memory limit
        // (150 results of 4 MB each took the runtime to 2.45 GB).
        let budget = self.bounds.time * OBJECT_BUDGET_FACTOR;
        let started = std::time::Instant::now();
        let mut result_bytes = 0_usize;
        for (done, location) in patch.path.locate(target).into_iter().enumerate() {
            let Some(value) = location.get(target) else {
                continue;
            };
            let value = value.clone();
            let at = location.to_string();
            if started.elapsed() > budget {
                return Err(PatchError {
                    path: patch.declared.clone(),
                    what,
                    message: format!(
                        "at {at}: the {done} evaluations before it took longer than the object's bound of {budget:?} ({OBJECT_BUDGET_FACTOR} times one evaluation's) and it was stopped"
                    ),
                });
            }
            let host_snapshot;
            let host_obj = match host_obj {
                Some(host) => Some(host),
                None => {
                    host_snapshot = target.clone();
                    Some(&host_snapshot)
                }
            };
            let input = Input {
                value: &value,
                path: &at,
                vcluster_name: &self.vcluster,
                vcluster_namespace: &self.host_namespace,
                virtual_object: virtual_obj,
                host_object: host_obj,
            };
            let ticket = self
                .evaluations
                .start(
                    || {
                        let object = virtual_obj.unwrap_or(&*target);
                        let related = object_reference(object);
                        let named = related.as_ref().map_or_else(String::new, |r| {
                            format!(
                                "{} {} {}/{}: ",
                                r.api_version.as_deref().unwrap_or_default(),
                                r.kind.as_deref().unwrap_or_default(),
                                r.namespace.as_deref().unwrap_or_default(),
                                r.name.as_deref().unwrap_or_default()
                            )
                        });
                        (
                            format!("{named}patch {:?} ({what}) at {at}", patch.declared),
                            related,
                        )
                    },
                    self.bounds.time,
                    Instant::now(),
                )
                .map_err(|r| Self::refused(patch, what, &r))?;
            let result = expression::evaluate(source, &input, &self.bounds);
            drop(ticket);
            let result = result.map_err(|e: ExpressionError| PatchError {
                path: patch.declared.clone(),
                what,
                message: format!("at {at}: {e}"),
            })?;
            result_bytes += result.json_bytes;
            if result_bytes > expression::MAX_RESULT_BYTES {
                return Err(PatchError {
                    path: patch.declared.clone(),
                    what,
                    message: format!(
                        "at {at}: the results of the {} evaluations so far hold {result_bytes} bytes of JSON, above the object's bound of {} bytes (3 MiB: no object that large can be written)",
                        done + 1,
                        expression::MAX_RESULT_BYTES
                    ),
                });
            }
            location.set(target, result.value);
        }
        Ok(())
    }
}

/// The object reference of `obj` (an Event's related object), when it has a name.
fn object_reference(obj: &Value) -> Option<ObjectReference> {
    let field = |pointer: &str| {
        obj.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Some(ObjectReference {
        name: Some(field("/metadata/name")?),
        api_version: field("/apiVersion"),
        kind: field("/kind"),
        namespace: field("/metadata/namespace"),
        uid: field("/metadata/uid"),
        ..ObjectReference::default()
    })
}
