// The Argo CD components the gitops tests run, from Argo CD's own Go module at the version go.mod
// pins: one binary that, like Argo CD's cmd/main.go, picks the component from the name it is run
// as (argv[0]) or from $ARGOCD_BINARY_NAME. Only the application controller and the repo server
// are linked in (Argo CD's own main links every component, the CLI and the API server too).
// Built and cached by scripts/argocd, which links both names to this binary.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/log"
)

func init() {
	// As Argo CD's main: klog through Argo CD's logrus logger and its configured level and format.
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	// Argo CD's main calls util/grpc.DisableSRVLookups here, which turns off gRPC's DNS SRV
	// (grpclb) lookups and panics if they were not on. Only google.golang.org/grpc/balancer/grpclb
	// turns them on (in its init), and this binary does not link it (Argo CD's full binary does,
	// through a component left out here), so they are off already and the call would panic.

	name := filepath.Base(os.Args[0])
	if v := os.Getenv("ARGOCD_BINARY_NAME"); v != "" {
		name = v
	}
	var command *cobra.Command
	switch name {
	case common.CommandApplicationController:
		command = appcontroller.NewCommand()
	case common.CommandRepoServer:
		command = reposerver.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "argocd: run me as %s or %s (argv[0] or ARGOCD_BINARY_NAME), not %q\n",
			common.CommandApplicationController, common.CommandRepoServer, name)
		os.Exit(2)
	}
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
