//! `vcluster-plugin-operator`: runs the VClusterPlugin controller with the in-cluster
//! configuration or `$KUBECONFIG`; JSON logs on stderr; stops gracefully on SIGTERM / Ctrl-C.

use clap::Parser;
use tracing_subscriber::EnvFilter;
use vcluster_plugin_operator::{Config, default_runtime_image, run_until};

/// Command line of the operator.
#[derive(Debug, Parser)]
#[command(version, about = "Installs VClusterPlugin objects into their vCluster")]
struct Args {
    /// Image of the embedded-runtime sidecar (plugins without `spec.image`).
    #[arg(long, env = "VCP_RUNTIME_IMAGE", default_value_t = default_runtime_image())]
    runtime_image: String,

    /// Reconciles running at once.
    #[arg(long, env = "VCP_CONCURRENCY", default_value_t = 4)]
    concurrency: u16,

    /// Operator policy (YAML; schema in the docs of `vcluster_plugin_operator::policy`):
    /// which RBAC rules a VClusterPlugin may grant. Default: DESIGN.md's.
    #[arg(long, env = "VCP_POLICY_FILE")]
    policy_file: Option<std::path::PathBuf>,

    /// Log filter (tracing EnvFilter syntax), such as `info` or `vcluster_plugin_operator=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(EnvFilter::try_new(&args.log).unwrap_or_else(|_| EnvFilter::new("info")))
        .init();

    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build a Kubernetes client (in-cluster config or $KUBECONFIG)");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut config = Config::new(client);
    config.runtime_image = args.runtime_image;
    config.concurrency = args.concurrency;
    config.instance = std::env::var("POD_NAME").ok();
    if let Some(path) = &args.policy_file {
        match vcluster_plugin_operator::policy::Policy::from_file(path) {
            Ok(p) => config.policy = p,
            Err(e) => {
                tracing::error!(error = %e, "cannot load the operator policy");
                return std::process::ExitCode::FAILURE;
            }
        }
    }

    tracing::info!(runtime_image = %config.runtime_image, "starting vcluster-plugin-operator");
    match run_until(config, shutdown_signal()).await {
        Ok(()) => {
            tracing::info!("stopped");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "operator failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Completes on SIGTERM (Kubernetes stopping the pod) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
