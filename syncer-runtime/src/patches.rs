//! `syncedTypes[].patches[]` in vCluster's meaning (`config.TranslatePatch`), applied to an
//! object as JSON (pure apart from the JavaScript sandbox of [`expression`]).
//!
//! The rules and where each comes from:
//!
//! - **path** ([`vcp_crds::patch_path`]): vCluster's notation; every location a `[*]` reaches
//!   is patched on its own; a path that is not found is skipped (`config.TranslatePatch.path`).
//!   A path that would write the object's identity is refused (the CRD's CEL rule, and again
//!   here: [`PatchPath::is_protected`]), and so is a reference's `namePath` or `namespacePath`
//!   that would (both are written; read from the object's root, where `namespacePath` is when
//!   the value at `path` is a string).
//! - **reference** (`config.TranslatePatchReference`): on the way to the host the referenced
//!   name becomes the referenced object's host name, vCluster's single-namespace `HostName`
//!   ([`host_name`](crate::translate::host_name)`(name, namespace, vcluster)`, proven against
//!   vCluster's code by the translate oracle). When the value at `path` is a map, `namePath`,
//!   `namespacePath`, `kindPath` and `apiVersionPath` are relative to it (vCluster: "relative
//!   path ... within the object"); when it is a string, it is the name, and those paths are
//!   relative to the object.
//!   The namespace is the value at `namespacePath` when found, else the object's own virtual
//!   namespace (vCluster: "If omitted or not found, namespacePath equals to the
//!   metadata.namespace path of the object"); a namespace found there becomes the host
//!   namespace, where the referenced object's host copy lives (in single-namespace mode every
//!   host copy is in the vCluster's namespace). `kindPath` / `apiVersionPath` override `kind` /
//!   `apiVersion` when found. A referenced kind that is **cluster-scoped** (a cert-manager
//!   `ClusterIssuer`) keeps its name: vCluster names the host copy of a cluster-scoped object it
//!   syncs itself `vcluster-<name>-x-<namespace>-x-<vcluster>` (`HostNameCluster`), but the
//!   runtime syncs only namespaced types, so a reference to a cluster-scoped object can only
//!   mean one that exists on the host under that name (a platform team's `ClusterIssuer`).
//!   On the way back (host values that come up, such as the status with `syncStatus`) a host
//!   name of this vCluster (`<name>-x-<namespace>-x-<vcluster>`) becomes the virtual name again,
//!   and the host namespace the virtual one; a shortened host name (past 63 characters, with a
//!   hash) is recognised only when the virtual object names the same reference at that place.
//! - **labels** (`config.TranslatePatchLabels`): the label selector at `path` (`matchLabels`,
//!   `matchExpressions`) becomes vCluster's `translate.HostLabelSelector` of it, the selector of
//!   the host copies (the keys vCluster translates on host copies become their
//!   [`host_label`](crate::translate::host_label) keys; values and operators are kept), as
//!   vCluster's own PodDisruptionBudget syncer translates its selector; proven against
//!   vCluster's function by the translate oracle. The way back turns those keys into the
//!   virtual ones.
//! - **expression** / **reverseExpression**: [`expression`] (JavaScript, sandboxed and
//!   bounded).
//!
//! Direction: for `ToHost`, [`Patches::to_host`] on the host copy after vCluster's translation
//! (create and update alike: the desired copy is recomputed from the virtual object each time,
//! so the result is the same every time and compares equal, with no write loop) and
//! [`Patches::to_virtual`] on what comes back up. For `FromHost` the way forward is host to
//! virtual: [`Patches::from_host`] applies `expression` forward and `reference` / `labels` in
//! their host-to-virtual sense.
//!
//! A patch that fails (an expression that throws or runs past its bounds, a reference or
//! selector of the wrong shape) fails the whole object ([`PatchError`]): nothing of it is
//! written, and the runtime reports it (`PatchFailed`).
//!
//! The parts: this module parses the patches and applies them in order; `expression_patch`,
//! `reference` and `labels` apply one patch of each kind; [`expression`] is the sandbox,
//! [`running`] and `pool` bound the evaluations of the whole runtime.

pub mod expression;
mod expression_patch;
mod labels;
mod pool;
mod reference;
pub mod running;

pub use pool::EVALUATION_SLOTS;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use vcp_crds::TranslatePatch;
use vcp_crds::patch_path::{Location, PatchPath};

use expression::Bounds;
use running::Evaluations;

/// How many times one evaluation's time bound all evaluations of one patch on one object may
/// take together (100 ms × 10 = 1 s by default); their results together may hold at most
/// [`expression::MAX_RESULT_BYTES`] (3 MiB) of JSON.
pub const OBJECT_BUDGET_FACTOR: u32 = 10;

/// A patch that could not be applied: the object is not written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("patch {path:?} ({what}): {message}")]
pub struct PatchError {
    /// The patch's path as declared.
    pub path: String,
    /// `expression`, `reverseExpression`, `reference` or `labels`.
    pub what: &'static str,
    /// What went wrong, at which location.
    pub message: String,
}

