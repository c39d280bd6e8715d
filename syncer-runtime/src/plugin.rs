//! Plugin start-up for plugins written in Rust (public as `sdk::Plugin` / `sdk::client_from`):
//! the configuration from the environment a vCluster plugin sidecar gets ([`Plugin::init`]),
//! the clients built from kubeconfigs ([`client_from`], also used by the
//! `vcluster-plugin-syncer` binary), registration of syncers and hooks, and [`Plugin::start`],
//! which runs every syncer under the [`controller`](crate::controller) and the pod hooks under
//! [`pods`](crate::pods) — or, when vCluster started the process as a v2 plugin, serves
//! vCluster's v2 plugin protocol ([`crate::v2`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tracing::{Instrument, info, info_span, warn};
#[cfg(feature = "test-faults")]
use vcp_crds::fault::AbortAfterWrites;

use crate::context::{RegisterContext, SyncContext};
use crate::controller;
use crate::error::Error;
use crate::hooks::{ClientHook, Hooks};
use crate::pods::{PodHookOptions, run_pod_hooks};
use crate::stats::TypeStats;
use crate::syncer::Syncer;
use crate::v2;

type Launch =
    Box<dyn FnOnce(Arc<[Arc<dyn ClientHook>]>) -> BoxFuture<'static, Result<(), Error>> + Send>;

/// A plugin written in Rust: syncers and hooks registered on one [`RegisterContext`], run by
/// [`Plugin::start`] (vcluster-sdk's `plugin.MustInit` / `MustRegister` / `MustStart`).
pub struct Plugin {
    context: RegisterContext,
    syncers: Vec<((String, String), Launch)>,
    hooks: Vec<Arc<dyn ClientHook>>,
    stats: Vec<Arc<TypeStats>>,
    /// Set when vCluster started this process as a v2 plugin ([`crate::v2`]).
    v2: Option<v2::Session>,
}

impl Plugin {
    /// A plugin on `context`.
    pub fn new(context: RegisterContext) -> Self {
        Self {
            context,
            syncers: Vec::new(),
            hooks: Vec::new(),
            stats: Vec::new(),
            v2: None,
        }
    }

    /// A plugin configured the way it was started:
    ///
    /// - by vCluster as a v2 plugin (the magic cookie `VCLUSTER_PLUGIN=vcluster` is set, as
    ///   vCluster's Go SDK detects it): serves the v2 protocol ([`crate::v2`]) and waits for
    ///   vCluster's `Initialize`, whose kubeconfigs, host namespace and vCluster name make the
    ///   context; [`Plugin::start`] then answers vCluster;
    /// - otherwise as a sidecar, from the environment: `HOST_KUBECONFIG` (default:
    ///   in-cluster), `VIRTUAL_KUBECONFIG` (required), `POD_NAMESPACE` (default: the host
    ///   kubeconfig's namespace) and `VCLUSTER_NAME` (required).
    ///
    /// Either way the owner of host copies is read from the host
    /// ([`RegisterContext::with_vcluster_owner`]).
    ///
    /// # Errors
    /// [`Error::Kubeconfig`] when a kubeconfig cannot be loaded or a variable is missing;
    /// [`Error::PluginProtocol`] when the v2 protocol fails (the error is also returned to
    /// vCluster as the answer to `Initialize`).
    pub async fn init() -> Result<Self, Error> {
        if v2::started_by_vcluster() {
            return Self::init_v2().await;
        }
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (host, host_namespace) =
            client_from("host", var("HOST_KUBECONFIG").map(PathBuf::from)).await?;
        let virtual_path = var("VIRTUAL_KUBECONFIG").ok_or_else(|| Error::Kubeconfig {
            cluster: "virtual",
            path: "$VIRTUAL_KUBECONFIG".into(),
            message: "VIRTUAL_KUBECONFIG is not set".into(),
        })?;
        let (virtual_, _) = client_from("virtual", Some(PathBuf::from(virtual_path))).await?;
        let vcluster = var("VCLUSTER_NAME").ok_or_else(|| Error::Kubeconfig {
            cluster: "host",
            path: "$VCLUSTER_NAME".into(),
            message: "VCLUSTER_NAME is not set".into(),
        })?;
        let namespace = var("POD_NAMESPACE").unwrap_or(host_namespace);
        let context = RegisterContext::new(host, virtual_, namespace, vcluster)
            .with_vcluster_owner()
            .await;
        Ok(Self::new(context))
    }

