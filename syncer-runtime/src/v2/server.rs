//! The plugin process's side of the v2 protocol: a gRPC server on a Unix socket with
//! vCluster's `pluginv2.Plugin`, the gRPC health service (`plugin` is `SERVING`: go-plugin's
//! client checks it) and go-plugin's `GRPCController` (Shutdown) and `GRPCStdio` services,
//! announced to the host by the handshake line on stdout.
//!
//! A [`Session`] follows the order in which vCluster's `Manager.Start` calls a plugin:
//!
//! 1. [`Session::serve`] listens, prints the handshake and waits for `Initialize`, whose
//!    config it returns decoded ([`Session::init_config`]); `Initialize` itself stays
//!    unanswered until the plugin is ready, as with vCluster's Go SDK, so that vCluster asks
//!    for the plugin config only once the hooks are registered;
//! 2. [`Session::ready`] with the hooks: `Initialize` returns, `GetPluginConfig` declares the
//!    hooks, `Mutate` applies them ([`super::mutate`]); or [`Session::fail`], and
//!    `Initialize` returns that error to vCluster;
//! 3. [`Session::leader`] resolves when `SetLeader` arrives (the vCluster syncer became leader:
//!    controllers may start);
//! 4. [`Session::stopped`] resolves when the host calls `GRPCController.Shutdown` (go-plugin's
//!    `Client.Kill`) or when the parent process is gone (the plugin is re-parented);
//!    [`Session::shutdown`] then stops the server and removes the socket.
//!
//! Like go-plugin's own server, the process ignores SIGINT once serving (a Ctrl-C in a
//! terminal reaches the whole process group; the host stops its plugins itself), and after the
//! handshake its stdout and stderr (file descriptors 1 and 2, whatever writes to them) go into
//! pipes of its own whose data `StreamStdio` sends to the host: vCluster copies it to the
//! syncer's own stdout / stderr (go-plugin drops a plugin's raw stderr lines below its log
//! level, which the logs of a Rust plugin would be). Writing to them never fails, also after
//! the host is gone (a write to its closed pipe would fail, and Rust's `eprintln!` panics on
//! that); data the host does not read is dropped, never blocking the writer.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::Stream;
use futures::StreamExt;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use super::config::{InitConfig, PluginConfig};
use super::contract::{GRPC_HEALTH_SERVICE, PLUGIN_CONFIG_ENV, ProtocolError};
use super::handshake::{HandshakeEnv, handshake_line};
use super::mutate::{MutateError, mutate};
use super::proto::goplugin::grpc_controller_server::{GRPCController, GRPCControllerServer};
use super::proto::goplugin::grpc_stdio_server::{GRPCStdio, GRPCStdioServer};
use super::proto::pluginv2::plugin_server::{Plugin, PluginServer};
use super::proto::{
    Empty, GetPluginConfigRequest, GetPluginConfigResponse, InitializeRequest, InitializeResponse,
    MutateRequest, MutateResponse, SetLeaderRequest, SetLeaderResponse, StdioChannel, StdioData,
};
use crate::hooks::ClientHook;

/// How often the parent process is checked (go-plugin has no parent-death signal: a
/// re-parented plugin stops by itself).
const PARENT_CHECK: Duration = Duration::from_millis(500);

/// How long [`Session::shutdown`] waits for the gRPC server to finish answering.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The hooks a v2 plugin declares to vCluster (`GetPluginConfig`, once, at start) and the hooks
/// it answers `Mutate` with. The declarative runtime replaces the latter when its
/// `VClusterPlugin` changes ([`HookTable::set`]), and holds them back while the operator has not
/// accepted the spec's hooks ([`HookTable::hold`], [`crate::acceptance`]).
pub struct HookTable {
    declared: Arc<[Arc<dyn ClientHook>]>,
    in_force: RwLock<InForce>,
}

/// The hooks `Mutate` applies, or why it applies none yet (the message it answers with).
type InForce = Result<Arc<[Arc<dyn ClientHook>]>, String>;

impl Default for HookTable {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl HookTable {
    /// A table declaring and applying `hooks`.
    pub fn new(hooks: impl Into<Arc<[Arc<dyn ClientHook>]>>) -> Self {
        let hooks = hooks.into();
        Self {
            declared: hooks.clone(),
            in_force: RwLock::new(Ok(hooks)),
        }
    }

