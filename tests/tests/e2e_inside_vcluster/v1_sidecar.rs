//! A v1 (legacy sidecar) plugin inside vCluster's own syncer.

use super::*;

/// A v1 sidecar plugin inside vCluster: the operator installs `VClusterPlugin` [`V1_PLUGIN`]
/// (`image`, `version: v1`, `args`, `config`), and the test runs what the pod would run, the
/// sidecar container the operator added (the Go v1 plugin at `t`'s version, with the container's
/// env and args: [`start_v1_sidecar`]) beside vCluster's syncer, after stopping `running` (a
/// changed pod template is a new pod).
///
/// vCluster's legacy plugin server (`pkg/plugin/v1/plugin.go`, the same at v0.30.0 and v0.36.1
/// but for its error handling) always listens on `localhost:10099` and accepts a plugin's
/// `RegisterPlugin` (name, address, client hooks) at any time. Two things depend on the
/// syncer's configuration listing the plugin under `plugin:` with no `version` (its
/// `LegacyOptions`, `pkg/config/config.go`: an entry with a `version` is not waited for unless
/// `optional`):
/// - only a listed plugin is waited for (`waitForPlugins`) before the controllers start;
/// - vCluster's clients run hooks only when, as they are made, some plugin is known
///   (`pluginhookclient.NewPluginClient`: `DefaultManager.HasPlugins()`, which for legacy plugins
///   is "the list is not empty", `Manager.Start`). So in a vCluster with no v2 plugin, an
///   unlisted v1 sidecar registers and its hook is never called: step 6a shows it. The
///   operator writes only the workload, never the vCluster's configuration, so such a plugin
///   needs the vCluster's values to list it (then the chart renders its own sidecar as well).
///
/// With the plugin listed (6b), vCluster waits for it, and its pod syncer creates the host pod
/// with the v1 hook's label, whose value came from `PLUGIN_CONFIG`, in the create.
pub(crate) async fn v1_sidecar(
    cp: &'static ControlPlane,
    admin: &Client,
    host: &Client,
    virtual_: &Client,
    t: &Target,
    mut running: VClusterSyncer,
) {
    let value = format!("from-config-{}", t.version.replace('.', ""));
    vcp_tests::create_plugin(
        admin,
        &t.ns,
        V1_PLUGIN,
        json!({
            "vcluster": {"name": VCLUSTER_RELEASE},
            "image": V1_IMAGE, "version": "v1",
            "args": ["-label", V1_LABEL],
            "config": {"label": value},
        }),
    )
    .await;
    vcp_tests::wait_ready(admin, &t.ns, V1_PLUGIN, "True", None, TIMEOUT).await;
    let sts = statefulset(admin, t).await;
    running.stop().expect("stop vCluster's syncer");
    let registered_hook = format!("Register client hook for v1 Pod in plugin {V1_PLUGIN}");

    // 6a. Not listed under `plugin:` (the chart's configuration as it is): vCluster starts its
    //     controllers without the plugin running, accepts its registration afterwards, and
    //     never calls its hook, since no plugin was known when its clients were made.
    let folder = fresh_plugins_folder(cp, &format!("{}-3", t.ns));
    let syncer =
        VClusterSyncer::start_binary(cp, &t.ns, VCLUSTER_RELEASE, &folder, Some(&t.syncer))
            .expect("start vCluster's syncer");
    let plugin_log = cp.dir().join(format!("{V1_PLUGIN}-{}-a.log", t.ns));
    let mut sidecar = start_v1_sidecar(&sts, t, &plugin_log);
    let log = syncer.wait_log(&registered_hook, 1, TIMEOUT).await;
    assert!(
        log.contains(&format!("Registering plugin {V1_PLUGIN}")),
        "{log}"
    );
    assert!(
        !log.contains(&format!("Waiting for plugin {V1_PLUGIN}")),
        "{log}"
    );
    let since = SystemTime::now();
    create_virtual_pod(virtual_, t, "unlisted").await;
    let unlisted = host_pod(host, t, "unlisted").await;
    assert_eq!(
        unlisted.labels().get(V1_LABEL),
        None,
        "vCluster does not call an unlisted v1 plugin's hook when it has no other plugin"
    );
    assert_eq!(
        pod_writes(t, &unlisted.name_any(), since)
            .await
            .iter()
            .map(|(v, _)| v.as_str())
            .collect::<Vec<_>>(),
        ["create"]
    );
    let plugin_said = wait_for(TIMEOUT, || async {
        let said = std::fs::read_to_string(&plugin_log).ok()?;
        said.contains(&format!("Registered plugin {V1_PLUGIN}"))
            .then_some(said)
    })
    .await;
    assert!(
        !plugin_said.contains("Mutate CreatePhysical"),
        "the plugin registered and was never called:\n{plugin_said}"
    );
    sidecar.kill().await.expect("stop the plugin");
    drop(syncer);

    // 6b. Listed under `plugin:` with no version, as the chart's config Secret `vc-config-<name>`
    //     (`chart/templates/config-secret.yaml`: the release's values as `config.yaml`) holds it
    //     when the vCluster's values list the plugin there; the operator writes only the
    //     StatefulSet, so the test adds that entry (`start --set`). vCluster waits for the plugin
    //     before it starts its controllers; the sidecar starts while it waits.
    let folder = fresh_plugins_folder(cp, &format!("{}-4", t.ns));
    let before = VClusterSyncer::log_of(cp, &t.ns, VCLUSTER_RELEASE).len();
    let starting = {
        let (ns, binary) = (t.ns.clone(), t.syncer.clone());
        let sets = vec![format!("plugin.{V1_PLUGIN}.image={V1_IMAGE}")];
        tokio::task::spawn_blocking(move || {
            VClusterSyncer::start_with(cp, &ns, VCLUSTER_RELEASE, &folder, Some(&binary), &sets)
        })
    };
    let waiting = format!("Waiting for plugin {V1_PLUGIN} to register...");
    let log = wait_for(TIMEOUT, || async {
        let log = VClusterSyncer::log_of(cp, &t.ns, VCLUSTER_RELEASE);
        log.get(before..)
            .filter(|l| l.contains(&waiting))
            .map(str::to_string)
    })
    .await;
    assert!(!log.contains(SYNCER_STARTED), "{log}");
    let plugin_log = cp.dir().join(format!("{V1_PLUGIN}-{}-b.log", t.ns));
    let mut sidecar = start_v1_sidecar(&sts, t, &plugin_log);
    let syncer = starting
        .await
        .expect("the syncer's start")
        .expect("start vCluster's syncer with the plugin listed");
    let log = syncer.log()[before..].to_string();
    let order = [
        waiting.clone(),
        format!("Registering plugin {V1_PLUGIN}"),
        format!("Plugin {V1_PLUGIN} has successfully registered"),
        SYNCER_STARTED.to_string(),
    ];
    let at: Vec<usize> = order
        .iter()
        .map(|n| {
            log.find(n.as_str())
                .unwrap_or_else(|| panic!("vCluster's log holds {n:?}:\n{log}"))
        })
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "vCluster waited for the plugin before it started its controllers: {order:?} at {at:?}:\n{log}"
    );
    assert!(log.contains(&registered_hook), "{log}");
    assert_hooked_create(
        host,
        virtual_,
        t,
        &syncer,
        "web-v1",
        &[(V1_LABEL, value.as_str())],
    )
    .await;
    let plugin_said = std::fs::read_to_string(&plugin_log).unwrap_or_default();
    assert!(
        plugin_said.contains(&format!(
            "Mutate CreatePhysical v1 Pod {}/web-v1-x-{}-x-{VCLUSTER_RELEASE}",
            t.ns, t.vns
        )),
        "vCluster called the plugin's Mutate with the host pod:\n{plugin_said}"
    );
    drop(syncer);
    sidecar.kill().await.expect("stop the plugin");
    vcp_tests::delete_plugin(admin, &t.ns, V1_PLUGIN, TIMEOUT).await;
}

