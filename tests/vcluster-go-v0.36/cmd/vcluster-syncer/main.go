// Command vcluster-syncer is vCluster's own syncer (github.com/loft-sh/vcluster, at the version
// pinned in ../../go.mod), built as a plain local process for the end-to-end tests of
// vcluster-plugin-operator. It only calls vCluster's command, as vCluster's cmd/vcluster/main.go
// does, so `vcluster-syncer start --config FILE` is what the syncer container runs. The test
// harness (`scripts/control-plane syncer start`, tests/src/vcluster_syncer.rs) gives it the
// chart's rendering of the test values, a host kubeconfig ($KUBECONFIG) and a plugins folder.
//
// vCluster's own main also imports the cloud client-auth providers and the SQLite driver (for
// its embedded database); neither is used here (token kubeconfigs, an external etcd), so they
// are left out and the module needs no further dependency.
package main

import "github.com/loft-sh/vcluster/cmd/vcluster/cmd"

func main() {
	cmd.RunRoot()
}