/// A [`PatchError`] on one object of a synced type (the runtime's `Error::Patch`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{api_version} {kind} {object}: {source}")]
pub struct ObjectPatchError {
    /// `group/version` of the synced type.
    pub api_version: String,
    /// Kind of the synced type.
    pub kind: String,
    /// `namespace/name` of the object (the virtual object for `ToHost`, the host object for
    /// `FromHost`).
    pub object: String,
    /// uid of that object (the Event's related object).
    pub uid: Option<String>,
    /// The patch and what went wrong.
    #[source]
    pub source: PatchError,
}

#[derive(Clone, Debug)]
enum Kind {
    Expression {
        forward: Option<String>,
        reverse: Option<String>,
    },
    Reference(Reference),
    Labels,
}

#[derive(Clone, Debug)]
struct Reference {
    api_version: String,
    kind: String,
    api_version_path: Option<PatchPath>,
    kind_path: Option<PatchPath>,
    name_path: Option<PatchPath>,
    namespace_path: Option<PatchPath>,
}

#[derive(Clone, Debug)]
struct Compiled {
    declared: String,
    path: PatchPath,
    kind: Kind,
}

/// The patches of one synced type, parsed once.
#[derive(Clone, Debug, Default)]
pub struct Patches {
    patches: Vec<Compiled>,
    vcluster: String,
    host_namespace: String,
    bounds: Bounds,
    /// `(group, kind)` of the cluster-scoped kinds a reference may name (discovered by the
    /// runtime); every other kind is namespaced.
    cluster_scoped: HashSet<(String, String)>,
    /// The runtime's running evaluations ([`running`]): fresh unless shared.
    evaluations: Arc<Evaluations>,
}

