//! `vcluster-plugin-operator`: runs the VClusterPlugin controller with the in-cluster
//! configuration or `$KUBECONFIG`; JSON logs on stderr; serves /metrics, /healthz and /readyz;
//! optional leader election (`--leader-elect`); stops gracefully on SIGTERM / Ctrl-C (and
//! exits anyway when the graceful stop has not finished 10 s later).
//!
//! Subcommands:
//! - none, or `run`: the controller (flags: [`RunArgs`]);
//! - `crd`: print both CRDs as multi-document YAML (the committed files' content);
//! - `import`: convert a vCluster Helm values file (`plugin:` / `plugins:`) or `vcluster.yaml`
//!   (`sync.toHost.customResources` / `sync.fromHost.customResources`) into VClusterPlugin
//!   manifests (see [`vcluster_plugin_operator::import`]).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Test machinery (feature `reconcile-log` only): the heap's live bytes counted for `/state`.
#[cfg(feature = "reconcile-log")]
#[global_allocator]
static ALLOCATOR: vcp_crds::heap::Counting<std::alloc::System> =
    vcp_crds::heap::Counting(std::alloc::System);

use futures::FutureExt;
use tracing_subscriber::EnvFilter;
use vcluster_plugin_operator::operations::OperationsArgs;
use vcluster_plugin_operator::{
    Config, default_runtime_image, http as operator_http, import, run_until,
};

/// Command line of the operator.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Installs VClusterPlugin objects into their vCluster",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// What to do; without a subcommand the controller runs (as `run`).
    #[command(subcommand)]
    command: Option<Command>,

    /// Flags of the controller, accepted without the `run` subcommand too.
    #[command(flatten)]
    run: RunArgs,
}

/// Subcommands of the operator binary.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller (the default without a subcommand).
    Run(RunArgs),
    /// Print the CustomResourceDefinitions (VClusterPlugin, Car) as multi-document YAML.
    Crd,
    /// Convert a vCluster Helm values file / vcluster.yaml (`plugin:`, `plugins:`,
    /// `sync.{toHost,fromHost}.customResources`) into VClusterPlugin manifests.
    Import(ImportArgs),
}

/// Flags of the controller (`run`, or no subcommand). Add new run flags here.
#[derive(Debug, Clone, clap::Args)]
struct RunArgs {
    /// Image of the embedded-runtime sidecar (plugins without `spec.image`).
    #[arg(long, env = "VCP_RUNTIME_IMAGE", default_value_t = default_runtime_image())]
    runtime_image: String,

    /// Reconciles running at once.
    #[arg(long, env = "VCP_CONCURRENCY", default_value_t = vcluster_plugin_operator::DEFAULT_CONCURRENCY)]
    concurrency: u16,

    /// Milliseconds the controller waits after a plugin's last trigger (a watch event of the
    /// plugin, its vCluster's workload or its RBAC objects) before reconciling it, so that the
    /// events of one reconcile's own writes coalesce; 0 reconciles at once.
    #[arg(long, env = "VCP_DEBOUNCE_MS", default_value_t = vcluster_plugin_operator::DEBOUNCE_MS)]
    debounce_ms: u64,

    /// Operator policy (YAML; schema in the docs of `vcluster_plugin_operator::policy` and in
    /// README.md): which RBAC rules a VClusterPlugin may grant and what its container may ask
    /// for. Default: the built-in policy (no wildcards, no escalate/bind/impersonate, no write
    /// verbs in cluster-scoped rules, no cluster-wide secrets; no privileged, privilege
    /// escalation, added capabilities, root, unconfined profiles, Secret references or mounts
    /// of the vCluster's volumes).
    #[arg(long, env = "VCP_POLICY_FILE")]
    policy_file: Option<std::path::PathBuf>,

    /// Log filter (tracing EnvFilter syntax), such as `info` or `vcluster_plugin_operator=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,

    #[command(flatten)]
    operations: OperationsArgs,
}

/// Flags of `import`.
#[derive(Debug, clap::Args)]
struct ImportArgs {
    /// The Helm values file to convert (`-` for stdin).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,

    /// The vCluster (Helm release) the plugins are installed into.
    #[arg(long, value_name = "NAME")]
    vcluster: String,

