//! Errors of the runtime, with what to check to fix them.

/// A hook that could not be applied (defined beside the pure hook application in `vcp_crds`).
pub use vcp_crds::hooks::HookError;

/// Everything that can stop the runtime or fail one sync of one object.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `VClusterPlugin` named by `--plugin` does not exist in `--namespace`.
    #[error(
        "VClusterPlugin {namespace}/{name} not found on the host: check --plugin and --namespace \
         (the runtime runs in the namespace of the vCluster it serves)"
    )]
    PluginNotFound {
        /// Host namespace searched.
        namespace: String,
        /// Name searched.
        name: String,
    },

    /// The `VClusterPlugin` could not be read (RBAC, connectivity, CRD missing).
    #[error(
        "cannot read VClusterPlugin {namespace}/{name} on the host: {}; the syncer's \
         identity needs get/list/watch on vclusterplugins.vcp.dev in {namespace}, and the CRD \
         must be installed",
        short(source)
    )]
    ReadPlugin {
        /// Host namespace.
        namespace: String,
        /// Plugin name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },

    /// The `VClusterPlugin` could not be decoded, not even without its status (its spec or
    /// metadata; `vcp_crds::tolerant`), at start.
    #[error(
        "VClusterPlugin {namespace}/{name} cannot be decoded ({error}); fix or re-apply its spec (the operator reports it Undecodable)"
    )]
    UndecodablePlugin {
        /// Host namespace.
        namespace: String,
        /// Plugin name.
        name: String,
        /// The decoding error, with its JSON path.
        error: String,
    },

    /// `/metrics` cannot be served: the listening socket of
    /// [`Config::metrics_bind_address`](crate::Config::metrics_bind_address) could not be
    /// opened (`vcp_crds::http::BindError`: the address and the OS error).
    #[error("cannot serve /metrics and /healthz: {0}")]
    Bind(#[source] vcp_crds::http::BindError),

    /// `$VCLUSTER_PLUGIN_METRICS_BIND_ADDRESS` of a v2 plugin is not an `ip:port`.
    #[error(
        "$VCLUSTER_PLUGIN_METRICS_BIND_ADDRESS={value:?} is not an address to listen on ({message}): write ip:port, such as 0.0.0.0:9460"
    )]
    InvalidMetricsAddress {
        /// The value read.
        value: String,
        /// Why it does not parse.
        message: String,
    },

    /// The `VClusterPlugin` has no usable vCluster name.
    #[error(
        "VClusterPlugin {namespace}/{name} has an empty spec.vcluster.name and no --vcluster was given"
    )]
    NoVCluster {
        /// Host namespace.
        namespace: String,
        /// Plugin name.
        name: String,
    },

    /// A synced type is not served by an API server.
    #[error(
        "{api_version} {kind} is not served by the {cluster} API server: {}; install its \
         CRD in both clusters, or set syncedTypes[].resource",
        short(source)
    )]
    Discovery {
        /// `group/version` of the type.
        api_version: String,
        /// Kind of the type.
        kind: String,
        /// `host` or `virtual`.
        cluster: &'static str,
        /// The discovery error.
        #[source]
        source: Box<kube::Error>,
    },

    /// A synced type is cluster-scoped; only namespaced types can be synced into one host
    /// namespace.
    #[error(
        "{api_version} {kind} is cluster-scoped: only namespaced types can be synced to the host namespace"
    )]
    ClusterScoped {
        /// `group/version` of the type.
        api_version: String,
        /// Kind of the type.
        kind: String,
    },

    /// A `syncedTypes[].selector` cannot be turned into a label selector.
    #[error("invalid selector of synced type {api_version} {kind}: {message}")]
    InvalidSelector {
        /// `group/version` of the type.
        api_version: String,
        /// Kind of the type.
        kind: String,
        /// Why the selector was refused.
        message: String,
    },

    /// A `FromHost` type's `mappings.byName` names a host namespace other than the vCluster's, or
    /// has an entry of no shape vCluster accepts ([`crate::translate::MappingError`]): the type
    /// is not watched at all.
    #[error("refused mappings of synced type {api_version} {kind}: {source}")]
    InvalidMapping {
        /// `group/version` of the type.
        api_version: String,
        /// Kind of the type.
        kind: String,
        /// The refused entry.
        source: crate::translate::MappingError,
    },

    /// An API request failed.
    #[error("{action} failed: {}", short(source))]
    Kube {
        /// What was attempted, such as `create host example.loft.sh/v1 Car ns/name`.
        action: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },

    /// A declared hook could not be applied.
    #[error(transparent)]
    Hook(#[from] HookError),

    /// A declared patch (`syncedTypes[].patches[]`) could not be applied to one object: that
    /// object is not written, and is retried with backoff (`RuntimeHealthy=False`, reason
    /// `PatchFailed`, and a `Warning` Event naming the type, the object and the path).
    #[error(transparent)]
    Patch(Box<crate::patches::ObjectPatchError>),

    /// A `syncedTypes[].patches[]` entry cannot be used at all (its path does not parse or
    /// writes the object's identity): the type does not sync.
    #[error("invalid patch of synced type {api_version} {kind}: {source}")]
    InvalidPatch {
        /// `group/version` of the type.
        api_version: String,
        /// Kind of the type.
        kind: String,
        /// The refusal.
        #[source]
        source: Box<crate::patches::PatchError>,
    },

    /// An object could not be converted between its typed and JSON forms.
    #[error("cannot convert {what}: {source}")]
    Json {
        /// What was being converted.
        what: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A produced object is not brought back yet: other `produced` entries of the runtime
    /// (other synced types) have not listed their objects, so a rival place may still be unknown
    /// ([`crate::produced::Claims`]); retried with backoff.
    #[error(
        "not brought back before every produced entry has listed its objects (waiting for {waiting}); retried"
    )]
    ProducedNotSettled {
        /// The entries that have not listed yet.
        waiting: String,
    },

    /// A requested mode is not implemented yet.
    #[error("{what} is not implemented yet")]
    Unsupported {
        /// What was requested.
        what: String,
    },

    /// vCluster's v2 plugin protocol failed.
    #[error(transparent)]
    PluginProtocol(#[from] crate::v2::contract::ProtocolError),

    /// The binary was asked to run a plugin other than the one its container was made for
    /// (binary only): the name the operator wrote into the container (`$VCLUSTER_PLUGIN_NAME`
    /// of the sidecar, the folder `/plugins/<name>` of a v2 plugin) is the only one it runs,
    /// so that a plugin's own `args` or environment cannot point it at another tenant's plugin.
    #[error(
        "refusing to run VClusterPlugin {asked:?} ({asked_by}): this container was made for \
         {written:?} ({written_by}), and the runtime runs only the plugin named there"
    )]
    PluginNameMismatch {
        /// The name asked for.
        asked: String,
        /// Where it came from (`--plugin`, `$VCLUSTER_PLUGIN_NAME`).
        asked_by: &'static str,
        /// The name written into the container.
        written: String,
        /// Where that is (`$VCLUSTER_PLUGIN_NAME`, the plugin folder).
        written_by: &'static str,
    },

    /// The reconcile of one object panicked (a bug its data met); the object is retried with
    /// backoff, the other objects of its type go on (`crate::driver`).
    #[error(
        "the reconcile of {object} panicked: {message} (a bug of the runtime: please report it \
         with this object; the other objects keep syncing)"
    )]
    Panicked {
        /// `namespace/name` of the key.
        object: String,
        /// The panic's message.
        message: String,
    },

    /// The binary was not told which plugin to run (binary only).
    #[error("the plugin's name is unknown: {what}")]
    NoPluginName {
        /// Where it was looked for.
        what: String,
    },

    /// A kubeconfig could not be loaded (binary only).
    #[error("cannot load the {cluster} kubeconfig {path}: {message}")]
    Kubeconfig {
        /// `host` or `virtual`.
        cluster: &'static str,
        /// The path given, or `in-cluster` / `default` when inferred.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl Error {
    /// Wraps an API error with what was attempted.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source: Box::new(source),
        }
    }

    /// Whether the error is an HTTP 409 (conflict on `resourceVersion`, or already exists): a
    /// stale cache; retrying soon is expected to succeed.
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::Kube { source, .. } => {
                matches!(&**source, kube::Error::Api(status) if status.code == 409)
            }
            _ => false,
        }
    }

    /// Whether this is an API error 409 with reason `AlreadyExists`: a create found an object
    /// of that name (one the cache has not seen yet).
    pub fn is_already_exists(&self) -> bool {
        match self {
            Error::Kube { source, .. } => matches!(
                &**source,
                kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists"
            ),
            _ => false,
        }
    }

    /// Whether this is an API error 404 (NotFound): the object, or its namespace, does not
    /// exist.
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::Kube { source, .. } => {
                matches!(&**source, kube::Error::Api(status) if status.code == 404)
            }
            _ => false,
        }
    }
}