    /// A table declaring `declared` whose `Mutate` answers `message` (gRPC `UNAVAILABLE`, so
    /// vCluster retries the object) until [`HookTable::set`].
    pub fn held(declared: impl Into<Arc<[Arc<dyn ClientHook>]>>, message: String) -> Self {
        Self {
            declared: declared.into(),
            in_force: RwLock::new(Err(message)),
        }
    }

    /// The hooks declared to vCluster: the types and points it calls `Mutate` for. vCluster
    /// asks for the plugin config once, at start.
    pub fn declared(&self) -> Arc<[Arc<dyn ClientHook>]> {
        self.declared.clone()
    }

    /// The hooks `Mutate` applies, or why none may be applied yet.
    pub fn get(&self) -> Result<Arc<[Arc<dyn ClientHook>]>, String> {
        self.in_force
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the hooks `Mutate` applies. vCluster calls `Mutate` only for the types and
    /// points declared at start.
    pub fn set(&self, hooks: impl Into<Arc<[Arc<dyn ClientHook>]>>) {
        *self
            .in_force
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Ok(hooks.into());
    }

    /// Holds the hooks back: `Mutate` answers `message` until [`HookTable::set`].
    pub fn hold(&self, message: String) {
        *self
            .in_force
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Err(message);
    }
}

/// Why a [`Session`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The host called `GRPCController.Shutdown` (go-plugin's `Client.Kill`).
    Shutdown,
    /// The parent process exited (the plugin was re-parented).
    ParentExited,
}

#[derive(Clone)]
enum Readiness {
    Pending,
    Ready(Arc<HookTable>),
    Failed(String),
}

/// How many chunks of stdout/stderr wait for `StreamStdio` before new ones are dropped.
const STDIO_QUEUE: usize = 1024;

struct Shared {
    /// The process's stdout/stderr chunks, taken by the first `StreamStdio` call.
    stdio: Mutex<Option<mpsc::Receiver<StdioData>>>,
    /// The first `Initialize` request's config goes here.
    initialize: Mutex<Option<oneshot::Sender<String>>>,
    ready: watch::Sender<Readiness>,
    leader: watch::Sender<bool>,
    stop: watch::Sender<Option<StopReason>>,
}

impl Shared {
    fn stop(&self, reason: StopReason) {
        self.stop.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        });
    }

    /// Waits until the plugin is ready (its hooks), failed, or stopping.
    async fn hooks(&self) -> Result<Arc<HookTable>, Status> {
        let mut ready = self.ready.subscribe();
        let mut stop = self.stop.subscribe();
        tokio::select! {
            biased;
            state = ready.wait_for(|r| !matches!(r, Readiness::Pending)) => match state.map(|s| s.clone()) {
                Ok(Readiness::Ready(table)) => Ok(table),
                Ok(Readiness::Failed(message)) => Err(Status::failed_precondition(message)),
                Ok(Readiness::Pending) | Err(_) => Err(Status::unavailable("the plugin is stopping")),
            },
            _ = stop.wait_for(Option::is_some) => Err(Status::unavailable("the plugin is stopping")),
        }
    }
}

struct PluginService(Arc<Shared>);

#[tonic::async_trait]
impl Plugin for PluginService {
    async fn initialize(
        &self,
        request: Request<InitializeRequest>,
    ) -> Result<Response<InitializeResponse>, Status> {
        let sender = self
            .0
            .initialize
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(sender) = sender else {
            return Err(Status::failed_precondition(
                "the plugin is already initialized",
            ));
        };
        debug!("Initialize received");
        let _ = sender.send(request.into_inner().config);
        self.0.hooks().await?;
        Ok(Response::new(InitializeResponse {}))
    }

    async fn set_leader(
        &self,
        _: Request<SetLeaderRequest>,
    ) -> Result<Response<SetLeaderResponse>, Status> {
        info!("SetLeader received: the vCluster syncer is leader");
        self.0.leader.send_replace(true);
        Ok(Response::new(SetLeaderResponse {}))
    }

    async fn get_plugin_config(
        &self,
        _: Request<GetPluginConfigRequest>,
    ) -> Result<Response<GetPluginConfigResponse>, Status> {
        let table = self.0.hooks().await?;
        let config = PluginConfig::declare(&table.declared());
        let config = serde_json::to_string(&config)
            .map_err(|e| Status::internal(format!("encode plugin config: {e}")))?;
        info!(%config, "GetPluginConfig answered");
        Ok(Response::new(GetPluginConfigResponse { config }))
    }