impl Patches {
    /// The patches `declared` of a type synced by vCluster `vcluster` in host namespace
    /// `host_namespace`.
    ///
    /// # Errors
    /// [`PatchError`] for a path (or a reference's relative path) that does not parse or that
    /// writes the object's identity, and for a patch with none of expression, reference or
    /// labels (the CRD refuses both).
    pub fn new(
        declared: &[TranslatePatch],
        vcluster: &str,
        host_namespace: &str,
    ) -> Result<Patches, PatchError> {
        let mut patches = Vec::with_capacity(declared.len());
        for patch in declared {
            let refuse = |what: &'static str, message: String| PatchError {
                path: patch.path.clone(),
                what,
                message,
            };
            let parse = |what: &'static str, path: &str| {
                PatchPath::parse(path).map_err(|e| refuse(what, e.to_string()))
            };
            let optional = |what: &'static str, path: &Option<String>| {
                path.as_deref().map(|p| parse(what, p)).transpose()
            };
            // a relative path the reference writes (the name, the namespace): read from the
            // object's root, where `namespacePath` is when the value at `path` is a string
            let written = |field: &'static str, path: &Option<String>| {
                let parsed = optional("reference", path)?;
                match &parsed {
                    Some(p) if p.is_protected() => Err(refuse(
                        "reference",
                        format!(
                            "reference.{field} {:?} writes the object's identity or a vcluster.loft.sh/ key",
                            path.as_deref().unwrap_or_default()
                        ),
                    )),
                    _ => Ok(parsed),
                }
            };
            let (kind, what) = if let Some(reference) = &patch.reference {
                (
                    Kind::Reference(Reference {
                        api_version: reference.api_version.clone(),
                        kind: reference.kind.clone(),
                        api_version_path: optional("reference", &reference.api_version_path)?,
                        kind_path: optional("reference", &reference.kind_path)?,
                        name_path: written("namePath", &reference.name_path)?,
                        namespace_path: written("namespacePath", &reference.namespace_path)?,
                    }),
                    "reference",
                )
            } else if patch.labels.is_some() {
                (Kind::Labels, "labels")
            } else if patch.expression.is_some() || patch.reverse_expression.is_some() {
                (
                    Kind::Expression {
                        forward: patch.expression.clone(),
                        reverse: patch.reverse_expression.clone(),
                    },
                    "expression",
                )
            } else {
                return Err(refuse(
                    "patch",
                    "none of expression, reverseExpression, reference or labels".into(),
                ));
            };
            let path = parse(what, &patch.path)?;
            if path.is_protected() {
                return Err(refuse(
                    what,
                    "the path writes the object's identity or a vcluster.loft.sh/ key".into(),
                ));
            }
            patches.push(Compiled {
                declared: patch.path.clone(),
                path,
                kind,
            });
        }
        Ok(Patches {
            patches,
            vcluster: vcluster.to_string(),
            host_namespace: host_namespace.to_string(),
            bounds: Bounds::default(),
            cluster_scoped: HashSet::new(),
            evaluations: Arc::default(),
        })
    }

    /// These patches with the expressions' bounds `bounds`.
    #[must_use]
    pub fn with_bounds(mut self, bounds: Bounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// These patches counting their evaluations in `evaluations`, the runtime's, shared by all
    /// its synced types and spec generations: no new evaluation starts while
    /// [`running::MAX_OVERRUNNING`] of them run past their time bound ([`running`]).
    #[must_use]
    pub fn sharing_evaluations(mut self, evaluations: Arc<Evaluations>) -> Self {
        self.evaluations = evaluations;
        self
    }

    /// These patches knowing that `(group, kind)` of `kinds` are cluster-scoped (a reference to
    /// one keeps its name).
    #[must_use]
    pub fn with_cluster_scoped(
        mut self,
        kinds: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        self.cluster_scoped.extend(kinds);
        self
    }

    /// No patch at all.
    pub fn is_empty(&self) -> bool {
        self.patches.is_empty()
    }

    /// The `(apiVersion, kind)` every reference patch names by its fixed fields (the kinds to
    /// discover the scope of).
    pub fn referenced_kinds(&self) -> Vec<(String, String)> {
        self.patches
            .iter()
            .filter_map(|p| match &p.kind {
                Kind::Reference(r) => Some((r.api_version.clone(), r.kind.clone())),
                _ => None,
            })
            .collect()
    }

    /// `ToHost`, on the way down: applies every patch, in order, to `host` (the host copy as
    /// vCluster's translation made it from `virtual_obj`).
    ///
    /// # Errors
    /// The first [`PatchError`]; `host` is then partly patched and must not be written.
    pub fn to_host(&self, virtual_obj: &Value, host: &mut Value) -> Result<(), PatchError> {
        let namespace = object_namespace(virtual_obj);
        for patch in &self.patches {
            match &patch.kind {
                Kind::Expression {
                    forward: Some(source),
                    ..
                } => self.expression(patch, "expression", source, host, Some(virtual_obj), None)?,
                Kind::Expression { forward: None, .. } => {}
                Kind::Reference(reference) => {
                    self.reference_down(patch, reference, &namespace, host)?
                }
                Kind::Labels => self.labels(patch, host, Direction::Down)?,
            }
        }
        Ok(())
    }

    /// `ToHost`, on the way up: applies every patch's way back to `host_view` (a copy of the
    /// host object whose fields, such as its status, are about to be copied to `virtual_obj`):
    /// `reverseExpression`, a reference's host name back to the virtual one, a selector's host
    /// keys back to the virtual ones.
    ///
    /// # Errors
    /// The first [`PatchError`].
    pub fn to_virtual(&self, virtual_obj: &Value, host_view: &mut Value) -> Result<(), PatchError> {
        let namespace = object_namespace(virtual_obj);
        for patch in &self.patches {
            match &patch.kind {
                Kind::Expression {
                    reverse: Some(source),
                    ..
                } => {
                    let host = host_view.clone();
                    self.expression(
                        patch,
                        "reverseExpression",
                        source,
                        host_view,
                        Some(virtual_obj),
                        Some(&host),
                    )?
                }
                Kind::Expression { reverse: None, .. } => {}
                Kind::Reference(reference) => {
                    self.reference_up(patch, reference, &namespace, virtual_obj, host_view)?
                }
                Kind::Labels => self.labels(patch, host_view, Direction::Up)?,
            }
        }
        Ok(())
    }

    /// `FromHost`, forward (host to virtual): applies every patch to `virtual_view` (the
    /// virtual copy as translated from `host`): `expression`, a reference's host name to the
    /// virtual one, a selector's host keys to the virtual ones.
    ///
    /// # Errors
    /// The first [`PatchError`].
    pub fn from_host(&self, host: &Value, virtual_view: &mut Value) -> Result<(), PatchError> {
        let namespace = object_namespace(virtual_view);
        for patch in &self.patches {
            match &patch.kind {
                Kind::Expression {
                    forward: Some(source),
                    ..
                } => {
                    let current = virtual_view.clone();
                    self.expression(
                        patch,
                        "expression",
                        source,
                        virtual_view,
                        Some(&current),
                        Some(host),
                    )?
                }
                Kind::Expression { forward: None, .. } => {}
                Kind::Reference(reference) => {
                    let unknown = Value::Null;
                    self.reference_up(patch, reference, &namespace, &unknown, virtual_view)?
                }
                Kind::Labels => self.labels(patch, virtual_view, Direction::Up)?,
            }
        }
        Ok(())
    }

    fn wrong_shape(
        patch: &Compiled,
        what: &'static str,
        at: &Location,
        message: &str,
    ) -> PatchError {
        PatchError {
            path: patch.declared.clone(),
            what,
            message: format!("at {at}: {message}"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Direction {
    Down,
    Up,
}

impl fmt::Display for Patches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let paths: Vec<&str> = self.patches.iter().map(|p| p.declared.as_str()).collect();
        write!(f, "{}", paths.join(", "))
    }
}

fn object_namespace(obj: &Value) -> String {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests;