/// An API error in one line: `HTTP <code> <reason>: <message>` for error responses of the API
/// server, the error's own text otherwise.
fn short(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("HTTP {} {}: {}", status.code, status.reason, status.message)
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": reason, "message": message
        }))
        .expect("status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn messages_are_one_line_and_say_what_to_do() {
        let error = Error::ReadPlugin {
            namespace: "ns".into(),
            name: "p".into(),
            source: Box::new(api_error(403, "Forbidden", "vclusterplugins is forbidden")),
        };
        assert_eq!(
            error.to_string(),
            "cannot read VClusterPlugin ns/p on the host: HTTP 403 Forbidden: vclusterplugins is \
             forbidden; the syncer's identity needs get/list/watch on vclusterplugins.vcp.dev in \
             ns, and the CRD must be installed"
        );
        assert!(!error.is_conflict());
    }

    #[test]
    fn conflicts_are_recognised() {
        assert!(Error::kube("patch", api_error(409, "Conflict", "changed")).is_conflict());
        assert!(!Error::kube("patch", api_error(422, "Invalid", "bad spec")).is_conflict());
        assert!(!Error::kube("patch", api_error(404, "NotFound", "gone")).is_conflict());
        assert!(Error::kube("create", api_error(404, "NotFound", "no namespace")).is_not_found());
        assert!(!Error::kube("create", api_error(409, "AlreadyExists", "x")).is_not_found());
        assert!(Error::kube("create", api_error(409, "AlreadyExists", "x")).is_already_exists());
        assert!(!Error::kube("patch", api_error(409, "Conflict", "changed")).is_already_exists());
    }
}
