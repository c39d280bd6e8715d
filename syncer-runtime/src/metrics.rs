//! What the runtime tells about itself on `/metrics` (Prometheus text format, like the
//! operator's), served with `/healthz` on [`Config::metrics_bind_address`](crate::Config)
//! (`--metrics-bind-address` / `$VCLUSTER_PLUGIN_METRICS_BIND_ADDRESS` of the binary; no
//! listener when unset) by the HTTP server both binaries share ([`vcp_crds::http`]).
//!
//! | path | answer |
//! | --- | --- |
//! | `/metrics` | [`Metrics::encode`] |
//! | `/healthz` | `200 ok` while the process serves requests (liveness) |
//!
//! Metrics, each since the [`Metrics`] was made (one per [`Config`](crate::Config), so one per
//! process for the binary), over every spec generation of the plugin:
//! - `vcp_runtime_undecodable_objects_total{api_version, kind, side}`: objects skipped because
//!   they cannot be decoded (`vcp_crds::tolerant`): one per watch event or listed item
//!   of an object that did not decode (the unit of the operator's
//!   `vcp_operator_undecodable_objects_total`, which counts a delete event of one too), as the
//!   runtime's warning log line `skipped an object that cannot be decoded` is written. `api_version` and `kind` are the object's type (a synced type, a produced type,
//!   or `vcp.dev/v1alpha1` `VClusterPlugin` for the runtime's own plugin), `side` the cluster
//!   it was read from (`virtual` or `host`). A delete event of an undecodable object is not
//!   counted (nothing is skipped: it is gone), nor is a reconcile or resync of a key whose
//!   object stays undecodable: the count grows only when an API server sends the object again
//!   (it was changed, or a watch listed again after a restart or a `410 Gone`);
//! - `vcp_runtime_reconciles_total{api_version, kind}`: reconciles finished, whatever their
//!   result (for pod hooks `v1` `Pod`);
//! - `vcp_runtime_writes_total{api_version, kind}`: write requests (create, patch, delete) the
//!   syncers of the type sent, to either cluster ([`crate::stats::TypeStats::count_write`]);
//! - `vcp_runtime_heap_collects_total`: times the binary gave its heap's freed pages back to
//!   the kernel after a burst of reconciles ([`crate::heap`]), and
//!   `vcp_runtime_heap_collected_at_reconciles`: the count of finished reconciles (every
//!   type's) when it last did.
//!
//! With the test feature `reconcile-log` only, `/state` answers too (test machinery, one
//! `name value` line per figure): `heap_live_bytes`, the bytes the process holds on its heap
//! (`vcp_crds::heap::live_bytes`, counted by the allocator the binary installs with that
//! feature; 0 otherwise).

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use vcp_crds::http::Answer;

/// Labels of `vcp_runtime_undecodable_objects_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UndecodableLabels {
    api_version: String,
    kind: String,
    side: &'static str,
}

/// Labels of the per-type counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    api_version: String,
    kind: String,
}

/// The runtime's counters (module docs); share it between the syncers (through
/// [`crate::stats::TypeStats::with_metrics`]) and the HTTP server ([`Metrics::answer`]).
pub struct Metrics {
    registry: Registry,
    undecodable: Family<UndecodableLabels, Counter>,
    reconciles: Family<TypeLabels, Counter>,
    writes: Family<TypeLabels, Counter>,
    /// Finished reconciles of every type (not served: the sum of `reconciles`' lines), read by
    /// [`crate::heap::after_bursts`].
    reconciles_total: Counter,
    collects: Counter,
    collected_at: Gauge,
    /// The HTTP server's counters (`vcp_runtime_http_*`, [`vcp_crds::http::Stats`]).
    http: vcp_crds::http::Stats,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// `M` registered in `registry` as `name` with `help`.
fn registered<M>(registry: &mut Registry, name: &str, help: &str) -> M
where
    M: prometheus_client::registry::Metric + Clone + Default,
{
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

/// Fresh counters (none has a line before its first count).
impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let http = vcp_crds::http::Stats::default();
        http.register(&mut registry, "vcp_runtime");
        vcp_crds::build_info::register(&mut registry, "vcp_runtime");
        Metrics {
            http,
            undecodable: registered(
                &mut registry,
                "vcp_runtime_undecodable_objects",
                "Objects the runtime skipped because they cannot be decoded, by type and the cluster read (one per watch event or listed item)",
            ),
            reconciles: registered(
                &mut registry,
                "vcp_runtime_reconciles",
                "Reconciles the runtime finished, by type, whatever their result",
            ),
            writes: registered(
                &mut registry,
                "vcp_runtime_writes",
                "Write requests (create, patch, delete) the runtime's syncers sent, by type",
            ),
            reconciles_total: Counter::default(),
            collects: registered(
                &mut registry,
                "vcp_runtime_heap_collects",
                "Times the runtime gave its heap's freed pages back to the kernel after a burst of reconciles",
            ),
            collected_at: registered(
                &mut registry,
                "vcp_runtime_heap_collected_at_reconciles",
                "The count of finished reconciles, of every type, when the runtime last gave its heap's freed pages back",
            ),
            registry,
        }
    }
}

