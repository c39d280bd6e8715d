//! `vcluster-plugin-syncer`: the declarative runtime of vcluster-plugin-operator as a process.
//!
//! Reads its `VClusterPlugin` from the host and syncs what it declares (see
//! [`vcp_syncer_runtime::run`]). Logs JSON lines to stderr (`RUST_LOG` filters, default
//! `info`). Exits 0 on SIGTERM / ctrl-c, 1 with the error otherwise.
//!
//! Three ways to run it:
//! - as a sidecar beside vCluster's syncer (flags below; the virtual cluster through the
//!   kubeconfig vCluster keeps in its Secret), applying `Pod` hooks to host pods afterwards;
//! - as a v2 plugin: copied to `/plugins/<name>/plugin` by `vcluster-plugin-syncer
//!   install-plugin /plugins/<name>` (the operator's init container) and started by vCluster's
//!   syncer with the magic cookie `VCLUSTER_PLUGIN=vcluster` and no arguments. It then speaks
//!   the v2 protocol ([`vcp_syncer_runtime::v2`]): the clients, namespace and vCluster name come
//!   from `Initialize`, the plugin's name is its folder's (which the operator wrote:
//!   `install-plugin /plugins/<name>`; a `$VCLUSTER_PLUGIN_NAME` that names another plugin is
//!   refused, and without a folder it names the plugin),
//!   the `Pod` hooks are applied by vCluster through `Mutate` before each host write, the
//!   syncers start at `SetLeader`, and the process exits 0 when vCluster stops it;
//! - `install-plugin DIR`: copies this binary to `DIR/plugin` (mode 0755) and exits.
//!
//! The plugin it runs: the operator writes the plugin's name into the container once, as
//! `$VCLUSTER_PLUGIN_NAME` of the sidecar (or the folder of a v2 plugin), and the runtime
//! refuses at start, with [`Error::PluginNameMismatch`], a `--plugin` naming another one
//! ([`plugin_name`]): a plugin's `args` (refused for the embedded runtime by the CRD anyway)
//! cannot point its runtime at another tenant's plugin. Run by hand, `--plugin` alone names it.
//!
//! The test-only fault point (`vcp_crds::fault`, `VCP_FAULT_*`) is compiled in only with the
//! `test-faults` feature, which only the test crate enables.
//!
//! Allocator: mimalloc. The runtime allocates and frees many small objects (watch events,
//! JSON values) across the tokio worker threads; glibc's per-thread arenas fragment under that
//! pattern and keep freed memory resident, which made the peak RSS of the sync benchmark
//! (`docs/BENCHMARKS.md`, "Sync runtime") grow well past what the caches hold. mimalloc too
//! keeps a burst's freed pages while the process is idle, so both modes run
//! [`vcp_syncer_runtime::heap::after_bursts`] beside the runtime, and it asks for transparent
//! huge pages, which the binary turns off first
//! ([`vcp_syncer_runtime::heap::disable_huge_pages`]). With the test feature
//! `reconcile-log`, mimalloc is wrapped in `vcp_crds::heap::Counting` (the live heap bytes of
//! `/state`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;
use vcp_syncer_runtime::acceptance::{HookGate, InForce};
use vcp_syncer_runtime::hooks::declarative_hooks;
use vcp_syncer_runtime::runtime::{DEFAULT_RESYNC_PERIOD, DEFAULT_WORKERS};
use vcp_syncer_runtime::v2::{self, HookTable, Session};
use vcp_syncer_runtime::{Config, Error, PodSync, run};

