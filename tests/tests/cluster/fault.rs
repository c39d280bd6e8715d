//! A fault during a plugin install: the vCluster pod is force-deleted (`kubectl delete pod
//! --grace-period=0 --force`) while the StatefulSet rolls to the template with the tutorial
//! plugin's sidecar, at the moment the rolled pod exists but is not yet Ready. Everything
//! converges: the plugin Ready, the vCluster pod Running and Ready with the runtime sidecar (a
//! third pod: the kill really hit the roll), exactly one copy of the sidecar in the template,
//! and nothing of the virtual cluster lost: a virtual pod and a Car made before the kill are
//! still there, the pod's host copy still runs, and the Car reaches the host.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use vcp_tests::node::Node;
use vcp_tests::{poll_for, repo_root};

use crate::operator::installed_operator;
use crate::vcluster::{
    assert_plugin_ready, installed_vcluster, log_tail, pod_ready, ready_containers, scenario_lock,
};

/// The host namespace of this test's vCluster; the release keeps the sample's name, so the
/// sample's `spec.vcluster.name` applies unchanged.
const NAMESPACE: &str = "vc-fault";
const RELEASE: &str = "my-vcluster";

/// `config/samples/car-plugin.yaml` moved to host namespace `namespace`.
pub fn car_plugin_in(namespace: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join("config/samples/car-plugin.yaml"))
        .expect("read config/samples/car-plugin.yaml");
    assert!(
        text.contains("  namespace: my-vcluster\n"),
        "the sample's namespace"
    );
    text.replace(
        "  namespace: my-vcluster\n",
        &format!("  namespace: {namespace}\n"),
    )
}

/// The uid of the pod, if it exists.
async fn pod_uid(pods: &Api<Pod>, name: &str) -> Option<String> {
    pods.get_opt(name).await.ok()??.metadata.uid
}