impl Metrics {
    /// Counts one skipped undecodable object of `api_version` / `kind` read from `side`
    /// (`virtual` or `host`); returns that line's count so far.
    pub fn count_undecodable(&self, api_version: &str, kind: &str, side: &'static str) -> u64 {
        self.undecodable
            .get_or_create(&UndecodableLabels {
                api_version: api_version.into(),
                kind: kind.into(),
                side,
            })
            .inc()
            + 1
    }

    /// Undecodable objects of `api_version` / `kind` skipped on `side` so far.
    pub fn undecodable(&self, api_version: &str, kind: &str, side: &'static str) -> u64 {
        self.undecodable
            .get(&UndecodableLabels {
                api_version: api_version.into(),
                kind: kind.into(),
                side,
            })
            .map_or(0, |c| c.get())
    }

    /// The reconcile and write counters of the type `api_version` / `kind`, looked up once
    /// (a [`TypeStats`](crate::stats::TypeStats) keeps them: no label is built on the reconcile
    /// and write paths).
    pub fn of_type(&self, api_version: &str, kind: &str) -> TypeCounters {
        let labels = type_labels(api_version, kind);
        TypeCounters {
            reconciles: self.reconciles.get_or_create(&labels).clone(),
            writes: self.writes.get_or_create(&labels).clone(),
            reconciles_total: self.reconciles_total.clone(),
        }
    }

    /// Reconciles finished so far, of every type ([`TypeCounters::count_reconcile`]).
    pub fn reconciles_total(&self) -> u64 {
        self.reconciles_total.get()
    }

    /// Counts one collect of the heap (`vcp_runtime_heap_collects_total`, [`crate::heap`]),
    /// made when `reconciles` reconciles had finished
    /// (`vcp_runtime_heap_collected_at_reconciles`).
    pub fn collected(&self, reconciles: u64) {
        self.collects.inc();
        self.collected_at
            .set(i64::try_from(reconciles).unwrap_or(i64::MAX));
    }

    /// Collects of the heap so far ([`Metrics::collected`]).
    pub fn collects(&self) -> u64 {
        self.collects.get()
    }

    /// The metrics in the Prometheus text exposition format.
    pub fn encode(&self) -> String {
        vcp_crds::http::encode(&self.registry)
    }

    /// The answer to a request of `path` (module docs: `/metrics`, `/healthz`, else `404`).
    pub fn answer(&self, path: &str) -> Answer {
        match path {
            "/metrics" => vcp_crds::http::metrics(&self.registry),
            "/healthz" => Answer::healthy(),
            #[cfg(feature = "reconcile-log")]
            "/state" => Answer::ok(
                "text/plain; charset=utf-8",
                format!("heap_live_bytes {}\n", vcp_crds::heap::live_bytes()),
            ),
            _ => Answer::not_found(),
        }
    }
}

/// `vcp_runtime_reconciles_total` and `vcp_runtime_writes_total` of one type
/// ([`Metrics::of_type`]); each count is one atomic increment.
#[derive(Clone, Debug, Default)]
pub struct TypeCounters {
    /// Finished reconciles of the type (count them with [`TypeCounters::count_reconcile`]).
    pub reconciles: Counter,
    /// Write requests of the type's syncers.
    pub writes: Counter,
    /// Finished reconciles of every type ([`Metrics::reconciles_total`]).
    reconciles_total: Counter,
}

impl TypeCounters {
    /// Counts one finished reconcile of the type, in its line and in the total of every type.
    pub fn count_reconcile(&self) {
        self.reconciles.inc();
        self.reconciles_total.inc();
    }
}

fn type_labels(api_version: &str, kind: &str) -> TypeLabels {
    TypeLabels {
        api_version: api_version.into(),
        kind: kind.into(),
    }
}