    async fn init_v2() -> Result<Self, Error> {
        let session = v2::Session::serve().await?;
        let init = session.init_config();
        let (host, virtual_) = match v2::clients(init).await {
            Ok(clients) => clients,
            Err(error) => {
                session.fail(&error.to_string());
                return Err(error.into());
            }
        };
        let context = RegisterContext::new(
            host,
            virtual_,
            init.host_namespace.clone(),
            init.vcluster.clone(),
        )
        .with_vcluster_owner()
        .await;
        let mut plugin = Self::new(context);
        plugin.v2 = Some(session);
        Ok(plugin)
    }

    /// The v2 session when vCluster started this process ([`Plugin::init`]): the init config
    /// vCluster sent (its `plugin_config` is the plugin's configuration from the vCluster's
    /// values).
    pub fn v2_session(&self) -> Option<&v2::Session> {
        self.v2.as_ref()
    }

    /// The context to build syncers with.
    pub fn context(&self) -> &RegisterContext {
        &self.context
    }

    /// Registers a syncer; it runs from [`Plugin::start`] with the hooks of its type.
    pub fn register<S: Syncer>(&mut self, syncer: S) -> &mut Self {
        let translator = syncer.translator().clone();
        let stats = Arc::new(TypeStats::new(translator.api_version(), translator.kind()));
        self.stats.push(stats.clone());
        let context = self.context.clone();
        let key = (
            translator.api_version().to_string(),
            translator.kind().to_string(),
        );
        let key_kind = key.1.clone();
        let launch: Launch = Box::new(move |hooks| {
            Box::pin(async move {
                let hooks = Hooks::for_type(&hooks, translator.api_version(), translator.kind());
                let filter =
                    crate::pods::update_filter(translator.api_version(), translator.kind());
                let ctx = SyncContext::new(
                    context.clone(),
                    syncer.dynamic_type(),
                    translator,
                    hooks,
                    stats,
                )
                .with_update_filter(filter);
                let span = info_span!("sync", vcluster = %context.vcluster, kind = %key_kind);
                controller::run(syncer, ctx, controller::Options::from(&context))
                    .instrument(span)
                    .await
            })
        });
        self.syncers.push((key, launch));
        self
    }

    /// Registers a hook. Hooks of a type with a registered syncer run in its writes; `v1` `Pod`
    /// hooks without a pod syncer run on the host pods vCluster's own syncer made
    /// ([`crate::pods`], `--pod-sync=hooks`). Hooks of other types without a syncer are
    /// logged and ignored.
    pub fn register_hook<H: ClientHook>(&mut self, hook: H) -> &mut Self {
        self.hooks.push(Arc::new(hook));
        self
    }

    /// Statistics of the registered syncers (objects in sync, writes), in registration order.
    pub fn stats(&self) -> &[Arc<TypeStats>] {
        &self.stats
    }