/// Starts the v1 sidecar container [`V1_PLUGIN`] of the StatefulSet's pod template as the
/// kubelet would beside the syncer container: its image ([`V1_IMAGE`], no `command`: the image's
/// entrypoint) is the Go v1 plugin at `t`'s version (`GO_POD_HOOK_V1`), run with the container's
/// `args` and with exactly the container's environment (nothing of the test's own). Its output
/// goes to `log`; it is killed when dropped.
pub(crate) fn start_v1_sidecar(sts: &StatefulSet, t: &Target, log: &Path) -> tokio::process::Child {
    let container = sts
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == V1_PLUGIN))
        .expect("the operator's v1 sidecar container");
    assert_eq!(container.image.as_deref(), Some(V1_IMAGE));
    assert_eq!(container.command, None, "the image's entrypoint runs");
    assert_eq!(container.env_from, None);
    let env: Vec<(String, String)> = container
        .env
        .iter()
        .flatten()
        .map(|e| {
            assert!(e.value_from.is_none(), "{e:?}");
            (e.name.clone(), e.value.clone().unwrap_or_default())
        })
        .collect();
    tokio::process::Command::new(vcp_tests::oracle_path_at("GO_POD_HOOK_V1", t.version))
        .args(container.args.iter().flatten())
        .env_clear()
        .envs(env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).expect("plugin log"))
        .kill_on_drop(true)
        .spawn()
        .expect("start the Go v1 plugin")
}