/// While the returned guard is held: `/metrics` and `/healthz` of `metrics` served on `addr`
/// (nothing when `addr` is `None`). Dropping the guard stops the server and frees the port.
///
/// # Errors
/// [`Error::Bind`](crate::Error::Bind) when `addr` cannot be listened on.
pub(crate) async fn serve_while_held(
    addr: Option<SocketAddr>,
    metrics: &Arc<Metrics>,
) -> Result<Option<tokio::sync::oneshot::Sender<()>>, crate::Error> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = vcp_crds::http::bind(addr)
        .await
        .map_err(crate::Error::Bind)?;
    let (held, dropped) = tokio::sync::oneshot::channel::<()>();
    let metrics = metrics.clone();
    let site = vcp_crds::http::Site {
        paths: "/metrics and /healthz",
        limits: vcp_crds::http::Limits::runtime(),
        stats: metrics.http.clone(),
    };
    tokio::spawn(vcp_crds::http::serve(
        listener,
        site,
        move |path: &str| metrics.answer(path),
        async move {
            let _ = dropped.await;
        },
    ));
    Ok(Some(held))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_carry_the_build_info() {
        let text = Metrics::default().encode();
        assert!(
            text.lines().any(|l| l
                == format!(
                    "vcp_runtime_build_info{{version=\"{}\"}} 1",
                    env!("CARGO_PKG_VERSION")
                )),
            "{text}"
        );
    }

    #[tokio::test]
    async fn served_while_the_guard_is_held_and_a_taken_port_is_an_error() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let metrics = Arc::new(Metrics::default());
        assert!(serve_while_held(None, &metrics).await.unwrap().is_none());
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap();
        let guard = serve_while_held(Some(addr), &metrics).await.unwrap();
        assert!(matches!(
            serve_while_held(Some(addr), &metrics).await,
            Err(crate::Error::Bind(e)) if e.addr == addr
        ));
        metrics.count_undecodable("v1", "ConfigMap", "host");
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        assert!(
            raw.contains(r#"vcp_runtime_undecodable_objects_total{api_version="v1",kind="ConfigMap",side="host"} 1"#),
            "{raw}"
        );
        drop(guard);
        // the server stops: the port can be bound again
        let mut freed = false;
        for _ in 0..100 {
            if std::net::TcpListener::bind(addr).is_ok() {
                freed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(freed, "the port is freed once the guard is dropped");
    }

    #[test]
    fn each_skip_is_one_count_on_its_own_line() {
        let m = Metrics::default();
        assert_eq!(m.undecodable("e2e.vcp.test/v1", "Blob", "virtual"), 0);
        assert_eq!(m.count_undecodable("e2e.vcp.test/v1", "Blob", "virtual"), 1);
        assert_eq!(m.count_undecodable("e2e.vcp.test/v1", "Blob", "virtual"), 2);
        assert_eq!(m.count_undecodable("e2e.vcp.test/v1", "Blob", "host"), 1);
        let pods = m.of_type("v1", "Pod");
        pods.count_reconcile();
        m.of_type("example.loft.sh/v1", "Car").count_reconcile();
        assert_eq!(m.reconciles_total(), 2, "one of each type");
        m.collected(m.reconciles_total());
        pods.writes.inc();
        m.of_type("v1", "Pod").writes.inc(); // the same line
        let text = m.answer("/metrics").body;
        for line in [
            r#"vcp_runtime_undecodable_objects_total{api_version="e2e.vcp.test/v1",kind="Blob",side="virtual"} 2"#,
            r#"vcp_runtime_undecodable_objects_total{api_version="e2e.vcp.test/v1",kind="Blob",side="host"} 1"#,
            r#"vcp_runtime_reconciles_total{api_version="v1",kind="Pod"} 1"#,
            r#"vcp_runtime_writes_total{api_version="v1",kind="Pod"} 2"#,
            "vcp_runtime_heap_collects_total 1",
            "vcp_runtime_heap_collected_at_reconciles 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert_eq!(m.answer("/healthz"), Answer::healthy());
        // the test endpoint exists only with the test feature (the workspace's tests have it,
        // through the test crate; `cargo test -p vcp-syncer-runtime` alone does not)
        let state = m.answer("/state");
        if cfg!(feature = "reconcile-log") {
            assert!(state.body.starts_with("heap_live_bytes "), "{state:?}");
        } else {
            assert_eq!(state, Answer::not_found());
        }
    }
}
