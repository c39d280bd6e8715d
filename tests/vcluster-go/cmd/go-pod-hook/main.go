// Command go-pod-hook is a vCluster v2 plugin written in Go: a pod hook that adds the label
// `created-by-go-plugin: go-hook` to every host pod vCluster is about to create
// (CreatePhysical). It speaks the v2 plugin protocol with vCluster's own definitions
// (github.com/loft-sh/vcluster/pkg/plugin/v2: its go-plugin handshake and the pluginv2 gRPC
// service), which is what a plugin built with the Go vcluster-sdk serves. The end-to-end test
// tests/tests/e2e_inside_vcluster.rs loads it beside the Rust runtime, to show what vCluster does
// with a Go plugin's hook label.
package main

import (
	"context"
	"encoding/json"

	"github.com/hashicorp/go-plugin"
	v2 "github.com/loft-sh/vcluster/pkg/plugin/v2"
	"github.com/loft-sh/vcluster/pkg/plugin/v2/pluginv2"
	"google.golang.org/grpc"
)

type server struct {
	pluginv2.UnimplementedPluginServer
}

func (server) Initialize(context.Context, *pluginv2.Initialize_Request) (*pluginv2.Initialize_Response, error) {
	return &pluginv2.Initialize_Response{}, nil
}

func (server) SetLeader(context.Context, *pluginv2.SetLeader_Request) (*pluginv2.SetLeader_Response, error) {
	return &pluginv2.SetLeader_Response{}, nil
}

func (server) GetPluginConfig(context.Context, *pluginv2.GetPluginConfig_Request) (*pluginv2.GetPluginConfig_Response, error) {
	config, err := json.Marshal(v2.PluginConfig{ClientHooks: []*v2.ClientHook{
		{APIVersion: "v1", Kind: "Pod", Types: []string{"CreatePhysical"}},
	}})
	if err != nil {
		return nil, err
	}
	return &pluginv2.GetPluginConfig_Response{Config: string(config)}, nil
}

func (server) Mutate(_ context.Context, req *pluginv2.Mutate_Request) (*pluginv2.Mutate_Response, error) {
	if req.ApiVersion != "v1" || req.Kind != "Pod" || req.Type != "CreatePhysical" {
		return &pluginv2.Mutate_Response{}, nil
	}
	obj := map[string]any{}
	if err := json.Unmarshal([]byte(req.Object), &obj); err != nil {
		return nil, err
	}
	meta, _ := obj["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		obj["metadata"] = meta
	}
	labels, _ := meta["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
		meta["labels"] = labels
	}
	labels["created-by-go-plugin"] = "go-hook"
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return &pluginv2.Mutate_Response{Object: string(out), Mutated: true}, nil
}

// grpcPlugin serves the pluginv2 service; the other half of go-plugin's interface is vCluster's.
type grpcPlugin struct {
	plugin.NetRPCUnsupportedPlugin
}

func (grpcPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv2.RegisterPluginServer(s, server{})
	return nil
}

func (grpcPlugin) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, nil
}

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: v2.HandshakeConfig,
		Plugins:         map[string]plugin.Plugin{"plugin": grpcPlugin{}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}
