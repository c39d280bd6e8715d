// Command config-oracle answers, with vCluster's own config parser, what vCluster reads from a
// vcluster.yaml: the referee of `vcluster-plugin-operator import` (operator/src/import.rs), which
// converts `sync.toHost.customResources` / `sync.fromHost.customResources` into VClusterPlugins.
//
// Input: JSON lines on stdin, one request each; output: one JSON line per request, in order.
//
//	{"yaml":"<the text of a vcluster.yaml>","name":"vc"}
//	    -> {"toHost":{...},"fromHost":{...},"proFeature":true}: the file merged over the chart's
//	       default values (config.Values, as Helm merges a user's values over the chart's), then
//	       parsed and validated by pkg/config.ParseConfigBytes (the strict decoder and
//	       ValidateConfigAndSetDefaults the syncer runs at start-up) for the vCluster `name`;
//	       toHost / fromHost are the parsed Sync.ToHost.CustomResources and
//	       Sync.FromHost.CustomResources re-encoded with the config package's own JSON tags;
//	       proFeature is Config.IsProFeatureEnabled() (whether the open-source build refuses it)
//	    -> {"error":"..."} when vCluster's parser or validation refuses the file.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"github.com/loft-sh/vcluster/config"
	pkgconfig "github.com/loft-sh/vcluster/pkg/config"
	"sigs.k8s.io/yaml"
)

type request struct {
	YAML string `json:"yaml"`
	Name string `json:"name"`
}

type response struct {
	ToHost     map[string]config.SyncToHostCustomResource   `json:"toHost,omitempty"`
	FromHost   map[string]config.SyncFromHostCustomResource `json:"fromHost,omitempty"`
	ProFeature bool                                         `json:"proFeature"`
	Error      string                                       `json:"error,omitempty"`
}

// merge writes src over dst the way Helm merges values: maps are merged key by key, anything
// else (lists included) replaces.
func merge(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				dst[k] = merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
	return dst
}

func answer(req request) response {
	defaults := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(config.Values), &defaults); err != nil {
		return response{Error: fmt.Sprintf("default values: %v", err)}
	}
	user := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(req.YAML), &user); err != nil {
		return response{Error: fmt.Sprintf("vcluster.yaml: %v", err)}
	}
	merged, err := yaml.Marshal(merge(defaults, user))
	if err != nil {
		return response{Error: fmt.Sprintf("merged values: %v", err)}
	}
	name := req.Name
	if name == "" {
		name = "vc"
	}
	cfg, err := pkgconfig.ParseConfigBytes(merged, name, nil)
	if err != nil {
		return response{Error: err.Error()}
	}
	return response{
		ToHost:     cfg.Sync.ToHost.CustomResources,
		FromHost:   cfg.Sync.FromHost.CustomResources,
		ProFeature: cfg.IsProFeatureEnabled(),
	}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	// ParseConfigBytes prints a refused file's decoding error on stdout: keep the answers alone
	// there.
	os.Stdout = os.Stderr
	for in.Scan() {
		var req request
		var resp response
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			resp = response{Error: fmt.Sprintf("bad request: %v", err)}
		} else {
			resp = answer(req)
		}
		if err := out.Encode(resp); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
