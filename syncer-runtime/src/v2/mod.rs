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
pub(crate) mod contract;
pub mod handshake;
pub mod mutate;
pub mod proto;
pub mod server;
#[cfg(test)]
mod test_hooks;

use kube::config::{KubeConfigOptions, Kubeconfig};

pub use config::{InitConfig, PluginConfig};
pub use contract::{
    APP_PROTOCOL_VERSION, CORE_PROTOCOL_VERSION, GRPC_HEALTH_SERVICE, MAGIC_COOKIE_KEY,
    MAGIC_COOKIE_VALUE, PLUGIN_CONFIG_ENV, ProtocolError, started_by_vcluster,
};
pub use server::{HookTable, Session, StopReason};

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