    /// Namespace of the VClusterPlugins (the vCluster's host namespace); default: the vCluster's
    /// name, the namespace `vcluster create NAME` uses (`vcluster-NAME` with older CLIs: pass
    /// it explicitly then).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    namespace: Option<String>,

    /// Kubeconfig of the host cluster, read only to resolve the kind and version of each
    /// `customResources` key (`certificates.cert-manager.io`) from its discovery, as vCluster
    /// reads the CRD from the host. Without it, a file with enabled `customResources` is refused.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,

    /// Name of the VClusterPlugin made from the `customResources` blocks.
    #[arg(long, value_name = "NAME", default_value = import::CUSTOM_RESOURCES_PLUGIN)]
    name: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        None => run(cli.run),
        Some(Command::Run(args)) => run(args),
        Some(Command::Crd) => print_crds(),
        Some(Command::Import(args)) => run_import(&args),
    }
}

/// `crd`: both CRDs, as committed in `crds/`, separated by `---`.
fn print_crds() -> ExitCode {
    let mut docs = Vec::new();
    for (_, crd) in vcp_crds::crd_files() {
        match vcp_crds::crd_yaml(&crd) {
            Ok(doc) => docs.push(doc),
            Err(e) => {
                eprintln!("error: cannot serialize the CRD {}: {e}", crd_name(&crd));
                return ExitCode::FAILURE;
            }
        }
    }
    write_stdout(&docs.join("---\n"))
}

