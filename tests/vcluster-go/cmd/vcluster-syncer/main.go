// Command vcluster-syncer is vCluster's own syncer (github.com/loft-sh/vcluster, at the version
// pinned in ../../go.mod), built as a plain local process for the end-to-end tests of
// vcluster-plugin-operator. It only calls vCluster's command, as vCluster's cmd/vcluster/main.go
// does, so `vcluster-syncer start --config FILE` is what the syncer container runs. The test
// harness (`scripts/control-plane syncer start`, tests/src/vcluster_syncer.rs) gives it the
// chart's rendering of the test values, a host kubeconfig ($KUBECONFIG) and a plugins folder.
//
// The version the syncer reports (its `vCluster version` line at start, `pkg/telemetry`'s
// `SyncerVersion`) is set as vCluster's release build sets it (`.goreleaser.yaml`, `Dockerfile`:
// `-ldflags -X .../pkg/telemetry.SyncerVersion=...`), here from the Go toolchain's own record of
// the github.com/loft-sh/vcluster module this binary was compiled from (`debug.ReadBuildInfo`),
// so the tests can assert which vCluster runs. Without it, every version reports `dev`.
//
// vCluster's own main also imports the cloud client-auth providers and the SQLite driver (for
// its embedded database); neither is used here (token kubeconfigs, an external etcd), so they
// are left out and the module needs no further dependency.
package main

import (
	"runtime/debug"

	"github.com/loft-sh/vcluster/cmd/vcluster/cmd"
	"github.com/loft-sh/vcluster/pkg/telemetry"
)

func main() {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/loft-sh/vcluster" {
				telemetry.SyncerVersion = dep.Version
			}
		}
	}
	cmd.RunRoot()
}
