//! `vcluster-plugin-syncer`: the declarative runtime of vcluster-plugin-operator as a process.
//!
//! Reads its `VClusterPlugin` from the host and syncs what it declares (see
//! [`vcp_syncer_runtime::run`]). Logs JSON lines to stderr (`RUST_LOG` filters, default
//! `info`). Exits 0 on SIGTERM / ctrl-c, 1 with the error otherwise.
//!
//! Allocator: mimalloc. The runtime allocates and frees many small objects (watch events,
//! JSON values) across the tokio worker threads; glibc's per-thread arenas fragment under that
//! pattern and keep freed memory resident, which made the peak RSS of the sync benchmark
//! (`docs/BENCHMARKS.md`, "Sync runtime") grow well past what the caches hold.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;
use vcp_syncer_runtime::{Config, Error, PodSync, run};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(
    name = "vcluster-plugin-syncer",
    version,
    about = "Declarative vCluster plugin runtime: syncs the types and applies the hooks a VClusterPlugin declares"
)]
struct Args {
    /// Kubeconfig of the host cluster; default: in-cluster config (or $KUBECONFIG).
    #[arg(long, env = "HOST_KUBECONFIG")]
    host_kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the virtual cluster (the vCluster's API server).
    #[arg(long, env = "VIRTUAL_KUBECONFIG")]
    virtual_kubeconfig: PathBuf,
    /// Host namespace of the vCluster and of the VClusterPlugin; default: the pod's namespace
    /// ($POD_NAMESPACE) or the host kubeconfig's default namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: Option<String>,
    /// Name of the VClusterPlugin to run.
    #[arg(long, env = "VCLUSTER_PLUGIN_NAME")]
    plugin: String,
    /// vCluster name used in host names and labels; default: the plugin's spec.vcluster.name.
    #[arg(long, env = "VCLUSTER_NAME")]
    vcluster: Option<String>,
    /// `hooks`: apply Pod hooks to the host pods the vCluster made; `full`: sync pods
    /// virtual → host and their status host → virtual (standalone, no vCluster syncer).
    #[arg(long, value_enum, default_value_t = PodSyncArg::Hooks)]
    pod_sync: PodSyncArg,
    /// Concurrent workers per synced type.
    #[arg(long, env = "VCLUSTER_PLUGIN_WORKERS", default_value_t = 4)]
    workers: usize,
    /// Seconds between full resyncs of every synced object.
    #[arg(long, default_value_t = 300)]
    resync_seconds: u64,
}

/// `--pod-sync` values.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum PodSyncArg {
    /// Apply the plugin's physical Pod hooks to host pods.
    Hooks,
    /// Sync pods virtual → host, status host → virtual.
    Full,
}

async fn client(
    cluster: &'static str,
    path: Option<&Path>,
) -> Result<(kube::Client, String), Error> {
    let failed = |message: String| Error::Kubeconfig {
        cluster,
        path: path.map_or_else(|| "in-cluster/default".into(), |p| p.display().to_string()),
        message,
    };
    let config = match path {
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
    let namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config).map_err(|e| failed(e.to_string()))?;
    Ok((client, namespace))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn main_inner(args: Args) -> Result<(), Error> {
    let (host, host_namespace) = client("host", args.host_kubeconfig.as_deref()).await?;
    let (virtual_, _) = client("virtual", Some(&args.virtual_kubeconfig)).await?;
    let mut config = Config::new(
        host,
        virtual_,
        args.namespace.unwrap_or(host_namespace),
        args.plugin,
    );
    config.vcluster = args.vcluster;
    config.workers = args.workers.max(1);
    config.resync_period = std::time::Duration::from_secs(args.resync_seconds.max(1));
    config.pod_sync = match args.pod_sync {
        PodSyncArg::Hooks => PodSync::Hooks,
        PodSyncArg::Full => PodSync::Full,
    };
    info!(namespace = %config.namespace, plugin = %config.plugin, "vcluster-plugin-syncer starting");
    tokio::select! {
        result = run(config) => result,
        () = shutdown_signal() => {
            info!("signal received, exiting");
            Ok(())
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    match main_inner(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            error!(%error, "vcluster-plugin-syncer failed");
            eprintln!("vcluster-plugin-syncer: {error}");
            ExitCode::FAILURE
        }
    }
}