#[cfg(not(feature = "reconcile-log"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Test machinery (feature `reconcile-log` only): mimalloc, its live bytes counted for
/// `/state`.
#[cfg(feature = "reconcile-log")]
#[global_allocator]
static GLOBAL: vcp_crds::heap::Counting<mimalloc::MiMalloc> =
    vcp_crds::heap::Counting(mimalloc::MiMalloc);

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
    /// Name of the VClusterPlugin to run; must equal `$VCLUSTER_PLUGIN_NAME` when that is set
    /// (the name the operator wrote into the container), which names it on its own.
    #[arg(long)]
    plugin: Option<String>,
    /// vCluster name used in host names and labels; default: the plugin's spec.vcluster.name.
    #[arg(long, env = "VCLUSTER_NAME")]
    vcluster: Option<String>,
    /// `hooks`: apply Pod hooks to the host pods the vCluster made; `full`: sync pods
    /// virtual → host and their status host → virtual (standalone, no vCluster syncer).
    #[arg(long, value_enum, default_value_t = PodSyncArg::Hooks)]
    pod_sync: PodSyncArg,
    /// Concurrent workers per synced type.
    #[arg(long, env = "VCLUSTER_PLUGIN_WORKERS", default_value_t = DEFAULT_WORKERS)]
    workers: usize,
    /// Seconds between full resyncs of every synced object.
    #[arg(long, default_value_t = DEFAULT_RESYNC_PERIOD.as_secs())]
    resync_seconds: u64,
    /// Longest delay, in seconds, between two attempts of a failing watch or of a synced type
    /// that is not served (the delay starts at 0.5 s and doubles).
    #[arg(long, env = "VCLUSTER_PLUGIN_RETRY_MAX_SECONDS", default_value_t = vcp_syncer_runtime::retry::DEFAULT_RETRY_MAX.as_secs())]
    retry_max_seconds: u64,
    /// Where to serve `/metrics` (Prometheus text) and `/healthz`, such as `0.0.0.0:9460`;
    /// unset (the default): no listener. The operator sets it in each sidecar it adds, one
    /// port per sidecar of the pod.
    #[arg(long, env = METRICS_BIND_ADDRESS_ENV)]
    metrics_bind_address: Option<std::net::SocketAddr>,
}

/// The environment variable of `--metrics-bind-address`, also read by a v2 plugin (which gets
/// no arguments).
const METRICS_BIND_ADDRESS_ENV: &str = "VCLUSTER_PLUGIN_METRICS_BIND_ADDRESS";

/// `vcluster-plugin-syncer install-plugin DIR`.
#[derive(Parser, Debug)]
#[command(
    name = "vcluster-plugin-syncer install-plugin",
    about = "Copy this binary to DIR/plugin, where vCluster's syncer finds v2 plugins (the init container of an embedded v2 plugin: DIR is /plugins/<name>)"
)]
struct InstallArgs {
    /// The plugin's folder, such as `/plugins/my-plugin`; created when missing.
    dir: PathBuf,
}

/// Copies the running binary to `dir/plugin` (through a temporary file, then renamed, so
/// vCluster never sees half a binary), mode 0755.
fn install_plugin(dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exe = std::env::current_exe()?;
    std::fs::create_dir_all(dir)?;
    let target = dir.join("plugin");
    let partial = dir.join(".plugin.partial");
    std::fs::copy(&exe, &partial)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, &target)?;
    Ok(target)
}

/// `--pod-sync` values.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum PodSyncArg {
    /// Apply the plugin's physical Pod hooks to host pods.
    Hooks,
    /// Sync pods virtual → host, status host → virtual.
    Full,
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

/// The environment variable in which the operator writes the plugin's name into the runtime's
/// container (operator/src/workload/containers.rs); vCluster's chart gives v1 sidecars the same.
const PLUGIN_NAME_ENV: &str = "VCLUSTER_PLUGIN_NAME";

/// `$VCLUSTER_PLUGIN_NAME`, when set and not empty.
fn plugin_name_env() -> Option<String> {
    std::env::var(PLUGIN_NAME_ENV)
        .ok()
        .filter(|n| !n.is_empty())
}

/// The plugin the sidecar runs: `written` (`$VCLUSTER_PLUGIN_NAME`, the operator's) when set,
/// else `flag` (`--plugin`, a run by hand).
///
/// # Errors
/// [`Error::PluginNameMismatch`] when both are set and differ; [`Error::NoPluginName`] when
/// neither is.
fn plugin_name(flag: Option<String>, written: Option<String>) -> Result<String, Error> {
    one_name(
        (flag, "--plugin"),
        (written, "$VCLUSTER_PLUGIN_NAME"),
        "neither --plugin nor $VCLUSTER_PLUGIN_NAME is set",
    )
}

/// The v2 plugin's name: its folder (`folder`, from vCluster's `Initialize`, written by the
/// operator's `install-plugin /plugins/<name>`) when known, else `env`
/// (`$VCLUSTER_PLUGIN_NAME`).
///
/// # Errors
/// [`Error::PluginNameMismatch`] when both are known and differ; [`Error::NoPluginName`] when
/// neither is.
fn v2_plugin_name(folder: Option<String>, env: Option<String>) -> Result<String, Error> {
    one_name(
        (env, "$VCLUSTER_PLUGIN_NAME"),
        (folder, "the plugin's folder under /plugins"),
        "vCluster sent no working directory and VCLUSTER_PLUGIN_NAME is not set",
    )
}

