//! What vCluster's loader and go-plugin fix for every v2 plugin: the magic cookie, the protocol
//! versions, the health service's name, the config's environment variable (vCluster v0.30.0
//! `pkg/plugin/v2`, go-plugin v1.6.0), and [`ProtocolError`], what goes wrong in the protocol.
//! Re-exported from [`crate::v2`].

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
