//! A port the runtime cannot listen on does not stop it (`syncer-runtime/src/listener.rs`).
//!
//! The outside attack (low): a v1 plugin's image listened on the runtime's metrics port
//! (9460) before the runtime did; the runtime exited at start on every restart (a crash loop
//! beside vCluster's own containers) while the plugin said `Ready`. Here another listener holds
//! the runtime's metrics address when it starts, on real API servers: the runtime syncs a Car
//! anyway, reports `RuntimeHealthy=False` with reason `MetricsUnavailable` naming the address
//! and a Warning Event of that reason, and once the port is freed it listens there (`/healthz`
//! answers) and reports `Syncing` again, without a restart.

use std::time::Duration;

use kube::Api;
use serde_json::json;
use vcp_crds::VClusterPlugin;
use vcp_tests::runtime::{start_runtime, world};
use vcp_tests::{Cluster, ControlPlane, Identity, poll_for};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The plugin's `RuntimeHealthy` (status, reason, message), once it is there.
async fn runtime_healthy(api: &Api<VClusterPlugin>) -> Option<(String, String, String)> {
    let p = api.get("car-plugin").await.ok()?;
    let c = vcp_tests::condition(&p, "RuntimeHealthy")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn a_taken_metrics_port_is_reported_and_the_runtime_syncs_on() {
    let w = world("metrics-port", &["mp-a"]).await;
    // The world's runtime listens on a free port; this test runs its own, on a taken one.
    w.runtime.abort();
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let taken = holder.local_addr().unwrap();
    let cp = ControlPlane::shared();
    let runtime = start_runtime(
        cp.client(Cluster::Host, Identity::Syncer).await,
        cp.client(Cluster::Virtual, Identity::Syncer).await,
        &w.host_ns,
        "car-plugin",
        |config| {
            config.status_interval = Duration::from_millis(300);
            config.metrics_bind_address = Some(taken);
        },
    );

    // It syncs.
    w.put_car(
        "mp-a",
        "beetle",
        json!({}),
        json!({}),
        json!({"type": "Beetle", "seats": 4}),
    )
    .await;
    let host_name = vcp_tests::vcluster_host_name("beetle", "mp-a", &w.vcluster);
    w.host_car_where(&host_name, |c| c.data["spec"]["type"] == "Beetle")
        .await;
    assert!(!runtime.task.is_finished(), "the runtime runs on");

    // It says why there is no /metrics, in the status and as a Warning.
    let plugins: Api<VClusterPlugin> = Api::namespaced(w.host.clone(), &w.host_ns);
    let (_, _, message) = poll_for(TIMEOUT, || async {
        runtime_healthy(&plugins)
            .await
            .filter(|(s, r, _)| s == "False" && r == "MetricsUnavailable")
    })
    .await
    .expect("RuntimeHealthy=False MetricsUnavailable");
    assert!(message.contains(&taken.to_string()), "{message}");
    assert!(
        message.contains("declare it in that container's ports"),
        "{message}"
    );
    let event = vcp_tests::wait_event(
        &w.host,
        &w.host_ns,
        "car-plugin",
        "MetricsUnavailable",
        TIMEOUT,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    println!("reported: {message}");

    // The port freed: it listens there, and is healthy again, with no restart.
    drop(holder);
    let healthz = poll_for(TIMEOUT, || async {
        vcp_tests::http_get(taken, "/healthz")
            .await
            .filter(|(code, _)| *code == 200)
    })
    .await;
    assert!(
        healthz.is_some(),
        "/healthz on {taken} once the port is free"
    );
    poll_for(TIMEOUT, || async {
        runtime_healthy(&plugins)
            .await
            .filter(|(s, r, _)| s == "True" && r == "Syncing")
    })
    .await
    .expect("RuntimeHealthy=True Syncing again");
    assert!(
        !runtime.task.is_finished(),
        "the same runtime, never restarted"
    );
    runtime.task.abort();
}