#[tokio::test]
async fn killing_the_vcluster_pod_while_a_plugin_install_rolls_it_loses_nothing() {
    let _scenario = scenario_lock().lock().await;
    let node = Node::shared();
    installed_operator().await;
    let vcluster = installed_vcluster(NAMESPACE, RELEASE).await;
    let client = node.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &vcluster.namespace);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &vcluster.namespace);
    let vcluster_pod = vcluster.pod_name();

    node.kubectl(&["apply", "-f", "crds/cars.example.loft.sh.yaml"])
        .unwrap();
    let crd = std::fs::read_to_string(repo_root().join("crds/cars.example.loft.sh.yaml")).unwrap();
    vcluster
        .virtual_kubectl(&["apply", "-f", "-"], Some(&crd))
        .unwrap();

    // Before the install: a namespace, a Car (no plugin syncs it yet) and a pod in the virtual
    // cluster, the pod synced by vCluster and Running on the node.
    let ready_ns = poll_for(Duration::from_secs(60), || {
        let ok = vcluster
            .virtual_kubectl(&["create", "namespace", "team-a"], None)
            .is_ok()
            || vcluster
                .virtual_kubectl(&["get", "serviceaccount", "-n", "team-a", "default"], None)
                .is_ok();
        let sa = vcluster
            .virtual_kubectl(&["get", "serviceaccount", "-n", "team-a", "default"], None)
            .is_ok();
        async move { (ok && sa).then_some(()) }
    })
    .await;
    assert!(
        ready_ns.is_some(),
        "virtual namespace team-a and its ServiceAccount"
    );
    vcluster
        .virtual_kubectl(
            &["apply", "-f", "-"],
            Some(
                "apiVersion: example.loft.sh/v1\nkind: Car\nmetadata: {name: before, namespace: team-a}\nspec: {type: Audi, seats: 5}\n",
            ),
        )
        .unwrap();
    let car_uid = vcluster
        .virtual_kubectl(
            &[
                "-n",
                "team-a",
                "get",
                "car",
                "before",
                "-o",
                "jsonpath={.metadata.uid}",
            ],
            None,
        )
        .unwrap();
    vcluster.run_sleeping_pod("team-a", "keeper").unwrap();
    let virtual_pod_uid = vcluster
        .virtual_kubectl(
            &[
                "-n",
                "team-a",
                "get",
                "pod",
                "keeper",
                "-o",
                "jsonpath={.metadata.uid}",
            ],
            None,
        )
        .unwrap();
    let host_pod = format!("keeper-x-team-a-x-{RELEASE}");
    let host_pod_uid = poll_for(Duration::from_secs(120), || {
        let pods = pods.clone();
        let host_pod = host_pod.clone();
        async move {
            let pod = pods.get_opt(&host_pod).await.ok()??;
            (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod.metadata.uid?)
        }
    })
    .await
    .unwrap_or_else(|| panic!("the host pod {host_pod} Running before the install"));

    // The install: the plugin applied, then the roll watched. The kill comes once the
    // StatefulSet has a new revision, its pod was replaced (uid 0 -> 1) and the replacement is
    // not Ready yet.
    let uid0 = pod_uid(&pods, &vcluster_pod)
        .await
        .expect("the vCluster pod");
    let applied = node.kubectl_output(&["apply", "-f", "-"], Some(&car_plugin_in(NAMESPACE)));
    assert!(
        applied.status.success(),
        "kubectl apply of the plugin: {applied:?}"
    );
    let rolling = poll_for(Duration::from_secs(120), || {
        let (pods, sts) = (pods.clone(), sts.clone());
        let (name, uid0, release) = (vcluster_pod.clone(), uid0.clone(), RELEASE);
        async move {
            let status = sts.get(release).await.ok()?.status?;
            let (update, current) = (status.update_revision?, status.current_revision?);
            let pod = pods.get_opt(&name).await.ok()??;
            let uid = pod.metadata.uid.clone()?;
            (update != current && uid != uid0 && !pod_ready(&pod)).then_some((uid, update, current))
        }
    })
    .await;
    let Some((uid1, update, current)) = rolling else {
        panic!(
            "within 120 s of the apply, no replacement pod not yet Ready during a roll \
             (updateRevision != currentRevision):\n{}",
            node.kubectl(&["-n", NAMESPACE, "get", "sts,pods", "-o", "wide"])
                .unwrap_or_default()
        );
    };
    node.kubectl(&[
        "-n",
        NAMESPACE,
        "delete",
        "pod",
        &vcluster_pod,
        "--grace-period=0",
        "--force",
    ])
    .unwrap();
    eprintln!(
        "fault: killed {vcluster_pod} uid {uid1} (was {uid0}) while the StatefulSet rolled \
         from {current} to {update}"
    );

    // Convergence: the plugin Ready, a third pod Running and Ready with the sidecar.
    assert_plugin_ready(node, NAMESPACE, "car-sync", 180, " after the kill");
    let back = poll_for(Duration::from_secs(300), || {
        let pods = pods.clone();
        let (name, uid0, uid1) = (vcluster_pod.clone(), uid0.clone(), uid1.clone());
        async move {
            let pod = pods.get_opt(&name).await.ok()??;
            let uid = pod.metadata.uid.clone()?;
            (uid != uid0 && uid != uid1 && pod_ready(&pod)).then_some(pod)
        }
    })
    .await;
    let Some(back) = back else {
        panic!(
            "{vcluster_pod} not back Running and Ready within 300 s of the kill:\n{}",
            node.kubectl(&["-n", NAMESPACE, "describe", "pod", &vcluster_pod])
                .unwrap_or_else(|e| e.to_string())
        );
    };
    assert_eq!(
        back.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    assert_eq!(
        ready_containers(&back),
        ["car-sync", "syncer"],
        "the containers Ready in the pod after the kill"
    );

    // The roll finished, and the template holds the sidecar once, beside the chart's containers.
    let settled = poll_for(Duration::from_secs(60), || {
        let sts = sts.clone();
        async move {
            let status = sts.get(RELEASE).await.ok()?.status?;
            (status.update_revision.is_some()
                && status.update_revision == status.current_revision
                && status.ready_replicas == Some(1))
            .then_some(status)
        }
    })
    .await;
    assert!(
        settled.is_some(),
        "the StatefulSet did not settle (updateRevision == currentRevision, 1 ready replica)"
    );
    let template = sts.get(RELEASE).await.unwrap().spec.unwrap().template;
    let names: Vec<String> = template
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let chart_names: Vec<String> = vcluster.chart_template["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names.iter().filter(|n| *n == "car-sync").count(),
        1,
        "copies of the sidecar in the template: {names:?}"
    );
    assert_eq!(
        names.len(),
        chart_names.len() + 1,
        "the template's containers {names:?} vs the chart's {chart_names:?} plus the sidecar"
    );

    // Nothing lost: the virtual pod and Car of before the kill, same uids (kine's store on the
    // volume survived), the pod's host copy the same pod, and the Car synced by the plugin.
    let got = |kind: &str, name: &str| {
        vcluster.virtual_kubectl(
            &[
                "-n",
                "team-a",
                "get",
                kind,
                name,
                "-o",
                "jsonpath={.metadata.uid}",
            ],
            None,
        )
    };
    let answered = poll_for(Duration::from_secs(120), || {
        let ok = got("pod", "keeper").ok();
        async move { ok }
    })
    .await;
    assert_eq!(
        answered.as_deref(),
        Some(virtual_pod_uid.as_str()),
        "the virtual pod team-a/keeper after the kill"
    );
    assert_eq!(
        got("car", "before").ok().as_deref(),
        Some(car_uid.as_str()),
        "the virtual Car team-a/before after the kill"
    );
    let host = pods.get(&host_pod).await.unwrap();
    assert_eq!(
        host.metadata.uid.as_deref(),
        Some(host_pod_uid.as_str()),
        "the host pod {host_pod} was replaced"
    );
    assert_eq!(
        host.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    let host_car = format!("before-x-team-a-x-{RELEASE}");
    let synced = poll_for(Duration::from_secs(120), || {
        let got = node.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "car",
            &host_car,
            "-o",
            "jsonpath={.spec.type}",
        ]);
        async move { got.ok() }
    })
    .await;
    assert_eq!(
        synced.as_deref(),
        Some("Audi"),
        "the Car of before the kill did not reach the host as {NAMESPACE}/{host_car}; the \
         runtime's log:\n{}",
        log_tail(node, NAMESPACE, &vcluster_pod, "car-sync")
    );
}