/// The plugin's name from two sources, each with what it is called in an error: `written`
/// wins when set, `asked` is taken otherwise.
///
/// # Errors
/// [`Error::PluginNameMismatch`] when both are set and differ; [`Error::NoPluginName`] with
/// `neither` when neither is.
fn one_name(
    (asked, asked_by): (Option<String>, &'static str),
    (written, written_by): (Option<String>, &'static str),
    neither: &str,
) -> Result<String, Error> {
    match (asked, written) {
        (Some(asked), Some(written)) if asked != written => Err(Error::PluginNameMismatch {
            asked,
            asked_by,
            written,
            written_by,
        }),
        (_, Some(name)) | (Some(name), None) => Ok(name),
        (None, None) => Err(Error::NoPluginName {
            what: neither.into(),
        }),
    }
}

/// The host and virtual clients of the sidecar: with the `test-faults` feature, the test-only
/// fault point (`vcp_crds::fault`, inert unless its variables are set) on both, one count of
/// writes for the process.
#[cfg(feature = "test-faults")]
async fn sidecar_clients(args: &Args) -> Result<((kube::Client, String), kube::Client), Error> {
    use vcp_syncer_runtime::sdk::client_with_fault;
    let fault =
        vcp_crds::fault::AbortAfterWrites::from_env().map_err(|message| Error::Kubeconfig {
            cluster: "host",
            path: vcp_crds::fault::ABORT_AFTER_WRITES_ENV.into(),
            message,
        })?;
    let host = client_with_fault("host", args.host_kubeconfig.clone(), &fault).await?;
    let (virtual_, _) =
        client_with_fault("virtual", Some(args.virtual_kubeconfig.clone()), &fault).await?;
    Ok((host, virtual_))
}

/// The host and virtual clients of the sidecar.
#[cfg(not(feature = "test-faults"))]
async fn sidecar_clients(args: &Args) -> Result<((kube::Client, String), kube::Client), Error> {
    use vcp_syncer_runtime::sdk::client_from;
    let host = client_from("host", args.host_kubeconfig.clone()).await?;
    let (virtual_, _) = client_from("virtual", Some(args.virtual_kubeconfig.clone())).await?;
    Ok((host, virtual_))
}

async fn main_inner(args: Args) -> Result<(), Error> {
    // Before any client: a container made for another plugin stops here.
    let plugin = plugin_name(args.plugin.clone(), plugin_name_env())?;
    // The kubeconfig's volume is optional (the operator adds it before vCluster's first start
    // may have written the Secret): wait for the file, or for a signal.
    tokio::select! {
        _ = vcp_syncer_runtime::sdk::wait_for_kubeconfig(
            &args.virtual_kubeconfig,
            std::time::Duration::from_secs(1),
        ) => {}
        () = shutdown_signal() => {
            info!("signal received before the virtual cluster's kubeconfig, exiting");
            return Ok(());
        }
    }
    let ((host, host_namespace), virtual_) = sidecar_clients(&args).await?;
    let mut config = Config::new(
        host,
        virtual_,
        args.namespace.unwrap_or(host_namespace),
        plugin,
    );
    config.vcluster = args.vcluster;
    config.workers = args.workers.max(1);
    config.resync_period = std::time::Duration::from_secs(args.resync_seconds.max(1));
    config.retry_max = std::time::Duration::from_secs(args.retry_max_seconds.max(1));
    config.metrics_bind_address = args.metrics_bind_address;
    config.pod_sync = match args.pod_sync {
        PodSyncArg::Hooks => PodSync::Hooks,
        PodSyncArg::Full => PodSync::Full,
    };
    info!(namespace = %config.namespace, plugin = %config.plugin, "vcluster-plugin-syncer starting");
    let _collector = collector(&config);
    tokio::select! {
        result = run(config) => result,
        () = shutdown_signal() => {
            info!("signal received, exiting");
            Ok(())
        }
    }
}

/// What the v2 runtime needs before it can tell vCluster it is ready: clients, its plugin's
/// name and its hook table: the hooks of the plugin's spec, declared to vCluster in
/// `GetPluginConfig`, applied by `Mutate` only once the operator accepted them
/// ([`vcp_syncer_runtime::acceptance`]).
async fn prepare_v2(session: &Session) -> Result<(Config, HookTable), Error> {
    let init = session.init_config();
    let (host, virtual_) = v2::clients(init).await?;
    let plugin = v2_plugin_name(init.plugin_name(), plugin_name_env())?;
    // tolerant: a status these types cannot read must not keep the vCluster's syncer from
    // starting (its plugins are started before it serves)
    let object =
        vcp_syncer_runtime::runtime::read_plugin(&host, &init.host_namespace, &plugin).await?;
    let mut config = Config::new(host, virtual_, init.host_namespace.clone(), plugin);
    config.vcluster = Some(init.vcluster.clone());
    config.pod_sync = PodSync::Mutate;
    if let Some(workers) = std::env::var("VCLUSTER_PLUGIN_WORKERS")
        .ok()
        .and_then(|w| w.parse::<usize>().ok())
    {
        config.workers = workers.max(1);
    }
    if let Some(value) = std::env::var(METRICS_BIND_ADDRESS_ENV)
        .ok()
        .filter(|v| !v.is_empty())
    {
        config.metrics_bind_address =
            Some(value.parse().map_err(|e| Error::InvalidMetricsAddress {
                value,
                message: format!("{e}"),
            })?);
    }
    let declared = declarative_hooks(&object.spec.hooks);
    let table = match HookGate::default().observe(&object) {
        InForce::Hooks(hooks) => {
            let table = HookTable::new(declared);
            table.set(declarative_hooks(&hooks));
            table
        }
        InForce::Pending(message) => HookTable::held(declared, message),
    };
    Ok((config, table))
}

/// The runtime as a v2 plugin started by vCluster's syncer.
async fn main_v2() -> Result<(), Error> {
    let session = Session::serve().await?;
    let (mut config, table) = match prepare_v2(&session).await {
        Ok(prepared) => prepared,
        Err(error) => {
            session.fail(&error.to_string());
            session.shutdown().await;
            return Err(error);
        }
    };
    let table = Arc::new(table);
    config.hook_table = Some(table.clone());
    session.ready(table);
    info!(namespace = %config.namespace, plugin = %config.plugin, "v2 plugin ready; waiting for SetLeader");
    if !session.leader().await {
        session.shutdown().await;
        return Ok(());
    }
    let _collector = collector(&config);
    let result = tokio::select! {
        result = run(config) => result,
        reason = session.stopped() => {
            info!(?reason, "vCluster stopped the plugin, exiting");
            Ok(())
        }
    };
    session.shutdown().await;
    result
}

/// [`vcp_syncer_runtime::heap::after_bursts`] on `config`'s metrics, on the async workers
/// (where the syncers allocate), until the returned guard is dropped.
fn collector(config: &Config) -> tokio_util::task::AbortOnDropHandle<()> {
    use vcp_syncer_runtime::heap;
    tokio_util::task::AbortOnDropHandle::new(tokio::spawn(heap::after_bursts(
        config.metrics.clone(),
        heap::IDLE,
        heap::BUSY_INTERVALS,
        heap::SETTLE_INTERVALS,
    )))
}

/// How long the exit waits, after the runtime stopped, for work still running on its threads:
/// an expression inside one native call runs to that call's end on the blocking pool
/// (`patches::Patches::to_host_in_pool`), which must not hold up a stop that SIGTERM asked for.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The runtime's async worker threads when `TOKIO_WORKER_THREADS` (tokio's own variable) is
/// unset: one. The runtime's work is a chain of hand-offs between tasks (kube's request buffer,
/// hyper's connection task, the watch streams, the type's queue), and with two workers each
/// hand-off can wake the other thread through a futex; a profile of the sync bench put 30 % of
/// the runtime's CPU in the kernel, half of it task switches (`docs/BENCHMARKS.md`, "one worker
/// thread"). Expressions never run on it: each object's run on tokio's blocking
/// pool (`patches::Patches::to_host_in_pool`, at most `patches::EVALUATION_SLOTS` at once), so
/// a long native call holds up neither the other tasks nor its own type's watches and workers. When the variable is set, tokio reads it itself: a count ≥ 1 sets the workers,
/// and tokio refuses anything else with a panic at start that names the variable.
const WORKER_THREADS: usize = 1;

/// Transparent huge pages off before the program's first allocation
/// ([`vcp_syncer_runtime::heap::disable_huge_pages`]): Rust's start-up code allocates before
/// `main` runs, and mimalloc's first arena then already held two 2 MiB pages for about
/// 100 KiB in use. An ELF initializer (`.init_array`, default priority) runs after mimalloc's
/// own (priority 101), which makes no allocation, and before Rust's `main` wrapper.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array")]
static HUGE_PAGES_OFF: extern "C" fn() = {
    extern "C" fn huge_pages_off() {
        vcp_syncer_runtime::heap::disable_huge_pages();
    }
    huge_pages_off
};

fn main() -> ExitCode {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(WORKER_THREADS);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("vcluster-plugin-syncer: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(main_async());
    runtime.shutdown_timeout(EXIT_GRACE);
    code
}

async fn main_async() -> ExitCode {
    // each line carries its spans' fields: the current span's (`span`) and every enclosing
    // one's (`spans`: the type task's plugin, vCluster and kind, the reconcile's object, the
    // write's verb and cluster)
    tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_span_list(true)
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "install-plugin")
    {
        let args = InstallArgs::parse_from(std::env::args_os().skip(1));
        return match install_plugin(&args.dir) {
            Ok(target) => {
                info!(target = %target.display(), "plugin installed");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!(
                    "vcluster-plugin-syncer: cannot install into {}: {error}",
                    args.dir.display()
                );
                ExitCode::FAILURE
            }
        };
    }
    let result = if v2::started_by_vcluster() {
        main_v2().await
    } else {
        main_inner(Args::parse()).await
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            error!(%error, "vcluster-plugin-syncer failed");
            eprintln!("vcluster-plugin-syncer: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn the_sidecar_runs_only_the_plugin_the_operator_wrote() {
        assert_eq!(plugin_name(None, some("mine")).unwrap(), "mine");
        assert_eq!(plugin_name(some("mine"), some("mine")).unwrap(), "mine");
        assert_eq!(plugin_name(some("by-hand"), None).unwrap(), "by-hand");
        let refused = plugin_name(some("victim"), some("mine")).unwrap_err();
        assert!(
            matches!(&refused, Error::PluginNameMismatch { asked, written, .. } if asked == "victim" && written == "mine"),
            "{refused:?}"
        );
        assert_eq!(
            refused.to_string(),
            "refusing to run VClusterPlugin \"victim\" (--plugin): this container was made for \"mine\" ($VCLUSTER_PLUGIN_NAME), and the runtime runs only the plugin named there"
        );
        assert!(matches!(
            plugin_name(None, None),
            Err(Error::NoPluginName { .. })
        ));
    }

    #[test]
    fn a_v2_plugin_runs_only_the_plugin_of_its_folder() {
        assert_eq!(v2_plugin_name(some("mine"), None).unwrap(), "mine");
        assert_eq!(v2_plugin_name(None, some("mine")).unwrap(), "mine");
        assert_eq!(v2_plugin_name(some("mine"), some("mine")).unwrap(), "mine");
        assert!(matches!(
            v2_plugin_name(some("mine"), some("victim")),
            Err(Error::PluginNameMismatch { ref asked, ref written, .. }) if asked == "victim" && written == "mine"
        ));
        assert!(matches!(
            v2_plugin_name(None, None),
            Err(Error::NoPluginName { .. })
        ));
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory as _;
        Args::command().debug_assert();
    }

    #[test]
    fn metrics_are_served_only_where_asked() {
        let base = ["vcluster-plugin-syncer", "--virtual-kubeconfig", "/k"];
        let plain = Args::try_parse_from(base).unwrap();
        assert_eq!(plain.metrics_bind_address, None, "no listener by default");
        let asked = Args::try_parse_from(
            base.into_iter()
                .chain(["--metrics-bind-address", "0.0.0.0:9460"]),
        )
        .unwrap();
        assert_eq!(
            asked.metrics_bind_address,
            Some("0.0.0.0:9460".parse().unwrap())
        );
        assert!(
            Args::try_parse_from(base.into_iter().chain(["--metrics-bind-address", "9460"]))
                .is_err()
        );
    }
}
