// Command plugin-loader loads vCluster v2 plugins with vCluster's own loader
// (github.com/loft-sh/vcluster v0.30.0, pkg/plugin/v2: the Manager the vCluster syncer uses to
// find, start, initialise and call its plugins), against clusters given by kubeconfigs. It is
// a test driver of vcluster-plugin-operator: the end-to-end tests load the Rust plugins with it.
//
//	plugin-loader --plugins DIR --host-kubeconfig F --virtual-kubeconfig F \
//	    --namespace NS --name VCLUSTER [--values FILE]
//
// It starts every plugin DIR/<name>/plugin (Manager.Start: go-plugin handshake, Initialize,
// GetPluginConfig), then reads commands from stdin, one JSON object per line, and writes one
// JSON event per line to stdout (the loader's and the plugins' logs go to stderr):
//
//	{"op":"setLeader"}                              -> {"event":"leader"}            (Manager.SetLeader)
//	{"op":"mutate","type":T,"object":{...}}         -> {"event":"mutated","object":{...}}
//	                                                   (Manager.MutateObject: a kind the client-go
//	                                                   scheme knows is decoded into its typed object,
//	                                                   as the syncer holds it; others are unstructured)
//	{"op":"stop"}, end of stdin, SIGTERM or SIGINT  -> every plugin is stopped (go-plugin's
//	                                                   Client.Kill), {"event":"stopped",...}, exit 0
//
// After the start: {"event":"started","plugins":[{"path":..,"pid":..}],"clientHooks":[{..}]}.
// A failed command: {"event":"error","error":"..."}; a failed start: the error on stderr, exit 1.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	vclusterconfig "github.com/loft-sh/vcluster/config"
	"github.com/loft-sh/vcluster/pkg/config"
	pluginv2 "github.com/loft-sh/vcluster/pkg/plugin/v2"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

type command struct {
	Op     string          `json:"op"`
	Type   string          `json:"type,omitempty"`
	Object json.RawMessage `json:"object,omitempty"`
}

type pluginInfo struct {
	Path string `json:"path"`
	Pid  int    `json:"pid"`
}

type hookInfo struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Type       string `json:"type"`
	Plugins    int    `json:"plugins"`
}

// events is the process's real stdout; os.Stdout is pointed at stderr before the loader runs,
// because the loader logs (and copies the plugins' stdout) to os.Stdout.
var events = json.NewEncoder(os.Stdout)

func emit(event map[string]any) {
	if err := events.Encode(event); err != nil {
		fmt.Fprintf(os.Stderr, "plugin-loader: write event: %v\n", err)
		os.Exit(1)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "plugin-loader: "+format+"\n", args...)
	os.Exit(1)
}

// vclusterConfig is the configuration the syncer would run with: the chart's default values
// (vCluster's config/values.yaml) with the values file on top, validated and defaulted by
// vCluster's own code, for the vCluster `name` in host namespace `namespace`.
func vclusterConfig(valuesFile, name, namespace, hostKubeconfig string) (*config.VirtualClusterConfig, error) {
	raw := &vclusterconfig.Config{}
	if err := yaml.Unmarshal([]byte(vclusterconfig.Values), raw); err != nil {
		return nil, fmt.Errorf("chart default values: %w", err)
	}
	if valuesFile != "" {
		data, err := os.ReadFile(valuesFile)
		if err != nil {
			return nil, err
		}
		if err := yaml.Unmarshal(data, raw); err != nil {
			return nil, fmt.Errorf("values %s: %w", valuesFile, err)
		}
	}
	vConfig := &config.VirtualClusterConfig{Config: *raw, Name: name, HostNamespace: namespace}
	if err := config.ValidateConfigAndSetDefaults(vConfig); err != nil {
		return nil, fmt.Errorf("validate values: %w", err)
	}
	hostConfig, err := clientcmd.BuildConfigFromFlags("", hostKubeconfig)
	if err != nil {
		return nil, fmt.Errorf("host kubeconfig: %w", err)
	}
	vConfig.HostConfig = hostConfig
	return vConfig, nil
}

// decode turns the JSON of an object into what the syncer would hand to MutateObject.
func decode(data []byte) (client.Object, error) {
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err == nil {
		if typed, ok := obj.(client.Object); ok {
			// Typed objects read through controller-runtime's cache carry no apiVersion/kind:
			// the syncer's objects reach MutateObject (and so the plugin) without them.
			typed.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
			return typed, nil
		}
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		return nil, err
	}
	return u, nil
}

