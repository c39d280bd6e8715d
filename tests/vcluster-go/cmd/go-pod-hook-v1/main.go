// Command go-pod-hook-v1 is a vCluster v1 (legacy sidecar) plugin written in Go: a pod hook that
// adds a label to every host pod vCluster is about to create (CreatePhysical). It speaks the
// legacy plugin protocol with vCluster's own definitions (github.com/loft-sh/vcluster/pkg/plugin/
// v1/remote): it serves the `remote.Plugin` service (Mutate) on its own address and registers
// itself, its address and its client hook with vCluster's legacy plugin server
// (`remote.VCluster/RegisterPlugin` on localhost:10099, pkg/plugin/v1/plugin.go), retrying until
// vCluster answers, as a sidecar started beside the syncer container must.
//
// It reads what the operator puts on a v1 sidecar container: VCLUSTER_PLUGIN_ADDRESS (where it
// serves), VCLUSTER_PLUGIN_NAME (the name it registers) and PLUGIN_CONFIG (the VClusterPlugin's
// spec.config as YAML: `label` is the value of the label it sets). The label's key is its
// argument -label. The end-to-end test tests/tests/e2e_inside_vcluster.rs runs it with the env
// and args of the sidecar container the operator added to the vCluster's StatefulSet.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net"
	"os"
	"time"

	"github.com/loft-sh/vcluster/pkg/plugin/v1/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/yaml"
)

// vClusterAddress is where vCluster's legacy plugin server listens (its PluginListenAddress,
// fixed by pkg/config/config.go's LegacyOptions).
const vClusterAddress = "localhost:10099"

type hook struct {
	remote.UnimplementedPluginServer
	key, value string
}

func (h hook) Mutate(_ context.Context, req *remote.MutateRequest) (*remote.MutateResult, error) {
	if req.ApiVersion != "v1" || req.Kind != "Pod" || req.Type != "CreatePhysical" {
		return &remote.MutateResult{}, nil
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
	labels[h.key] = h.value
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	log.Printf("Mutate %s %s %s %s/%s: label %s=%s", req.Type, req.ApiVersion, req.Kind, meta["namespace"], meta["name"], h.key, h.value)
	return &remote.MutateResult{Object: string(out), Mutated: true}, nil
}

func main() {
	key := flag.String("label", "created-by-v1-plugin", "the key of the label the hook sets")
	flag.Parse()
	address, name := os.Getenv("VCLUSTER_PLUGIN_ADDRESS"), os.Getenv("VCLUSTER_PLUGIN_NAME")
	var config struct {
		Label string `json:"label"`
	}
	if err := yaml.Unmarshal([]byte(os.Getenv("PLUGIN_CONFIG")), &config); err != nil {
		log.Fatalf("PLUGIN_CONFIG: %v", err)
	}
	if address == "" || name == "" || config.Label == "" {
		log.Fatalf("need VCLUSTER_PLUGIN_ADDRESS, VCLUSTER_PLUGIN_NAME and PLUGIN_CONFIG with a label (got %q, %q, %+v)", address, name, config)
	}

	lis, err := net.Listen("tcp", address)
	if err != nil {
		log.Fatalf("listen on %s: %v", address, err)
	}
	server := grpc.NewServer()
	remote.RegisterPluginServer(server, hook{key: *key, value: config.Label})
	go func() { log.Fatal(server.Serve(lis)) }()

	conn, err := grpc.NewClient(vClusterAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("vCluster's plugin server %s: %v", vClusterAddress, err)
	}
	request := &remote.RegisterPluginRequest{
		Version:     "v1",
		Name:        name,
		Address:     address,
		ClientHooks: []*remote.ClientHook{{ApiVersion: "v1", Kind: "Pod", Types: []string{"CreatePhysical"}}},
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = remote.NewVClusterClient(conn).RegisterPlugin(ctx, request)
		cancel()
		if err == nil {
			break
		}
		log.Printf("register with vCluster at %s: %v (retrying)", vClusterAddress, err)
		time.Sleep(500 * time.Millisecond)
	}
	log.Printf("Registered plugin %s (serving Mutate on %s, hook CreatePhysical v1 Pod: label %s=%s)", name, address, *key, config.Label)
	select {}
}
