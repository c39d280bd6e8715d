//! Errors of the operator. Each message says what failed and on which object, so that a log
//! line or an Event is actionable without reading the code.

use thiserror::Error;

/// Everything that can make a reconcile, or [`crate::run`], fail.
///
/// A failed reconcile is retried by [`crate::controller::error_policy`]; conditions a user can
/// fix in their `VClusterPlugin` (the vCluster does not exist, a name conflict) are *not*
/// errors: they become a `Ready=False` condition instead (see [`crate::status`]).
#[derive(Debug, Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("{action}: {source}")]
    Kube {
        /// What the operator was doing, such as `apply StatefulSet ns/name`.
        action: String,
        /// The client error (HTTP status and the API server's message).
        #[source]
        source: kube::Error,
    },

    /// The finalizer machinery failed (adding or removing `vcp.dev/cleanup`, or the apply /
    /// cleanup step it wraps).
    #[error("finalizer of VClusterPlugin {object}: {source}")]
    Finalizer {
        /// `namespace/name` of the plugin.
        object: String,
        /// The wrapped error.
        #[source]
        source: Box<kube::runtime::finalizer::Error<Error>>,
    },

    /// An object from the watch cache lacks a field the API server always sets.
    #[error("VClusterPlugin without {0}: the API server always sets it, so this is a bug")]
    MissingField(&'static str),
}

impl Error {
    /// Wraps a client error with the action that failed.
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