func stop(manager *pluginv2.Manager) {
	exited := []bool{}
	for _, p := range manager.Plugins {
		p.Client.Kill()
		exited = append(exited, p.Client.Exited())
	}
	emit(map[string]any{"event": "stopped", "exited": exited})
}

func main() {
	plugins := flag.String("plugins", "", "folder holding <name>/plugin (vCluster: /plugins)")
	hostKubeconfig := flag.String("host-kubeconfig", "", "kubeconfig of the host cluster")
	virtualKubeconfig := flag.String("virtual-kubeconfig", "", "kubeconfig of the virtual cluster (the syncer's)")
	namespace := flag.String("namespace", "", "host namespace of the vCluster")
	name := flag.String("name", "", "name of the vCluster")
	values := flag.String("values", "", "vCluster values file (optional; plugins.<name>.config reaches the plugin)")
	flag.Parse()
	if *plugins == "" || *hostKubeconfig == "" || *virtualKubeconfig == "" || *namespace == "" || *name == "" {
		fail("--plugins, --host-kubeconfig, --virtual-kubeconfig, --namespace and --name are required")
	}
	os.Stdout = os.Stderr

	vConfig, err := vclusterConfig(*values, *name, *namespace, *hostKubeconfig)
	if err != nil {
		fail("%v", err)
	}
	syncerConfig, err := clientcmd.LoadFromFile(*virtualKubeconfig)
	if err != nil {
		fail("virtual kubeconfig: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	manager := pluginv2.NewManager()
	manager.PluginFolder = *plugins
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	start := time.Now()
	if err := manager.Start(ctx, syncerConfig, vConfig); err != nil {
		for _, p := range manager.Plugins {
			p.Client.Kill()
		}
		fail("start plugins: %v", err)
	}
	loaded := []pluginInfo{}
	for _, p := range manager.Plugins {
		info := pluginInfo{Path: p.Path}
		if reattach := p.Client.ReattachConfig(); reattach != nil {
			info.Pid = reattach.Pid
		}
		loaded = append(loaded, info)
	}
	hooks := []hookInfo{}
	for key, ps := range manager.ClientHooks {
		hooks = append(hooks, hookInfo{APIVersion: key.APIVersion, Kind: key.Kind, Type: key.Type, Plugins: len(ps)})
	}
	sort.Slice(hooks, func(i, j int) bool {
		a, b := hooks[i], hooks[j]
		return a.APIVersion+"/"+a.Kind+"/"+a.Type < b.APIVersion+"/"+b.Kind+"/"+b.Type
	})
	emit(map[string]any{"event": "started", "plugins": loaded, "clientHooks": hooks, "seconds": time.Since(start).Seconds()})

	commands := make(chan command)
	go func() {
		defer close(commands)
		scanner := bufio.NewScanner(os.Stdin)
		scanner.Buffer(make([]byte, 1<<20), 16<<20)
		for scanner.Scan() {
			var c command
			if err := json.Unmarshal(scanner.Bytes(), &c); err != nil {
				emit(map[string]any{"event": "error", "error": fmt.Sprintf("command is not JSON: %v", err)})
				continue
			}
			commands <- c
		}
	}()

	for {
		select {
		case sig := <-signals:
			fmt.Fprintf(os.Stderr, "plugin-loader: %v: stopping the plugins\n", sig)
			stop(manager)
			return
		case c, ok := <-commands:
			if !ok || c.Op == "stop" {
				stop(manager)
				return
			}
			switch c.Op {
			case "setLeader":
				if err := manager.SetLeader(ctx); err != nil {
					emit(map[string]any{"event": "error", "error": err.Error()})
					continue
				}
				emit(map[string]any{"event": "leader"})
			case "mutate":
				obj, err := decode(c.Object)
				if err != nil {
					emit(map[string]any{"event": "error", "error": fmt.Sprintf("decode object: %v", err)})
					continue
				}
				var mutateScheme *runtime.Scheme = scheme.Scheme
				if err := manager.MutateObject(ctx, obj, c.Type, mutateScheme); err != nil {
					emit(map[string]any{"event": "error", "error": err.Error()})
					continue
				}
				emit(map[string]any{"event": "mutated", "object": obj})
			default:
				emit(map[string]any{"event": "error", "error": "unknown op " + c.Op})
			}
		}
	}
}
