//! The API servers' audit logs (`audit-{host,virtual}.log` in [`ControlPlane::dir`]; policy:
//! `tests/control-plane/audit-policy.yaml`): which writes who made, so that a test can show
//! that a component made a write, or none ([`audit_caught_up`] first, so that none is missed);
//! and which lists and watches the operator made, and the syncer identity made of Cars.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

use crate::control_plane::{Cluster, ControlPlane, Identity};

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

/// How long [`audit_caught_up`] waits for its marker to appear in the audit log.
pub const AUDIT_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits until `cluster`'s audit log holds every request the API server answered before this
/// call, so that a count of writes made right after an event (a process killed after a write, a
/// reconcile that finished) misses none: the API server writes an audit event when its handler
/// finishes, which can be after the client already has the answer, so the last entries may lag.
///
/// The barrier is a request of its own, made after everything the caller waits for: a
/// server-side dry-run create (`dryRun=All`: admitted, never stored) of a ConfigMap named
/// `audit-marker-<pid>-<n>` in namespace `default`, as the admin. The API server writes each
/// request's last audit event (`ResponseComplete`, the `--audit-log-mode=blocking` default)
/// as its handler returns; the marker is sent only after the requests the caller waits for were
/// answered, and goes through authentication, admission and the dry run before its own event
/// is written, so once the marker's event is in the log (a complete line), so are theirs.
/// Returns the marker's name. The marker is the
/// admin's, in `default`, and a dry run, so the queries of the operator's, the runtime's or a
/// namespace's writes never count it.
///
/// # Panics
/// When the dry run is refused, or its audit event does not appear within
/// [`AUDIT_CATCH_UP_TIMEOUT`].
pub async fn audit_caught_up(cp: &ControlPlane, cluster: Cluster) -> String {
    let admin = cp.client(cluster, Identity::Admin).await;
    let path = cp.dir().join(format!("audit-{}.log", cluster.as_str()));
    audit_caught_up_in(admin, &path).await
}

/// [`audit_caught_up`] for any API server: the marker is created through `admin` (a client
/// allowed to create ConfigMaps in `default`) and looked for in the JSON audit log at `path`
/// (the real node's `<dir>/audit.log`, for example). Returns the marker's name.
///
/// # Panics
/// As [`audit_caught_up`].
pub async fn audit_caught_up_in(admin: kube::Client, path: &std::path::Path) -> String {
    static MARKERS: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "audit-marker-{}-{}",
        std::process::id(),
        MARKERS.fetch_add(1, Ordering::Relaxed)
    );
    let marker: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
    }))
    .expect("marker ConfigMap");
    Api::<ConfigMap>::namespaced(admin, "default")
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &marker,
        )
        .await
        .unwrap_or_else(|e| panic!("audit marker {name}: {e}"));
    let quoted = format!("\"{name}\"");
    crate::wait::poll_for(AUDIT_CATCH_UP_TIMEOUT, || {
        let quoted = &quoted;
        async move {
            let text = std::fs::read_to_string(path).ok()?;
            let complete = &text[..text.rfind('\n')?];
            complete.contains(quoted.as_str()).then_some(())
        }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the audit event of marker {name} is not in {} after {AUDIT_CATCH_UP_TIMEOUT:?}",
            path.display()
        )
    });
    name
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
        let received_at = received_at(&event);
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

/// Entry point of the audit-log queries: [`Audit::writes`].
#[derive(Clone, Copy, Debug)]
pub struct Audit;

impl Audit {
    /// A query over the write requests of the shared control plane's host API server; narrow
    /// it with [`Writes`]' filters (each one further restricts), then read it with
    /// [`Writes::attempts`], [`Writes::succeeded`] or [`Writes::requests`]. For example, the
    /// operator's successful StatefulSet writes in namespace `ns` since `t`:
    /// `Audit::writes().by(Identity::Operator).in_namespace(ns).resource("statefulsets").since(t).succeeded()`.
    #[must_use]
    pub fn writes() -> Writes<'static> {
        Writes::default()
    }
}

/// A query over the write requests of one audit log (see [`Audit::writes`]). Every filter is
/// a conjunction; an unset filter keeps everything.
#[derive(Clone, Debug)]
pub struct Writes<'a> {
    cp: Option<&'a ControlPlane>,
    cluster: Cluster,
    user: Option<String>,
    namespace: Option<String>,
    cluster_objects: bool,
    resources: Vec<String>,
    verb: Option<String>,
    uri_contains: Vec<String>,
    uri_excludes: Vec<String>,
    since: Option<std::time::SystemTime>,
}

impl Default for Writes<'_> {
    fn default() -> Self {
        Self {
            cp: None,
            cluster: Cluster::Host,
            user: None,
            namespace: None,
            cluster_objects: false,
            resources: Vec::new(),
            verb: None,
            uri_contains: Vec::new(),
            uri_excludes: Vec::new(),
            since: None,
        }
    }
}