    /// Runs every registered syncer (and the pod hooks) until one of them fails or the future
    /// is dropped.
    ///
    /// Started by vCluster as a v2 plugin: declares the registered hooks to vCluster (which
    /// then calls them through `Mutate` before its own writes, so no host pod is patched
    /// afterwards), starts the syncers once `SetLeader` arrives, and returns `Ok(())` when
    /// vCluster stops the plugin (or exits).
    ///
    /// # Errors
    /// The first error a syncer stops with.
    pub async fn start(mut self) -> Result<(), Error> {
        let Some(session) = self.v2.take() else {
            return self.run(true).await;
        };
        let table = Arc::new(v2::HookTable::new(self.hooks.clone()));
        session.ready(table);
        if !session.leader().await {
            info!("stopped before becoming leader");
            session.shutdown().await;
            return Ok(());
        }
        info!(syncers = self.syncers.len(), "leader: starting the syncers");
        let result = tokio::select! {
            result = self.run(false) => result,
            reason = session.stopped() => {
                info!(?reason, "stopping");
                Ok(())
            }
        };
        session.shutdown().await;
        result
    }

    /// Runs the syncers; `host_pod_hooks`: apply the `v1` `Pod` hooks to the host pods of the
    /// vCluster (a sidecar; a v2 plugin's pod hooks are called by vCluster instead).
    async fn run(self, host_pod_hooks: bool) -> Result<(), Error> {
        let hooks: Arc<[Arc<dyn ClientHook>]> = self.hooks.iter().cloned().collect();
        let mut tasks = tokio::task::JoinSet::new();
        let synced: Vec<(String, String)> = self.syncers.iter().map(|(k, _)| k.clone()).collect();
        for (_, launch) in self.syncers {
            tasks.spawn(launch(hooks.clone()));
        }
        let pod_hooks = Hooks::for_type(&self.hooks, "v1", "Pod");
        if host_pod_hooks && !pod_hooks.is_empty() && !synced.contains(&("v1".into(), "Pod".into()))
        {
            tasks.spawn(run_pod_hooks(PodHookOptions {
                host: self.context.host.clone(),
                namespace: self.context.host_namespace.clone(),
                vcluster: self.context.vcluster.clone(),
                hooks: pod_hooks,
                stats: Arc::new(TypeStats::new("v1", "Pod")),
            }));
        }
        for hook in &self.hooks {
            let key = (hook.api_version().to_string(), hook.kind().to_string());
            if !synced.contains(&key) && key != ("v1".into(), "Pod".into()) && host_pod_hooks {
                warn!(hook = hook.name(), api_version = %key.0, kind = %key.1, "no syncer of this type is registered; hook ignored");
            }
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(error),
                Err(error) => {
                    return Err(Error::Unsupported {
                        what: format!("a syncer task panicked: {error}"),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Waits until the kubeconfig file at `path` exists and is not empty, checking every `poll`,
/// and logs that it waits (at once, then every 30 s).
///
/// The operator mounts the vCluster's kubeconfig Secret `vc-<vcluster>` into the runtime
/// sidecar as an optional volume: vCluster's syncer writes that Secret on its first start, in
/// the same pod, so a sidecar added before that start finds the folder empty, and the kubelet
/// fills it once the Secret exists (a Secret volume is written whole, through one symlink
/// swap, so a file that is there is complete). Returns how long it waited. It never times
/// out: the sidecar has nothing to do without the virtual cluster, and a signal still stops
/// the process (the caller selects on it).
pub async fn wait_for_kubeconfig(path: &std::path::Path, poll: Duration) -> Duration {
    wait_for_kubeconfig_looking(path, poll, || {}).await
}

/// [`wait_for_kubeconfig`], calling `looked` after each look at the file that found it absent
/// or empty (so that a test can show the wait looked before it says it still waits).
async fn wait_for_kubeconfig_looking(
    path: &std::path::Path,
    poll: Duration,
    mut looked: impl FnMut(),
) -> Duration {
    let began = tokio::time::Instant::now();
    let mut logged: Option<tokio::time::Instant> = None;
    loop {
        if tokio::fs::metadata(path)
            .await
            .is_ok_and(|m| m.is_file() && m.len() > 0)
        {
            if logged.is_some() {
                info!(path = %path.display(), waited_seconds = began.elapsed().as_secs(), "the virtual cluster's kubeconfig is there");
            }
            return began.elapsed();
        }
        if logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(30)) {
            info!(
                path = %path.display(),
                "waiting for the virtual cluster's kubeconfig: vCluster writes its Secret on its first start, and the kubelet then fills this optional volume"
            );
            logged = Some(tokio::time::Instant::now());
        }
        looked();
        tokio::time::sleep(poll).await;
    }
}

/// A client and its default namespace from a kubeconfig file, or the in-cluster / default
/// configuration for `None`.
///
/// # Errors
/// [`Error::Kubeconfig`].
pub async fn client_from(
    cluster: &'static str,
    path: Option<PathBuf>,
) -> Result<(Client, String), Error> {
    let (config, failed) = client_config(cluster, path).await?;
    let namespace = config.default_namespace.clone();
    let builder =
        kube::client::ClientBuilder::try_from(config).map_err(|e| failed(e.to_string()))?;
    Ok((builder.build(), namespace))
}

/// [`client_from`] with the test-only fault point `fault` ([`vcp_crds::fault`]) on top of
/// kube's default stack; the binary passes the one its environment asks for, the same to both
/// of its clients (one count of writes for the process). Only with the `test-faults` feature,
/// which release builds leave out.
///
/// # Errors
/// [`Error::Kubeconfig`].
#[cfg(feature = "test-faults")]
pub async fn client_with_fault(
    cluster: &'static str,
    path: Option<PathBuf>,
    fault: &AbortAfterWrites,
) -> Result<(Client, String), Error> {
    let (config, failed) = client_config(cluster, path).await?;
    let namespace = config.default_namespace.clone();
    let builder =
        kube::client::ClientBuilder::try_from(config).map_err(|e| failed(e.to_string()))?;
    Ok((builder.with_layer(fault).build(), namespace))
}

/// The client configuration for `path` (see [`client_from`]), and the maker of this cluster's
/// [`Error::Kubeconfig`] for a later failure.
async fn client_config(
    cluster: &'static str,
    path: Option<PathBuf>,
) -> Result<(kube::Config, impl Fn(String) -> Error), Error> {
    let shown = path
        .as_ref()
        .map_or_else(|| "in-cluster/default".into(), |p| p.display().to_string());
    let failed = move |message: String| Error::Kubeconfig {
        cluster,
        path: shown.clone(),
        message,
    };
    let config = match &path {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| failed(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| failed(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| failed(e.to_string()))?,
    };
    Ok((config, failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Returns once `looks` has moved by two: the second look certainly saw the file as it was
    /// when this was called.
    async fn two_more_looks(looks: &std::sync::atomic::AtomicUsize) {
        let from = looks.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), async {
            while looks.load(std::sync::atomic::Ordering::SeqCst) < from + 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the wait looks at the file every 10 ms");
    }

    /// Absent, then empty, the file is waited for (each shown looked at); once written, the
    /// wait ends.
    #[tokio::test]
    async fn the_wait_ends_when_the_kubeconfig_is_written() {
        let dir = std::env::temp_dir().join(format!("vcp-wait-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config");
        let _ = std::fs::remove_file(&path);
        let looks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let waiting = tokio::spawn({
            let (path, looks) = (path.clone(), looks.clone());
            async move {
                wait_for_kubeconfig_looking(&path, Duration::from_millis(10), move || {
                    looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                })
                .await
            }
        });
        two_more_looks(&looks).await;
        assert!(!waiting.is_finished(), "no file: still waiting");
        std::fs::write(&path, "").unwrap();
        two_more_looks(&looks).await;
        assert!(!waiting.is_finished(), "an empty file: still waiting");
        let looked = looks.load(std::sync::atomic::Ordering::SeqCst);
        std::fs::write(&path, "apiVersion: v1\n").unwrap();
        let waited = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait ends once the file has content")
            .unwrap();
        assert!(
            waited >= Duration::from_millis(10 * (looked as u64 - 1)),
            "waited {waited:?} across {looked} looks 10 ms apart"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
