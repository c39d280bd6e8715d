//! The embedded runtime as a v2 plugin inside vCluster's own syncer: the steps of one version
//! of the matrix, in order.

use super::*;

pub(crate) async fn inside(t: &Target) {
    let cp = ControlPlane::shared();
    let admin = vcp_tests::start_shared_operator(RUNTIME_IMAGE).await;
    let host = cp.client(Cluster::Host, Identity::Admin).await;
    let virtual_ = cp.client(Cluster::Virtual, Identity::Admin).await;
    vcp_tests::install_crds(&virtual_).await;
    vcp_tests::create_namespace(&host, &t.ns).await;
    vcp_tests::install_vcluster_chart_from(&host, &t.chart, &t.ns, "")
        .await
        .expect("install vCluster's chart");
    vcp_tests::create_namespace(&virtual_, &t.vns).await;
    // What kube-controller-manager's serviceaccount controller would make (the virtual control
    // plane runs none); vCluster's pod syncer reads a pod's service account.
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": t.vns}
    }))
    .expect("service account");
    Api::<ServiceAccount>::namespaced(virtual_.clone(), &t.vns)
        .patch(
            "default",
            &PatchParams::apply(TEST_FIELD_MANAGER),
            &Patch::Apply(&sa),
        )
        .await
        .expect("default service account");

    // The operator installs the embedded runtime as a v2 plugin into the chart's StatefulSet.
    vcp_tests::create_plugin(&admin, &t.ns, PLUGIN, plugin_spec("pod-hook")).await;
    vcp_tests::wait_ready(&admin, &t.ns, PLUGIN, "True", None, TIMEOUT).await;
    let sts = statefulset(&admin, t).await;

    // The pod: its init containers fill the plugins folder, then vCluster's syncer starts.
    let folder = fresh_plugins_folder(cp, &format!("{}-1", t.ns));
    assert_eq!(run_plugin_init_containers(&sts, &folder), [PLUGIN]);
    let plugin_path = folder.join(PLUGIN).join("plugin");
    assert_eq!(
        std::fs::read(&plugin_path).expect("installed plugin"),
        std::fs::read(runtime_binary()).expect("runtime binary")
    );
    // Beside it, a v2 plugin written in Go (tests/vcluster-go/cmd/go-pod-hook, a pod hook adding
    // `created-by-go-plugin`), built against the same vCluster version's SDK, copied in as a v2
    // image's init container does (`cp -r /plugin /plugins/<name>`).
    let go_plugin = folder.join(GO_PLUGIN);
    std::fs::create_dir_all(&go_plugin).expect("Go plugin folder");
    std::fs::copy(
        vcp_tests::oracle_path_at("GO_POD_HOOK", t.version),
        go_plugin.join("plugin"),
    )
    .expect("copy the Go plugin");
    let mut syncer =
        VClusterSyncer::start_binary(cp, &t.ns, VCLUSTER_RELEASE, &folder, Some(&t.syncer))
            .expect("start vCluster's syncer");
    // The syncer is this target's vCluster: the version it reports at start.
    assert_eq!(
        syncer.reported_version().as_deref(),
        Some(t.version),
        "the version vCluster's syncer {} reports (its log's `vCluster version` line)",
        t.syncer.display()
    );

    // 1. vCluster loaded the plugin, registered its declared pod hook, and runs it.
    let log = syncer
        .wait_log("Successfully loaded plugin", 2, TIMEOUT)
        .await;
    for plugin in [&plugin_path, &go_plugin.join("plugin")] {
        assert!(
            log.contains(&format!("\"plugin\": \"{}\"", plugin.display())),
            "vCluster loaded {}; log:\n{log}",
            plugin.display()
        );
    }
    assert!(
        log.contains(&format!(
            "Register client hook for v1 Pod in plugin {}",
            plugin_path.display()
        )),
        "vCluster registered the CreatePhysical pod hook; log:\n{log}"
    );
    let plugin_pids: Vec<u32> = syncer
        .children()
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .as_deref()
                == Some(&plugin_path)
        })
        .collect();
    assert_eq!(
        plugin_pids.len(),
        1,
        "one runtime process, started by vCluster from {}",
        plugin_path.display()
    );

    // 2. A Car created in the virtual cluster reaches the host through the runtime inside
    //    vCluster: the host copy is written by vCluster's own identity (the plugin runs with the
    //    host config vCluster hands its plugins).
    let started = SystemTime::now();
    apply_car(&virtual_, t, "tesla", "Tesla").await;
    let host_cars: Api<Car> = Api::namespaced(host.clone(), &t.ns);
    let host_car_name = format!("tesla-x-{}-x-{VCLUSTER_RELEASE}", t.vns);
    let host_tesla = wait_for(TIMEOUT, || {
        let api = host_cars.clone();
        let name = host_car_name.clone();
        async move { api.get_opt(&name).await.ok().flatten() }
    })
    .await;
    assert_eq!(host_tesla.spec.type_, "Tesla");
    assert_eq!(
        host_tesla
            .labels()
            .get("vcluster.loft.sh/managed-by")
            .map(String::as_str),
        Some(VCLUSTER_RELEASE)
    );
    let car_creates: Vec<_> = Audit::writes()
        .in_namespace(&t.ns)
        .resource("cars")
        .verb("create")
        .since(started)
        .succeeded();
    assert!(
        car_creates
            .iter()
            .any(|w| w.user == t.user() && w.object_name == host_car_name),
        "the host Car was created by vCluster's identity: {car_creates:?}"
    );

    // 3. A virtual Pod synced by vCluster's own pod syncer, with both plugins' CreatePhysical
    //    hooks in its host create.
    assert_hooked_create(
        &host,
        &virtual_,
        t,
        &syncer,
        "web",
        &[
            ("created-by-plugin", "pod-hook"),
            ("created-by-go-plugin", "go-hook"),
        ],
    )
    .await;

    // 4. A change to the VClusterPlugin takes effect in the running plugin.
    let plugins: Api<VClusterPlugin> = Api::namespaced(admin.clone(), &t.ns);
    plugins
        .patch(
            PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": plugin_spec("pod-hook-v2")})),
        )
        .await
        .expect("change the plugin");
    // The runtime reads its VClusterPlugin: each new pod is created with the hook of the spec
    // in force, so wait for one with the new value.
    let mut n = 0;
    let changed = loop {
        n += 1;
        let name = format!("after-{n}");
        create_virtual_pod(&virtual_, t, &name).await;
        let pod = host_pod(&host, t, &name).await;
        if pod.labels().get("created-by-plugin").map(String::as_str) == Some("pod-hook-v2") {
            break pod;
        }
        assert!(n < 20, "the changed hook never took effect");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(changed.labels()["created-by-plugin"], "pod-hook-v2");

    // 4b. An edit the operator refuses never runs, though the runtime sees it first (the
    // runtime applies only hooks the operator accepted: `acceptance`). The edited hook would
    // put vCluster's host pods on the node's network.
    let edited = plugins
        .patch(
            PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hooks": [{
                "name": "pod-hook", "apiVersion": "v1", "kind": "Pod", "events": ["CreatePhysical"],
                "labels": {"created-by-plugin": "refused"},
                "jsonPatch": [{"op": "add", "path": "/spec/hostNetwork", "value": true}]
            }]}})),
        )
        .await
        .expect("edit the hooks");
    let edited_version = edited.resource_version().unwrap_or_default();
    vcp_tests::wait_ready(
        &admin,
        &t.ns,
        PLUGIN,
        "False",
        Some("PolicyDenied"),
        TIMEOUT,
    )
    .await;
    // the runtime has read the edit: it restarted its syncers on that very version of the
    // plugin (its log, relayed by vCluster's syncer)
    let restart = wait_for(TIMEOUT, || {
        let log = syncer.log();
        let version = format!("\"resource_version\":\"{edited_version}\"");
        async move {
            log.lines()
                .find(|l| {
                    l.contains(vcp_syncer_runtime::runtime::RESTARTED) && l.contains(&version)
                })
                .map(str::to_string)
        }
    })
    .await;
    eprintln!("the runtime restarted on the refused edit: {restart}");
    assert_accepted_hook_in_force(
        &host,
        &virtual_,
        t,
        "after-refused",
        &format!("refused edit read by the runtime at resourceVersion {edited_version}"),
    )
    .await;

    // 4c. Deleting the plugin accepts nothing: the operator's Terminating status says
    // WorkloadPatched=True for the deleting generation without judging it (the seventh
    // security review). A finalizer of the author's holds the plugin in deletion.
    let live = plugins.get(PLUGIN).await.expect("read the plugin");
    let mut finalizers = live.finalizers().to_vec();
    finalizers.push("example.com/hold".into());
    plugins
        .patch(
            PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "finalizers": finalizers, "resourceVersion": live.resource_version()
            }})),
        )
        .await
        .expect("add the author's finalizer");
    plugins
        .delete(PLUGIN, &kube::api::DeleteParams::default())
        .await
        .expect("delete the plugin");
    let terminating =
        vcp_tests::wait_ready(&admin, &t.ns, PLUGIN, "False", Some("Terminating"), TIMEOUT).await;
    let version = terminating.resource_version().unwrap_or_default();
    // the runtime has read that very version of the plugin (its log, relayed by vCluster)
    let deleting_seen = wait_for(TIMEOUT, || {
        let log = syncer.log();
        let version = version.clone();
        async move {
            log.lines()
                .any(|l| {
                    l.contains(vcp_syncer_runtime::runtime::DELETING)
                        && l.contains(&format!("\"resource_version\":\"{version}\""))
                })
                .then_some(())
        }
    })
    .await;
    assert_accepted_hook_in_force(
        &host,
        &virtual_,
        t,
        "while-deleting",
        &format!("plugin being deleted (read by the runtime at resourceVersion {version}: {deleting_seen:?})"),
    )
    .await;
    // the operator finishes its cleanup (its finalizer goes), then the author lets go
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move {
            let p = plugins.get(PLUGIN).await.ok()?;
            (p.finalizers() == ["example.com/hold"]).then_some(())
        }
    })
    .await;
    plugins
        .patch(
            PLUGIN,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release the author's finalizer");

    // 5. The plugin deleted (4c), and the syncer restarted: a healthy vCluster without plugin.
    wait_for(TIMEOUT, || {
        let plugins = plugins.clone();
        async move { plugins.get_opt(PLUGIN).await.ok()?.is_none().then_some(()) }
    })
    .await;
    let sts = statefulset(&admin, t).await;
    // The runtime notices its parent is gone and exits.
    runtime_exits_without_its_parent(&syncer, plugin_pids[0]).await;
    syncer
        .stop()
        .expect("stop what is left of vCluster's syncer");
    let folder = fresh_plugins_folder(cp, &format!("{}-2", t.ns));
    assert!(
        run_plugin_init_containers(&sts, &folder).is_empty(),
        "the operator removed the plugin's init container"
    );
    let before = syncer.log().len();
    let syncer2 =
        VClusterSyncer::start_binary(cp, &t.ns, VCLUSTER_RELEASE, &folder, Some(&t.syncer))
            .expect("restart vCluster's syncer");
    let log = syncer2.log()[before..].to_string();
    assert!(log.contains(SYNCER_STARTED), "{log}");
    assert!(!log.contains("Successfully loaded plugin"), "{log}");
    assert!(syncer2.children().is_empty(), "no plugin process");
    let since = SystemTime::now();
    create_virtual_pod(&virtual_, t, "plain").await;
    let plain = host_pod(&host, t, "plain").await;
    assert!(plain.labels().get("created-by-plugin").is_none());
    assert_eq!(
        pod_writes(t, &plain.name_any(), since)
            .await
            .iter()
            .map(|(v, _)| v.as_str())
            .collect::<Vec<_>>(),
        ["create"]
    );
    drop(syncer);

    // 6. A v1 (legacy sidecar) plugin in Go, installed by the operator.
    v1_sidecar(cp, &admin, &host, &virtual_, t, syncer2).await;

    // The virtual API server is shared: the next version's syncer would sync these too.
    let dp = kube::api::DeleteParams::default();
    let lp = kube::api::ListParams::default();
    Api::<Pod>::namespaced(virtual_.clone(), &t.vns)
        .delete_collection(&dp, &lp)
        .await
        .expect("delete the virtual pods");
    Api::<Car>::namespaced(virtual_.clone(), &t.vns)
        .delete_collection(&dp, &lp)
        .await
        .expect("delete the virtual Cars");
}
