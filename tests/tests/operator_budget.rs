//! Size budgets, end to end on the real host API server (etcd with its
//! default request limit of 1.5 MiB), the operator in-process under the `vcp-operator`
//! identity.
//!
//! Two plugins with about 800 KB of `env` each pass every per-plugin check, but the workload
//! holding both would be too large for etcd (`etcdserver: request is too large`). Before the
//! budgets, every apply of the workload failed from then on: the later plugin got no condition
//! and no Event, no other plugin of the vCluster could install, and a delete hung in
//! `Terminating`. Now the later-created one gets `Ready=False, reason=TooLarge` and an Event,
//! the first stays Ready, a third small plugin installs, and deleting an unrelated plugin
//! completes.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};
use vcp_tests::{create_plugin, delete_plugin, wait_event, wait_ready};

const NS: &str = "size-budget";
const TIMEOUT: Duration = Duration::from_secs(60);

/// A plugin of the vCluster `my-vcluster` (a v1 sidecar image: the embedded runtime takes no
/// `env` but `RUST_LOG`) with `env` of 25 values of 32,000 characters (the CRD's limit per value
/// is 32,768): 800,000 bytes of values.
fn big() -> Value {
    let env: Vec<Value> = (0..25)
        .map(|i| json!({ "name": format!("BIG_{i:02}"), "value": "x".repeat(32_000) }))
        .collect();
    json!({
        "vcluster": { "name": "my-vcluster" },
        "image": "registry.example.com/plugins/big:1.0",
        "version": "v1",
        "env": env,
    })
}

fn small() -> Value {
    json!({ "vcluster": { "name": "my-vcluster" } })
}

/// The names of the containers of the vCluster's pod template.
async fn containers(admin: &Client) -> Vec<String> {
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), NS)
        .get("my-vcluster")
        .await
        .expect("StatefulSet");
    sts.spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers.into_iter().map(|c| c.name).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn one_big_plugin_gets_too_large_and_blocks_no_other() {
    let admin = vcp_tests::start_shared_operator("vcp-test/runtime:budget").await;
    vcp_tests::create_namespace(&admin, NS).await;
    vcp_tests::apply_yaml(&admin, &vcp_tests::vcluster_workload(NS), Some(NS))
        .await
        .expect("the vCluster's workload");

    create_plugin(&admin, NS, "unrelated", small()).await;
    wait_ready(&admin, NS, "unrelated", "True", None, TIMEOUT).await;
    create_plugin(&admin, NS, "big-first", big()).await;
    wait_ready(&admin, NS, "big-first", "True", None, TIMEOUT).await;
    // Created later than `big-first`: the one that would cross the budget.
    create_plugin(&admin, NS, "big-second", big()).await;
    let refused = wait_ready(&admin, NS, "big-second", "False", Some("TooLarge"), TIMEOUT).await;
    let ready = vcp_tests::condition(&refused, "Ready").expect("Ready");
    assert!(
        ready.message.contains("1048576 bytes per workload") && ready.message.contains("big-first"),
        "the message names the budget and the plugin already there: {}",
        ready.message
    );
    let event = wait_event(&admin, NS, "big-second", "TooLarge", TIMEOUT).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    // The first stays installed and Ready; a small plugin still installs.
    create_plugin(&admin, NS, "small", small()).await;
    wait_ready(&admin, NS, "small", "True", None, TIMEOUT).await;
    wait_ready(&admin, NS, "big-first", "True", None, TIMEOUT).await;
    let names = containers(&admin).await;
    for name in ["unrelated", "big-first", "small"] {
        assert!(names.contains(&name.to_string()), "{name} in {names:?}");
    }
    assert!(!names.contains(&"big-second".to_string()), "{names:?}");

    // Deleting an unrelated plugin completes, and takes its container out.
    delete_plugin(&admin, NS, "unrelated", TIMEOUT).await;
    let names = containers(&admin).await;
    assert!(!names.contains(&"unrelated".to_string()), "{names:?}");
    assert!(names.contains(&"big-first".to_string()), "{names:?}");

    // Once the first is gone, the second fits and installs.
    delete_plugin(&admin, NS, "big-first", TIMEOUT).await;
    wait_ready(&admin, NS, "big-second", "True", None, TIMEOUT).await;
}
