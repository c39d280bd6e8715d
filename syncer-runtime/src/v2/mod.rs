//! vCluster's v2 plugin protocol, plugin side: a Rust plugin that the vCluster syncer itself
//! finds in `/plugins/<name>/plugin`, starts as a child process and calls over gRPC, exactly
//! like a plugin built with vCluster's Go SDK.
//!
//! The contract is vCluster v0.30.0's `pkg/plugin/v2` (the loader, `Manager`) on top of
//! hashicorp go-plugin v1.6.0:
//! - the handshake ([`handshake`]): magic cookie `VCLUSTER_PLUGIN=vcluster`, app protocol
//!   version 1, gRPC only, one line on stdout announcing the socket;
//! - go-plugin's services every plugin serves: gRPC health (`plugin` is `SERVING`),
//!   `GRPCController.Shutdown` (the host stops the plugin) and `GRPCStdio`;
//! - vCluster's `pluginv2.Plugin` service ([`proto`], [`server`]): `Initialize` (the init
//!   config, [`config::InitConfig`]), `GetPluginConfig` (the client hooks,
//!   [`config::PluginConfig`]), `SetLeader` (controllers may start) and `Mutate` (the hooks
//!   applied to an object vCluster is about to write or has read, [`mutate`]).
//!
//! [`crate::sdk::Plugin`] speaks it when vCluster started the process ([`started_by_vcluster`]):
//! `Plugin::init` serves and waits for `Initialize`, `Plugin::start` declares the registered
//! hooks, runs the registered syncers once `SetLeader` arrives and returns when vCluster stops
//! the plugin. The binary `vcluster-plugin-syncer` (the declarative runtime) does the same with
//! the hooks and synced types of its `VClusterPlugin`.

pub mod config;
pub mod handshake;
pub mod mutate;
pub mod proto;
pub mod server;
#[cfg(test)]
mod test_hooks;

use kube::config::{KubeConfigOptions, Kubeconfig};

pub use config::{InitConfig, PluginConfig};
pub use server::{HookTable, Session, StopReason};

/// Environment variable of go-plugin's magic cookie as vCluster configures it
/// (`pkg/plugin/v2/grpc.go`, `HandshakeConfig.MagicCookieKey`).
pub const MAGIC_COOKIE_KEY: &str = "VCLUSTER_PLUGIN";
/// Value of the magic cookie (`HandshakeConfig.MagicCookieValue`).
pub const MAGIC_COOKIE_VALUE: &str = "vcluster";
/// go-plugin's core protocol version (`CoreProtocolVersion`).
pub const CORE_PROTOCOL_VERSION: u32 = 1;
/// vCluster's app protocol version (`HandshakeConfig.ProtocolVersion`).
pub const APP_PROTOCOL_VERSION: u32 = 1;
/// The service name go-plugin's client checks with the gRPC health service
/// (`GRPCServiceName`).
pub const GRPC_HEALTH_SERVICE: &str = "plugin";
/// Environment variable in which vCluster passes a plugin its config (YAML of
/// `plugins.<name>.config` in the vCluster's values; `pkg/plugin/v2/plugin.go`).
pub const PLUGIN_CONFIG_ENV: &str = "PLUGIN_CONFIG";

/// Whether this process was started by vCluster as a v2 plugin: the magic cookie is in the
/// environment (as vCluster's Go SDK decides).
pub fn started_by_vcluster() -> bool {
    std::env::var(MAGIC_COOKIE_KEY).is_ok_and(|v| v == MAGIC_COOKIE_VALUE)
}

/// What went wrong in the v2 protocol.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The magic cookie is missing: the process was not started by vCluster.
    #[error(
        "this process was not started by vCluster as a v2 plugin ({MAGIC_COOKIE_KEY}={MAGIC_COOKIE_VALUE} is not set)"
    )]
    NotStartedByVCluster,
    /// The host asked for something this plugin server does not implement.
    #[error("the plugin host asked for {what}, which this plugin does not support")]
    Unsupported {
        /// What was asked.
        what: String,
    },
    /// The socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// Socket path (or its folder).
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The handshake line could not be written.
    #[error("cannot write the handshake to stdout: {source}")]
    Stdout {
        /// The error.
        source: std::io::Error,
    },
    /// Stdout / stderr could not be redirected into the `GRPCStdio` stream.
    #[error("cannot capture stdout and stderr for the plugin host: {source}")]
    Stdio {
        /// The error.
        source: std::io::Error,
    },
    /// The host stopped the plugin (or went away) before sending `Initialize`.
    #[error("the plugin host stopped the plugin before Initialize")]
    StoppedBeforeInitialize,
    /// A field of the `Initialize` config is missing or invalid.
    #[error("invalid Initialize config, field {field}: {message}")]
    InitConfig {
        /// The JSON field (`syncerConfig`, `workloadConfig`, …).
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// `PLUGIN_CONFIG` is not YAML.
    #[error("{PLUGIN_CONFIG_ENV} is not YAML: {message}")]
    PluginConfig {
        /// The YAML error.
        message: String,
    },
    /// The working directory vCluster named cannot be entered.
    #[error("cannot change into the plugin's working directory {path}: {source}")]
    WorkingDir {
        /// The folder.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A kubeconfig from `Initialize` cannot be turned into a client.
    #[error("cannot use the {cluster} kubeconfig vCluster sent: {message}")]
    Client {
        /// `host` or `virtual`.
        cluster: &'static str,
        /// The error.
        message: String,
    },
}

/// A client of the cluster a kubeconfig from `Initialize` points to (its current context).
///
/// # Errors
/// [`ProtocolError::Client`].
pub async fn client_from(
    cluster: &'static str,
    kubeconfig: &Kubeconfig,
) -> Result<kube::Client, ProtocolError> {
    let failed = |message: String| ProtocolError::Client { cluster, message };
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .map_err(|e| failed(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| failed(e.to_string()))
}

/// The host and virtual clients of `init`.
///
/// # Errors
/// [`ProtocolError::Client`].
pub async fn clients(init: &InitConfig) -> Result<(kube::Client, kube::Client), ProtocolError> {
    Ok((
        client_from("host", &init.host_kubeconfig).await?,
        client_from("virtual", &init.virtual_kubeconfig).await?,
    ))
}
