//! Generates the gRPC service code of vCluster's v2 plugin protocol (`src/v2/proto.rs` holds
//! the messages, written with `prost` derive) with tonic-build's manual builder: no `.proto`
//! file and no `protoc` are needed.
//!
//! The contract (service and method names, which message goes where) is that of
//! `github.com/loft-sh/vcluster` v0.30.0, `pkg/plugin/v2/pluginv2/pluginv2.proto`, and of
//! `github.com/hashicorp/go-plugin` v1.6.0, `internal/plugin/grpc_controller.proto` and
//! `grpc_stdio.proto` (the services go-plugin's client calls on every plugin).

use tonic_build::manual::{Builder, Method, Service};

const CODEC: &str = "tonic_prost::ProstCodec";

fn unary(name: &str, route: &str, input: &str, output: &str) -> Method {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::v2::proto::{input}"))
        .output_type(format!("crate::v2::proto::{output}"))
        .codec_path(CODEC)
        .build()
}

fn main() {
    let plugin = Service::builder()
        .name("Plugin")
        .package("pluginv2")
        .comment("vCluster's v2 plugin service (pluginv2.Plugin).")
        .method(unary(
            "initialize",
            "Initialize",
            "InitializeRequest",
            "InitializeResponse",
        ))
        .method(unary(
            "set_leader",
            "SetLeader",
            "SetLeaderRequest",
            "SetLeaderResponse",
        ))
        .method(unary(
            "get_plugin_config",
            "GetPluginConfig",
            "GetPluginConfigRequest",
            "GetPluginConfigResponse",
        ))
        .method(unary("mutate", "Mutate", "MutateRequest", "MutateResponse"))
        .build();
    let controller = Service::builder()
        .name("GRPCController")
        .package("plugin")
        .comment("go-plugin's controller: the host asks the plugin to shut down.")
        .method(unary("shutdown", "Shutdown", "Empty", "Empty"))
        .build();
    let stdio = Service::builder()
        .name("GRPCStdio")
        .package("plugin")
        .comment("go-plugin's stdio stream: the plugin's stdout/stderr for the host.")
        .method(
            Method::builder()
                .name("stream_stdio")
                .route_name("StreamStdio")
                .input_type("crate::v2::proto::Empty")
                .output_type("crate::v2::proto::StdioData")
                .codec_path(CODEC)
                .server_streaming()
                .build(),
        )
        .build();
    Builder::new().compile(&[plugin, controller, stdio]);
    println!("cargo:rerun-if-changed=build.rs");
}