impl<'a> Writes<'a> {
    /// Reads `cp`'s audit logs instead of [`ControlPlane::shared`]'s.
    #[must_use]
    pub fn in_control_plane<'b>(self, cp: &'b ControlPlane) -> Writes<'b> {
        Writes {
            cp: Some(cp),
            ..self
        }
    }

    /// Reads `cluster`'s audit log (default: [`Cluster::Host`]).
    #[must_use]
    pub fn on(self, cluster: Cluster) -> Self {
        Self { cluster, ..self }
    }

    /// Only the requests `identity` made (its user name, [`Identity::user`]).
    #[must_use]
    pub fn by(self, identity: Identity) -> Self {
        self.by_user(identity.user())
    }

    /// Only the requests user `user` made.
    #[must_use]
    pub fn by_user(self, user: &str) -> Self {
        Self {
            user: Some(user.to_string()),
            ..self
        }
    }

    /// Only the requests to objects in namespace `ns` (the request path contains
    /// `/namespaces/<ns>/`), and with [`Writes::and_its_cluster_objects`] also the cluster-scoped
    /// objects named for it.
    #[must_use]
    pub fn in_namespace(self, ns: &str) -> Self {
        Self {
            namespace: Some(ns.to_string()),
            ..self
        }
    }

    /// With [`Writes::in_namespace`]: also the requests to cluster-scoped objects (a path
    /// without `/namespaces/`) named `vcp:<ns>:…`, the ClusterRoles and ClusterRoleBindings of
    /// the namespace's plugins (the name as `objectRef.name` records it, or in the path, plain
    /// or percent-encoded). [`Writes::resource`] does not narrow these.
    #[must_use]
    pub fn and_its_cluster_objects(self) -> Self {
        Self {
            cluster_objects: true,
            ..self
        }
    }

    /// Only the requests to namespaced resource `resource` (a segment of the request path,
    /// such as `statefulsets`); several calls keep any of them.
    #[must_use]
    pub fn resource(mut self, resource: &str) -> Self {
        self.resources.push(resource.to_string());
        self
    }

    /// Only the requests with verb `verb` (`create`, `update`, `patch`, `delete`,
    /// `deletecollection`).
    #[must_use]
    pub fn verb(self, verb: &str) -> Self {
        Self {
            verb: Some(verb.to_string()),
            ..self
        }
    }

    /// Only the requests whose URI contains `part`; several calls require each.
    #[must_use]
    pub fn uri_contains(mut self, part: &str) -> Self {
        self.uri_contains.push(part.to_string());
        self
    }

    /// Leaves out the requests whose URI contains `part` (such as `/leases` or `/events`).
    #[must_use]
    pub fn excluding(mut self, part: &str) -> Self {
        self.uri_excludes.push(part.to_string());
        self
    }

    /// Leaves out the dry runs (`dryRun=` in the URI: the operator's admission probes, which
    /// persist nothing).
    #[must_use]
    pub fn without_dry_runs(self) -> Self {
        self.excluding("dryRun=")
    }

    /// Only the requests the API server received at or after `t`.
    #[must_use]
    pub fn since(self, t: std::time::SystemTime) -> Self {
        Self {
            since: Some(t),
            ..self
        }
    }

    fn keeps(&self, w: &AuditedWrite) -> bool {
        let path = w.uri.split('?').next().unwrap_or_default();
        let in_scope = self.namespace.as_deref().is_none_or(|ns| {
            let namespaced = path.contains(&format!("/namespaces/{ns}/"))
                && (self.resources.is_empty()
                    || path
                        .split('/')
                        .any(|seg| self.resources.iter().any(|r| r == seg)));
            let named = self.cluster_objects
                && !path.contains("/namespaces/")
                && (w.object_name.starts_with(&format!("vcp:{ns}:"))
                    || path.contains(&format!("vcp:{ns}:"))
                    || path.contains(&format!("vcp%3A{ns}%3A")));
            namespaced || named
        });
        let resource = self.namespace.is_some()
            || self.resources.is_empty()
            || path
                .split('/')
                .any(|seg| self.resources.iter().any(|r| r == seg));
        in_scope
            && resource
            && self.user.as_deref().is_none_or(|u| w.user == u)
            && self.verb.as_deref().is_none_or(|v| w.verb == v)
            && self.since.is_none_or(|t| w.received_at >= t)
            && self.uri_contains.iter().all(|p| w.uri.contains(p.as_str()))
            && !self.uri_excludes.iter().any(|p| w.uri.contains(p.as_str()))
    }

    /// This query once its audit log holds every request answered before the call
    /// ([`audit_caught_up`] on its control plane and cluster): what an exact count, or a
    /// "nothing was written" check, reads, since the API server writes a request's audit event
    /// a moment after the answer that the test waited for.
    ///
    /// # Panics
    /// As [`audit_caught_up`].
    pub async fn caught_up(self) -> Self {
        let cp = self.cp.unwrap_or_else(|| ControlPlane::shared());
        audit_caught_up(cp, self.cluster).await;
        self
    }

    /// Every matching request, refused or not, in order.
    ///
    /// # Panics
    /// When the audit log cannot be read or a complete line is not JSON.
    #[must_use]
    pub fn attempts(&self) -> Vec<AuditedWrite> {
        let cp = self.cp.unwrap_or_else(|| ControlPlane::shared());
        audited_write_events(cp, self.cluster)
            .expect("audit log")
            .into_iter()
            .filter(|w| self.keeps(w))
            .collect()
    }

    /// The matching requests that succeeded (response code 2xx), in order.
    ///
    /// # Panics
    /// As [`Writes::attempts`].
    #[must_use]
    pub fn succeeded(&self) -> Vec<AuditedWrite> {
        let mut writes = self.attempts();
        writes.retain(|w| (200..300).contains(&w.code));
        writes
    }

    /// [`Writes::attempts`] as `(verb, request URI)` pairs.
    ///
    /// # Panics
    /// As [`Writes::attempts`].
    #[must_use]
    pub fn requests(&self) -> Vec<(String, String)> {
        self.attempts()
            .into_iter()
            .map(|w| (w.verb, w.uri))
            .collect()
    }
}