    async fn mutate(
        &self,
        request: Request<MutateRequest>,
    ) -> Result<Response<MutateResponse>, Status> {
        let table = self.0.hooks().await?;
        let request = request.into_inner();
        let hooks = table.get().map_err(|message| {
            warn!(api_version = %request.api_version, kind = %request.kind, r#type = %request.r#type, %message, "Mutate refused: no accepted hooks");
            Status::unavailable(message)
        })?;
        match mutate(&hooks, &request) {
            Ok(response) => {
                debug!(api_version = %request.api_version, kind = %request.kind, r#type = %request.r#type, mutated = response.mutated, "Mutate answered");
                Ok(Response::new(response))
            }
            Err(error) => {
                warn!(%error, "Mutate failed");
                Err(match error {
                    MutateError::InvalidObject { .. } => {
                        Status::invalid_argument(error.to_string())
                    }
                    MutateError::Hook { .. } => Status::unknown(error.to_string()),
                })
            }
        }
    }
}

struct ControllerService(Arc<Shared>);

#[tonic::async_trait]
impl GRPCController for ControllerService {
    async fn shutdown(&self, _: Request<Empty>) -> Result<Response<Empty>, Status> {
        info!("GRPCController.Shutdown received: stopping");
        self.0.stop(StopReason::Shutdown);
        Ok(Response::new(Empty {}))
    }
}

struct StdioService(Arc<Shared>);

type StdioStream = Pin<Box<dyn Stream<Item = Result<StdioData, Status>> + Send>>;

#[tonic::async_trait]
impl GRPCStdio for StdioService {
    type StreamStdioStream = StdioStream;

    async fn stream_stdio(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::StreamStdioStream>, Status> {
        let mut stop = self.0.stop.subscribe();
        let stopped = Box::pin(async move {
            let _ = stop.wait_for(Option::is_some).await;
        });
        let data = self
            .0
            .stdio
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let data: StdioStream = match data {
            Some(receiver) => Box::pin(ReceiverStream::new(receiver).map(Ok)),
            None => Box::pin(futures::stream::empty()),
        };
        // go-plugin's client calls this once; the data ends when the plugin stops.
        Ok(Response::new(Box::pin(data.take_until(stopped))))
    }
}

/// The running gRPC server and its socket.
struct Serving {
    shared: Arc<Shared>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    socket: PathBuf,
}

impl Serving {
    async fn shutdown(&mut self) {
        self.shared.stop(StopReason::Shutdown);
        if let Some(server) = self.server.take() {
            match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(error))) => warn!(%error, "the gRPC server failed"),
                Ok(Err(error)) => warn!(%error, "the gRPC server task failed"),
                Err(_) => warn!("the gRPC server did not stop in time"),
            }
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    fn fail(&self, message: &str) {
        self.shared
            .ready
            .send_replace(Readiness::Failed(message.to_string()));
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.shared.stop(StopReason::Shutdown);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A v2 plugin being served to the vCluster that started this process (see the module
/// documentation for the order of calls). Dropping it stops the server.
pub struct Session {
    init: InitConfig,
    serving: Serving,
}

/// Pipes for this process's stdout and stderr, read by threads that queue their data for
/// `StreamStdio`; [`Captured::redirect`] points file descriptors 1 and 2 at them.
struct Captured {
    writers: Vec<(std::os::fd::RawFd, std::io::PipeWriter)>,
}

impl Captured {
    fn new(queue: mpsc::Sender<StdioData>) -> std::io::Result<Self> {
        let mut writers = Vec::new();
        for (fd, channel, name) in [
            (1, StdioChannel::Stdout, "v2-stdout"),
            (2, StdioChannel::Stderr, "v2-stderr"),
        ] {
            let (mut reader, writer) = std::io::pipe()?;
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    use std::io::Read;
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n @ 1..) = reader.read(&mut buf) {
                        let _ = queue.try_send(StdioData {
                            channel: channel as i32,
                            data: buf[..n].to_vec(),
                        });
                    }
                })?;
            writers.push((fd, writer));
        }
        Ok(Self { writers })
    }

    /// Points stdout and stderr at the pipes.
    fn redirect(self) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let _ = std::io::stdout().flush();
        for (fd, writer) in self.writers {
            // SAFETY: `dup2` only replaces descriptor `fd` (1 or 2, open for the whole life of
            // the process) with a duplicate of the pipe's write end, which is open here; no
            // Rust object owns descriptors 1 and 2 (std's Stdout / Stderr use them by number).
            if unsafe { libc::dup2(writer.as_raw_fd(), fd) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Binds a fresh socket `plugin<pid>-<n>` in `dir`.
fn bind_socket(dir: &Path) -> Result<(UnixListener, PathBuf), ProtocolError> {
    let mut last = None;
    for n in 0..100u32 {
        let path = dir.join(format!("plugin{}-{n}", std::process::id()));
        match UnixListener::bind(&path) {
            Ok(listener) => return Ok((listener, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => {
                return Err(ProtocolError::Listen {
                    path: path.display().to_string(),
                    source: e,
                });
            }
        }
    }
    Err(ProtocolError::Listen {
        path: dir.display().to_string(),
        source: last.unwrap_or_else(|| std::io::Error::other("no free socket name")),
    })
}

impl Session {
    /// Starts serving: checks the handshake environment, listens on a Unix socket, prints the
    /// handshake line on stdout, then waits for vCluster's `Initialize` and returns its
    /// config, decoded (`PLUGIN_CONFIG` included). When the config has a working directory
    /// (`/plugins/<name>`), the process changes into it, as vCluster's Go SDK does.
    ///
    /// # Errors
    /// [`ProtocolError`]: not started by vCluster, a request this server cannot serve (mTLS),
    /// the socket cannot be bound, stdout cannot be written, the host stopped the plugin
    /// before `Initialize`, or the init config is invalid (then also returned to vCluster as
    /// the `Initialize` error).
    pub async fn serve() -> Result<Self, ProtocolError> {
        let plugin_config = std::env::var(PLUGIN_CONFIG_ENV).ok();
        Self::serve_inner(HandshakeEnv::from_env(), plugin_config, true, |line| {
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "{line}").and_then(|()| stdout.flush())
        })
        .await
    }

    /// [`Session::serve`] with the handshake environment `env`, the `PLUGIN_CONFIG` value
    /// `plugin_config`, and `announce` writing the handshake line (stdout for a real plugin).
    ///
    /// # Errors
    /// As [`Session::serve`].
    pub async fn serve_with(
        env: HandshakeEnv,
        plugin_config: Option<String>,
        announce: impl FnOnce(&str) -> std::io::Result<()>,
    ) -> Result<Self, ProtocolError> {
        Self::serve_inner(env, plugin_config, false, announce).await
    }

    async fn serve_inner(
        env: HandshakeEnv,
        plugin_config: Option<String>,
        capture_stdio: bool,
        announce: impl FnOnce(&str) -> std::io::Result<()>,
    ) -> Result<Self, ProtocolError> {
        let dir = env.check()?;
        if !env.host_speaks_our_version() {
            warn!(versions = ?env.protocol_versions, "the host does not list app protocol version 1; it will refuse the handshake");
        }
        let (listener, socket) = bind_socket(&dir)?;
        let (initialized_tx, initialized_rx) = oneshot::channel();
        let (stdio_tx, stdio_rx) = mpsc::channel(STDIO_QUEUE);
        let captured = if capture_stdio {
            Some(Captured::new(stdio_tx).map_err(|source| ProtocolError::Stdio { source })?)
        } else {
            None
        };
        let shared = Arc::new(Shared {
            stdio: Mutex::new(captured.is_some().then_some(stdio_rx)),
            initialize: Mutex::new(Some(initialized_tx)),
            ready: watch::channel(Readiness::Pending).0,
            leader: watch::channel(false).0,
            stop: watch::channel(None).0,
        });
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status(GRPC_HEALTH_SERVICE, tonic_health::ServingStatus::Serving)
            .await;
        let mut stopping = shared.stop.subscribe();
        let server = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(PluginServer::new(PluginService(shared.clone())))
            .add_service(GRPCControllerServer::new(ControllerService(shared.clone())))
            .add_service(GRPCStdioServer::new(StdioService(shared.clone())))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stopping.wait_for(Option::is_some).await;
            });
        let mut serving = Serving {
            shared: shared.clone(),
            server: Some(tokio::spawn(server)),
            socket,
        };

        let line = handshake_line("unix", &serving.socket.display().to_string());
        announce(&line).map_err(|source| ProtocolError::Stdout { source })?;
        if let Some(captured) = captured {
            captured
                .redirect()
                .map_err(|source| ProtocolError::Stdio { source })?;
        }
        info!(socket = %serving.socket.display(), "v2 plugin serving; waiting for Initialize");
        tokio::spawn(ignore_interrupts());
        tokio::spawn(watch_parent(shared.clone()));

        let mut stop = shared.stop.subscribe();
        let stopped = async move {
            let _ = stop.wait_for(Option::is_some).await;
        };
        let config = tokio::select! {
            config = initialized_rx => config.map_err(|_| ProtocolError::StoppedBeforeInitialize)?,
            () = stopped => {
                serving.shutdown().await;
                return Err(ProtocolError::StoppedBeforeInitialize);
            }
        };
        let init = match InitConfig::parse(&config, plugin_config.as_deref()) {
            Ok(init) => init,
            Err(error) => {
                serving.fail(&error.to_string());
                return Err(error);
            }
        };
        if let Some(dir) = &init.working_dir
            && let Err(source) = std::env::set_current_dir(dir)
        {
            let error = ProtocolError::WorkingDir {
                path: dir.display().to_string(),
                source,
            };
            serving.fail(&error.to_string());
            return Err(error);
        }
        info!(vcluster = %init.vcluster, namespace = %init.host_namespace, "Initialize received");
        Ok(Self { init, serving })
    }

    /// The configuration vCluster sent in `Initialize`.
    pub fn init_config(&self) -> &InitConfig {
        &self.init
    }

    /// The plugin is ready with `hooks`: `Initialize` returns to vCluster, which then asks
    /// for the plugin config (the hooks' declaration) and calls `Mutate` for them.
    pub fn ready(&self, hooks: Arc<HookTable>) {
        self.serving
            .shared
            .ready
            .send_replace(Readiness::Ready(hooks));
    }

    /// The plugin could not start: `Initialize` (and any later call) returns `message` to
    /// vCluster as a gRPC `FAILED_PRECONDITION` error.
    pub fn fail(&self, message: &str) {
        self.serving.fail(message);
    }

    /// Resolves with `true` once `SetLeader` arrived, with `false` when the session stops
    /// first.
    pub async fn leader(&self) -> bool {
        let mut leader = self.serving.shared.leader.subscribe();
        let mut stop = self.serving.shared.stop.subscribe();
        tokio::select! {
            result = leader.wait_for(|l| *l) => result.is_ok(),
            _ = stop.wait_for(Option::is_some) => false,
        }
    }

    /// Whether `SetLeader` arrived.
    pub fn is_leader(&self) -> bool {
        *self.serving.shared.leader.borrow()
    }

    /// Resolves when the host asks the plugin to stop or the parent process is gone.
    pub async fn stopped(&self) -> StopReason {
        let mut stop = self.serving.shared.stop.subscribe();
        match stop.wait_for(Option::is_some).await {
            Ok(reason) => reason.unwrap_or(StopReason::Shutdown),
            Err(_) => StopReason::Shutdown,
        }
    }

    /// Stops the server (answers in flight complete, within 2 seconds) and removes the
    /// socket.
    pub async fn shutdown(mut self) {
        self.serving.shutdown().await;
    }
}

/// go-plugin's server ignores SIGINT (`server.go`: "Eat the interrupts").
async fn ignore_interrupts() {
    loop {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        debug!("SIGINT ignored: the host stops its plugins");
    }
}

/// Stops the session when this process is re-parented (its host exited without stopping it).
async fn watch_parent(shared: Arc<Shared>) {
    let parent = std::os::unix::process::parent_id();
    let mut stop = shared.stop.subscribe();
    loop {
        tokio::select! {
            () = tokio::time::sleep(PARENT_CHECK) => {}
            _ = stop.wait_for(Option::is_some) => return,
        }
        if std::os::unix::process::parent_id() != parent {
            shared.stop(StopReason::ParentExited);
            warn!(parent, "the host process is gone: stopping");
            return;
        }
    }
}

#[cfg(test)]
mod tests;