fn crd_name(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> &str {
    crd.metadata.name.as_deref().unwrap_or("?")
}

/// `import`: manifests on stdout, warnings on stderr; on an error nothing on stdout.
fn run_import(args: &ImportArgs) -> ExitCode {
    let (source, text) = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut text) {
            eprintln!("error: cannot read the values from stdin: {e}");
            return ExitCode::FAILURE;
        }
        ("<stdin>".to_string(), text)
    } else {
        match std::fs::read_to_string(&args.file) {
            Ok(t) => (args.file.display().to_string(), t),
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", args.file.display());
                return ExitCode::FAILURE;
            }
        }
    };
    let namespace = args.namespace.as_deref().unwrap_or(&args.vcluster);
    let mut options = import::ImportOptions {
        resolved: None,
        name: Some(args.name.clone()),
    };
    if let Some(kubeconfig) = &args.kubeconfig {
        let keys = match import::custom_resource_keys(&text) {
            Ok(keys) => keys,
            Err(e) => {
                eprintln!("error: {source}: {e}");
                return ExitCode::FAILURE;
            }
        };
        if !keys.is_empty() {
            match resolve_on_host(kubeconfig, &keys) {
                Ok(resolved) => options.resolved = Some(resolved),
                Err(e) => {
                    eprintln!(
                        "error: cannot read the host's discovery through {}: {e}",
                        kubeconfig.display()
                    );
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    match import::import_with(&text, &args.vcluster, namespace, &options) {
        Ok(out) => {
            for warning in &out.warnings {
                eprintln!("warning: {source}: {warning}");
            }
            for note in &out.notes {
                eprintln!("note: {source}: {note}");
            }
            write_stdout(&out.yaml)
        }
        Err(e) => {
            eprintln!("error: {source}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The types of `keys` from the discovery of the API server of `kubeconfig` (its current
/// context).
fn resolve_on_host(
    kubeconfig: &std::path::Path,
    keys: &[String],
) -> Result<std::collections::BTreeMap<String, import::ResolvedType>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| e.to_string())?;
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        import::resolve::resolve(client, keys)
            .await
            .map_err(|e| e.to_string())
    })
}

fn write_stdout(text: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The controller: builds a client, runs until SIGTERM / Ctrl-C.
fn run(args: RunArgs) -> ExitCode {
    // Before any allocation of the runtime's threads (`trim::fix_mmap_threshold`).
    vcluster_plugin_operator::trim::fix_mmap_threshold();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run_controller(args))
}

async fn run_controller(args: RunArgs) -> ExitCode {
    // One JSON object a line; `span` holds the fields of the current span and `spans` those of
    // every span it is in, outermost first: a reconcile's `plugin` and `vcluster`, a write's
    // `kind` and `object` (`vcluster_plugin_operator::trace`).
    tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_span_list(true)
        .with_writer(std::io::stderr)
        .with_env_filter(EnvFilter::try_new(&args.log).unwrap_or_else(|_| EnvFilter::new("info")))
        .init();

    let (client, lease_client) = match tokio::try_join!(client(true), client(false)) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build a Kubernetes client (in-cluster config or $KUBECONFIG)");
            return ExitCode::FAILURE;
        }
    };
    let mut config = Config::new(client);
    config.lease_client = Some(lease_client);
    config.runtime_image = args.runtime_image;
    config.concurrency = args.concurrency;
    config.debounce = std::time::Duration::from_millis(args.debounce_ms);
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
    config.leader_election = args.operations.leader_election();

    let shutdown = shutdown_signal().boxed().shared();
    let listener = match operator_http::bind(args.operations.metrics_bind_address).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the HTTP server");
            return std::process::ExitCode::FAILURE;
        }
    };
    tokio::spawn(operator_http::serve(
        listener,
        config.telemetry.clone(),
        shutdown.clone(),
    ));

    tracing::info!(
        runtime_image = %config.runtime_image,
        leader_election = ?config.leader_election,
        concurrency = config.concurrency,
        debounce_ms = u64::try_from(config.debounce.as_millis()).unwrap_or(u64::MAX),
        // the test machinery compiled in (cargo features `test-faults`, `reconcile-log`):
        // false in a release build; the benchmark checks it runs a build without them
        test_machinery = cfg!(any(feature = "test-faults", feature = "reconcile-log")),
        "starting vcluster-plugin-operator"
    );
    // A graceful stop that does not finish within SHUTDOWN_DEADLINE of the signal ends anyway:
    // kube-runtime holds its applier until the plugin cache is ready, and its graceful
    // shutdown waits for the applier, so a signal that came before the caches filled (the API
    // server slow or unreachable at start-up) was never answered
    // (tests/tests/faults_operator_lease.rs). Exiting mid-reconcile is safe: every write boundary
    // survives a kill (tests/tests/faults_operator_kill.rs).
    let deadline = {
        let shutdown = shutdown.clone();
        async move {
            shutdown.await;
            tokio::time::sleep(SHUTDOWN_DEADLINE).await;
        }
    };
    tokio::select! {
        result = run_until(config, shutdown) => match result {
            Ok(()) => {
                tracing::info!("stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = %e, "operator failed");
                ExitCode::FAILURE
            }
        },
        () = deadline => {
            tracing::error!(
                "the graceful stop did not finish within {} s of the signal; exiting",
                SHUTDOWN_DEADLINE.as_secs()
            );
            ExitCode::FAILURE
        }
    }
}

