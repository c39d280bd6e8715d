//! A TCP proxy between a client and an API server that a test can pause (both ways, or only the
//! client's requests) and whose connections it can drop: a network partition between one
//! process and the API server, while both keep running. TLS passes through untouched (the proxy listens on 127.0.0.1,
//! which the API server's certificate names too).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// What the proxy forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    /// Both ways.
    Open,
    /// Only from the upstream to the client ([`TcpProxy::pause_upstream`]).
    Downstream,
    /// Nothing ([`TcpProxy::pause`]).
    Closed,
}

/// A running proxy from [`TcpProxy::addr`] to its upstream; stops (and drops its connections)
/// on drop.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    paused: watch::Sender<Gate>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl TcpProxy {
    /// Listens on a free 127.0.0.1 port and forwards every connection to `upstream`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (paused, _) = watch::channel(Gate::Open);
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (p, c) = (paused.clone(), connections.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut gate = p.subscribe();
                let task = tokio::spawn(async move {
                    // A connection made while paused (either way) waits, like a SYN into a
                    // partition.
                    if gate.wait_for(|g| *g == Gate::Open).await.is_err() {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(
                        pipe(cr, sw, gate.clone(), |g| g == Gate::Open),
                        pipe(sr, cw, gate, |g| g != Gate::Closed)
                    );
                });
                if let Ok(mut all) = c.lock() {
                    all.retain(|h| !h.is_finished());
                    all.push(task.abort_handle());
                }
            }
        })
        .abort_handle();
        Ok(TcpProxy {
            addr,
            paused,
            connections,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding in both directions: bytes already read are held, nothing more is
    /// read, new connections wait. The peers see silence, not an error.
    pub fn pause(&self) {
        self.paused.send_replace(Gate::Closed);
    }

    /// Stops forwarding what the clients send (bytes already read are held, nothing more is
    /// read, new connections wait) while the upstream's answers and watch events still reach
    /// them: a one-way partition, in which a client hears the API server but cannot be heard,
    /// so it may begin requests that stay in flight until [`TcpProxy::resume`] delivers them.
    pub fn pause_upstream(&self) {
        self.paused.send_replace(Gate::Downstream);
    }

    /// Forwards again both ways (held bytes first).
    pub fn resume(&self) {
        self.paused.send_replace(Gate::Open);
    }

    /// Closes every connection made so far; held bytes are discarded, never delivered.
    pub fn drop_connections(&self) {
        if let Ok(mut all) = self.connections.lock() {
            for handle in all.drain(..) {
                handle.abort();
            }
        }
    }

    /// Writes a copy of the kubeconfig at `kubeconfig` whose server is this proxy (same
    /// credentials and CA) to `target`, and returns `target`.
    ///
    /// # Errors
    /// When the kubeconfig cannot be read, parsed or written.
    pub fn kubeconfig(&self, kubeconfig: &Path, target: PathBuf) -> anyhow::Result<PathBuf> {
        let text = std::fs::read_to_string(kubeconfig)?;
        let mut doc: serde_yaml::Value = serde_yaml::from_str(&text)?;
        doc["clusters"][0]["cluster"]["server"] =
            serde_yaml::Value::String(format!("https://{}", self.addr));
        std::fs::write(&target, serde_yaml::to_string(&doc)?)?;
        Ok(target)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.drop_connections();
    }
}

/// Copies `from` to `to`, holding each chunk while `forwards` says the gate is shut for this
/// direction.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut gate: watch::Receiver<Gate>,
    forwards: fn(Gate) -> bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if gate.wait_for(|g| forwards(*g)).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        if gate.wait_for(|g| forwards(*g)).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The `host:port` of the server in the kubeconfig at `path`, resolved.
///
/// # Errors
/// When the kubeconfig cannot be read or names no `https://host:port` server.
pub fn kubeconfig_server(path: &Path) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs as _;
    let text = std::fs::read_to_string(path)?;
    let doc: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let server = doc["clusters"][0]["cluster"]["server"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no server in {}", path.display()))?;
    let authority = server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string();
    authority
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow::anyhow!("cannot resolve {authority}"))
}
