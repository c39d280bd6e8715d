use super::*;
use crate::hooks::HookPoint;
use crate::v2::proto::goplugin::grpc_controller_client::GRPCControllerClient;
use crate::v2::proto::goplugin::grpc_stdio_client::GRPCStdioClient;
use crate::v2::proto::pluginv2::plugin_client::PluginClient;
use crate::v2::test_hooks::PodHook;
use base64::Engine;
use futures::StreamExt;
use serde_json::{Value, json};
use tonic::transport::Channel;

const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n";

fn init_config() -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({
        "syncerConfig": b64(KUBECONFIG),
        "workloadConfig": b64(KUBECONFIG),
        "config": b64(r#"{"name": "vc", "hostNamespace": "vc-ns"}"#),
        "currentNamespace": "vc-ns",
        "port": 13370,
    })
    .to_string()
}

/// Serves in a fresh socket folder; returns the serve task and the handshake line.
async fn start(
    plugin_config: Option<&str>,
) -> (
    JoinHandle<Result<Session, ProtocolError>>,
    Vec<String>,
    PathBuf,
) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "vcp-v2-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let env = HandshakeEnv {
        magic_cookie: Some("vcluster".into()),
        protocol_versions: Some("1".into()),
        unix_socket_dir: Some(dir.display().to_string()),
        ..HandshakeEnv::default()
    };
    let (line_tx, line_rx) = oneshot::channel();
    let plugin_config = plugin_config.map(str::to_string);
    let serving = tokio::spawn(Session::serve_with(env, plugin_config, move |line| {
        let _ = line_tx.send(line.to_string());
        Ok(())
    }));
    let line = line_rx.await.expect("handshake line");
    (serving, line.split('|').map(str::to_string).collect(), dir)
}

async fn connect(path: &str) -> Channel {
    let path = path.to_string();
    tonic::transport::Endpoint::try_from("http://[::]:1")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connect to the plugin socket")
}

#[tokio::test]
async fn serves_the_calls_in_vclusters_order() {
    let (serving, parts, dir) = start(Some("greeting: hi")).await;
    // go-plugin's client: core 1, app 1 (vCluster's HandshakeConfig), a Unix socket, gRPC.
    assert_eq!(parts.len(), 6, "{parts:?}");
    assert_eq!(
        (&*parts[0], &*parts[1], &*parts[2], &*parts[4]),
        ("1", "1", "unix", "grpc")
    );
    assert!(
        parts[3].starts_with(&dir.display().to_string()),
        "{parts:?}"
    );
    let channel = connect(&parts[3]).await;

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "plugin".into(),
        })
        .await
        .expect("health")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let mut client = PluginClient::new(channel.clone());
    let initialize = tokio::spawn({
        let mut client = client.clone();
        async move {
            client
                .initialize(InitializeRequest {
                    config: init_config(),
                })
                .await
        }
    });
    let session = serving.await.unwrap().expect("session");
    assert_eq!(session.init_config().vcluster, "vc");
    assert_eq!(session.init_config().host_namespace, "vc-ns");
    assert_eq!(
        session.init_config().plugin_config,
        Some(json!({"greeting": "hi"}))
    );
    tokio::task::yield_now().await;
    assert!(
        !initialize.is_finished(),
        "Initialize is answered once the plugin is ready"
    );
    let second = client
        .initialize(InitializeRequest {
            config: init_config(),
        })
        .await
        .unwrap_err();
    assert_eq!(second.code(), tonic::Code::FailedPrecondition);

    let pod_hook = || vec![Arc::new(PodHook(&[HookPoint::CreatePhysical])) as Arc<dyn ClientHook>];
    // declared at once, applied only once the operator accepted them (`acceptance`)
    let table = Arc::new(HookTable::held(pod_hook(), "not accepted yet".into()));
    session.ready(table.clone());
    initialize.await.unwrap().expect("Initialize answered");
    let config = client
        .get_plugin_config(GetPluginConfigRequest {})
        .await
        .unwrap()
        .into_inner()
        .config;
    assert_eq!(
        serde_json::from_str::<Value>(&config).unwrap(),
        json!({"clientHooks": [{"apiVersion": "v1", "kind": "Pod", "types": ["CreatePhysical"]}]})
    );
    let request = || MutateRequest {
        api_version: "v1".into(),
        kind: "Pod".into(),
        object: r#"{"metadata":{"name":"p"}}"#.into(),
        r#type: "CreatePhysical".into(),
    };
    // held hooks: vCluster's write fails (it retries the object) rather than go unhooked
    let held = client.mutate(request()).await.unwrap_err();
    assert_eq!(held.code(), tonic::Code::Unavailable);
    assert_eq!(held.message(), "not accepted yet");
    table.set(pod_hook());
    let mutated = client.mutate(request()).await.unwrap().into_inner();
    assert!(mutated.mutated);
    assert_eq!(
        serde_json::from_str::<Value>(&mutated.object).unwrap(),
        json!({"metadata": {"name": "p", "labels": {"created-by-plugin": "pod-hook"}}})
    );

    assert!(!session.is_leader());
    client.set_leader(SetLeaderRequest {}).await.unwrap();
    assert!(session.leader().await);

    let mut stdio = GRPCStdioClient::new(channel.clone())
        .stream_stdio(Empty {})
        .await
        .unwrap()
        .into_inner();
    GRPCControllerClient::new(channel)
        .shutdown(Empty {})
        .await
        .expect("Shutdown answered");
    assert_eq!(session.stopped().await, StopReason::Shutdown);
    assert!(stdio.next().await.is_none(), "the stdio stream ends");
    let socket = PathBuf::from(&parts[3]);
    assert!(socket.exists());
    session.shutdown().await;
    assert!(!socket.exists(), "the socket is removed");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_bad_init_config_is_refused_to_vcluster() {
    let (serving, parts, dir) = start(None).await;
    let mut client = PluginClient::new(connect(&parts[3]).await);
    let error = client
        .initialize(InitializeRequest {
            config: json!({"workloadConfig": ""}).to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::FailedPrecondition);
    assert!(error.message().contains("syncerConfig"), "{error:?}");
    let served = serving.await.unwrap();
    assert!(
        matches!(
            served,
            Err(ProtocolError::InitConfig {
                field: "syncerConfig",
                ..
            })
        ),
        "{:?}",
        served.err()
    );
    assert!(!PathBuf::from(&parts[3]).exists(), "the socket is removed");
    let _ = std::fs::remove_dir_all(dir);
}