/// How long a graceful stop may take after SIGTERM / Ctrl-C before the process exits anyway
/// (well within Kubernetes' default 30 s termination grace period).
const SHUTDOWN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// The operator's client: the in-cluster configuration or `$KUBECONFIG`; its `User-Agent` is
/// `vcluster-plugin-operator/<version>`, followed by `/<POD_NAME>` when set, so an API server's
/// audit log tells replicas apart; built with the `test-faults` feature (tests only), with the
/// test-only fault point of `vcluster_plugin_operator::fault` (inert unless
/// `VCP_FAULT_ABORT_AFTER_WRITES` or `VCP_FAULT_STOP_AFTER_WRITES` is set) when `faults`
/// (the controller's client; the Lease's client, which the fault point never counts, gets none).
/// Each call gives a client with its own connection pool.
async fn client(faults: bool) -> Result<kube::Client, String> {
    let mut config = kube::Config::infer().await.map_err(|e| e.to_string())?;
    let agent = match std::env::var("POD_NAME") {
        Ok(pod) if !pod.is_empty() => {
            format!(
                "vcluster-plugin-operator/{}/{pod}",
                env!("CARGO_PKG_VERSION")
            )
        }
        _ => format!("vcluster-plugin-operator/{}", env!("CARGO_PKG_VERSION")),
    };
    if let Ok(value) = http::HeaderValue::from_str(&agent) {
        config.headers.push((http::header::USER_AGENT, value));
    }
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|e| e.to_string())?;
    #[cfg(feature = "test-faults")]
    if faults {
        let layer = vcluster_plugin_operator::fault::AbortAfterWrites::from_env()?;
        return Ok(builder.with_layer(&layer).build());
    }
    #[cfg(not(feature = "test-faults"))]
    let _ = faults;
    Ok(builder.build())
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_subcommand_keeps_the_run_flags() {
        let cli = Cli::try_parse_from([
            "vcluster-plugin-operator",
            "--runtime-image",
            "img:1",
            "--concurrency",
            "2",
        ])
        .expect("parse");
        assert!(cli.command.is_none());
        assert_eq!(cli.run.runtime_image, "img:1");
        assert_eq!(cli.run.concurrency, 2);
    }

    #[test]
    fn debounce_defaults_to_the_controllers_and_can_be_set() {
        let cli = Cli::try_parse_from(["vcluster-plugin-operator"]).expect("parse");
        assert_eq!(
            u128::from(cli.run.debounce_ms),
            vcluster_plugin_operator::DEBOUNCE.as_millis()
        );
        let cli = Cli::try_parse_from(["vcluster-plugin-operator", "--debounce-ms", "200"])
            .expect("parse");
        assert_eq!(cli.run.debounce_ms, 200);
    }

    #[test]
    fn run_subcommand_takes_the_same_flags() {
        let cli = Cli::try_parse_from(["vcluster-plugin-operator", "run", "--concurrency", "7"])
            .expect("parse");
        match cli.command {
            Some(Command::Run(args)) => assert_eq!(args.concurrency, 7),
            other => panic!("expected run, got {other:?}"),
        }
    }

    #[test]
    fn operations_flags() {
        let cli = Cli::try_parse_from([
            "vcluster-plugin-operator",
            "--leader-elect",
            "--lease-name",
            "l",
            "--lease-namespace",
            "ns",
            "--lease-duration",
            "9",
            "--metrics-bind-address",
            "127.0.0.1:9090",
        ])
        .expect("parse");
        let election = cli.run.operations.leader_election().expect("elected");
        assert_eq!(
            (election.lease_name.as_str(), election.namespace.as_str()),
            ("l", "ns")
        );
        assert_eq!(election.duration_seconds, 9);
        assert_eq!(
            cli.run.operations.metrics_bind_address.to_string(),
            "127.0.0.1:9090"
        );
        let plain = Cli::try_parse_from(["vcluster-plugin-operator"]).expect("parse");
        assert!(plain.run.operations.leader_election().is_none());
        assert_eq!(
            plain.run.operations.metrics_bind_address.to_string(),
            "0.0.0.0:8080"
        );
    }

    #[test]
    fn import_flags() {
        let cli = Cli::try_parse_from([
            "vcluster-plugin-operator",
            "import",
            "-f",
            "plugin.yaml",
            "--vcluster",
            "my-vcluster",
            "-n",
            "team-a",
        ])
        .expect("parse");
        match cli.command {
            Some(Command::Import(args)) => {
                assert_eq!(args.file, PathBuf::from("plugin.yaml"));
                assert_eq!(args.vcluster, "my-vcluster");
                assert_eq!(args.namespace.as_deref(), Some("team-a"));
                assert_eq!(args.kubeconfig, None);
                assert_eq!(args.name, import::CUSTOM_RESOURCES_PLUGIN);
            }
            other => panic!("expected import, got {other:?}"),
        }
        let cli = Cli::try_parse_from([
            "vcluster-plugin-operator",
            "import",
            "-f",
            "vcluster.yaml",
            "--vcluster",
            "v",
            "--kubeconfig",
            "host.kubeconfig",
            "--name",
            "cert-manager-sync",
        ])
        .expect("parse");
        match cli.command {
            Some(Command::Import(args)) => {
                assert_eq!(args.kubeconfig, Some(PathBuf::from("host.kubeconfig")));
                assert_eq!(args.name, "cert-manager-sync");
            }
            other => panic!("expected import, got {other:?}"),
        }
        assert!(
            Cli::try_parse_from(["vcluster-plugin-operator", "import", "-f", "x"]).is_err(),
            "--vcluster is required"
        );
    }
}
