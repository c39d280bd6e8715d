//! The API servers' audit logs (`audit-{host,virtual}.log` in [`ControlPlane::dir`]; policy:
//! `tests/control-plane/audit-policy.yaml`): which writes who made, so that a test can show
//! that a component made a write, or none; and which lists and watches the operator made.

use anyhow::Context as _;

use crate::control_plane::{Cluster, ControlPlane};

/// The complete audit events of `cluster`'s audit log, one JSON value per line. A last line
/// the API server is still writing (no newline yet) is left out; the log survives
/// [`ControlPlane::restart`] (the restarted server appends to the same file).
fn audit_events(cp: &ControlPlane, cluster: Cluster) -> anyhow::Result<Vec<serde_json::Value>> {
    let path = cp.dir().join(format!("audit-{}.log", cluster.as_str()));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_str(line).with_context(|| format!("audit line {line}")))
        .collect()
}

/// Write requests (create, update, patch, delete) that `user` made on `cluster`, read from the
/// API server's audit log: one `(verb, request URI)` per request, in order.
///
/// # Errors
/// When the audit log cannot be read.
pub fn audited_writes(
    cp: &ControlPlane,
    cluster: Cluster,
    user: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    Ok(audited_write_events(cp, cluster)?
        .into_iter()
        .filter(|w| w.user == user)
        .map(|w| (w.verb, w.uri))
        .collect())
}

/// One write request from the API server's audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedWrite {
    /// User name (such as `vcp-operator`).
    pub user: String,
    /// The request's `User-Agent` header (tells apart replicas that share a user).
    pub user_agent: String,
    /// `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: String,
    /// The request URI.
    pub uri: String,
    /// Name of the object written (`objectRef.name`; for a create, the name in the body);
    /// empty when absent.
    pub object_name: String,
    /// HTTP status of the response (`responseStatus.code`: 200, 201, 409, …; 0 when absent).
    pub code: u16,
    /// When the API server received the request (`requestReceivedTimestamp`, microsecond
    /// precision); the Unix epoch when absent.
    pub received_at: std::time::SystemTime,
}

/// Every write request made on `cluster` so far, in order, with user, user agent, response
/// code and time (see [`audited_writes`] for a user's `(verb, uri)` pairs).
///
/// # Errors
/// When the audit log cannot be read or a complete line is not JSON.
pub fn audited_write_events(
    cp: &ControlPlane,
    cluster: Cluster,
) -> anyhow::Result<Vec<AuditedWrite>> {
    let mut writes = Vec::new();
    for event in audit_events(cp, cluster)? {
        let write = ["create", "update", "patch", "delete", "deletecollection"]
            .contains(&event["verb"].as_str().unwrap_or_default());
        if event["stage"] != "ResponseComplete" || !write {
            continue;
        }
        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let received_at = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map_or(std::time::UNIX_EPOCH, std::time::SystemTime::from);
        writes.push(AuditedWrite {
            user: s(&event["user"]["username"]),
            user_agent: s(&event["userAgent"]),
            verb: s(&event["verb"]),
            uri: s(&event["requestURI"]),
            object_name: s(&event["objectRef"]["name"]),
            code: event["responseStatus"]["code"]
                .as_u64()
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
            received_at,
        });
    }
    Ok(writes)
}

/// The request URIs of the `list` and `watch` requests `user` made on `cluster` (the audit
/// policy logs them for the operator's user, `vcp-operator`, on StatefulSets, Deployments and
/// the RBAC kinds), one per request as it started (a watch is logged when its response starts),
/// in order: `(verb, request URI)`.
///
/// # Errors
/// When the audit log cannot be read or a complete line is not JSON.
pub fn audited_reads(
    cp: &ControlPlane,
    cluster: Cluster,
    user: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    Ok(audit_events(cp, cluster)?
        .into_iter()
        .filter(|e| {
            let verb = e["verb"].as_str().unwrap_or_default();
            let first_stage = if verb == "watch" {
                "ResponseStarted"
            } else {
                "ResponseComplete"
            };
            e["stage"] == first_stage
                && e["user"]["username"] == user
                && (verb == "list" || verb == "watch")
        })
        .map(|e| {
            let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            (s(&e["verb"]), s(&e["requestURI"]))
        })
        .collect())
}