/// One `list` or `watch` request from the API server's audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedRead {
    /// `list` or `watch` ([`audited_read_events`]), any verb ([`audited_requests`]).
    pub verb: String,
    /// The request URI.
    pub uri: String,
    /// When the API server received the request (`requestReceivedTimestamp`, microsecond
    /// precision); the Unix epoch when absent.
    pub received_at: std::time::SystemTime,
    /// The client's `User-Agent` (which replica of one identity sent it).
    pub user_agent: String,
}

/// The `list` and `watch` requests `user` made on `cluster`, one per request as it started (a
/// watch is logged when its response starts, a list when it completes), in order. The audit
/// policy (`tests/control-plane/audit-policy.yaml`) logs them only for the operator's user,
/// `vcp-operator`, on StatefulSets, Deployments and the RBAC kinds, and for the syncer's,
/// `vcp-syncer`, on the tutorial's Cars (`example.loft.sh`, `cars`); for anything else the
/// answer is empty.
///
/// # Errors
/// When the audit log cannot be read or a complete line is not JSON.
pub fn audited_read_events(
    cp: &ControlPlane,
    cluster: Cluster,
    user: &str,
) -> anyhow::Result<Vec<AuditedRead>> {
    Ok(audited_requests(cp, cluster, user)?
        .into_iter()
        .filter(|r| r.verb == "list" || r.verb == "watch")
        .collect())
}

/// Every request `user` made on `cluster` that the audit policy logs (its writes, its `list`
/// and `watch` of the kinds it caches, its `get` of workloads, the lists of its resources
/// judge: `tests/control-plane/audit-policy.yaml`), one per request as it was answered (a
/// watch: as it started), whatever its verb.
///
/// # Errors
/// When the audit log cannot be read or a complete line is not JSON.
pub fn audited_requests(
    cp: &ControlPlane,
    cluster: Cluster,
    user: &str,
) -> anyhow::Result<Vec<AuditedRead>> {
    Ok(audit_events(cp, cluster)?
        .into_iter()
        .filter(|e| {
            let first_stage = if e["verb"] == "watch" {
                "ResponseStarted"
            } else {
                "ResponseComplete"
            };
            e["stage"] == first_stage && e["user"]["username"] == user
        })
        .map(|e| {
            let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            AuditedRead {
                verb: s(&e["verb"]),
                uri: s(&e["requestURI"]),
                received_at: received_at(&e),
                user_agent: s(&e["userAgent"]),
            }
        })
        .collect())
}

/// The request URIs of the `list` and `watch` requests `user` made on `cluster`
/// ([`audited_read_events`] says which the audit policy logs), in order: `(verb, request URI)`.
///
/// # Errors
/// When the audit log cannot be read or a complete line is not JSON.
pub fn audited_reads(
    cp: &ControlPlane,
    cluster: Cluster,
    user: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    Ok(audited_read_events(cp, cluster, user)?
        .into_iter()
        .map(|r| (r.verb, r.uri))
        .collect())
}

/// An audit event's `requestReceivedTimestamp`; the Unix epoch when absent.
fn received_at(event: &serde_json::Value) -> std::time::SystemTime {
    event["requestReceivedTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map_or(std::time::UNIX_EPOCH, std::time::SystemTime::from)
}
