// Command cert-manager runs cert-manager's own controllers, compiled from its Go module
// (github.com/cert-manager/cert-manager, pinned in ../../go.mod), against the API server of a
// kubeconfig. It is a test driver: cert-manager's controller binary is a module of its own
// (cmd/controller) that the Go module proxy does not serve, so this program does the part of that
// binary's app package (cmd/controller/app) the tests need, with these controllers:
//
//   - the certificate controllers (pkg/controller/certificates/...): trigger, key manager,
//     request manager, issuing, readiness and revision manager;
//   - the CertificateRequest approver, which approves every request as cert-manager does without
//     an approval policy, and the CertificateRequest issuers for self-signed and CA
//     (pkg/controller/certificaterequests/...);
//   - the Issuer controller (pkg/controller/issuers, with the self-signed and CA issuer back ends
//     of pkg/issuer/...), so that Issuers become Ready.
//
// Each of them registers its constructor with pkg/controller from its package's init function. As
// cert-manager's app does, this program builds a controller.ContextFactory from the kubeconfig,
// calls the constructors of the controllers it runs (which registers their informers on the
// factory's shared informer factories), starts those factories and runs each controller with its
// workers. Left out: leader election, the metrics and health servers, the webhook, cainjector,
// the ClusterIssuer controller, the ACME, Vault and Venafi issuers, the certificate shims.
//
// Usage:
//
//	cert-manager --kubeconfig PATH [--namespace NS] [--workers N] [--v N]
//
// The cert-manager CRDs must be installed: the informers wait for them. Once every informer has
// synced it prints one line on standard error,
//
//	cert-manager-driver: running <controller names, comma-separated, sorted>
//
// and it runs until SIGINT or SIGTERM (exit status 0). Exit status 2 for bad flags, 1 when the
// controllers cannot be built or one of them fails.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
)

// controllers are the controllers this driver runs, by the names they register under.
var controllers = []string{
	trigger.ControllerName,
	keymanager.ControllerName,
	requestmanager.ControllerName,
	issuing.ControllerName,
	readiness.ControllerName,
	revisionmanager.ControllerName,
	approver.ControllerName,
	crselfsigned.CRControllerName,
	crca.CRControllerName,
	issuers.ControllerName,
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server to run against (required)")
	namespace := flag.String("namespace", "", "watch only this namespace (default: every namespace)")
	workers := flag.Int("workers", 5, "workers per controller (cert-manager's app runs 5)")
	verbosity := flag.Int("v", 0, "log verbosity (cert-manager's levels: 2 info, 4 debug)")
	flag.Parse()
	if *kubeconfig == "" || *workers < 1 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: cert-manager --kubeconfig PATH [--namespace NS] [--workers N] [--v N]")
		os.Exit(2)
	}

	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	if err := klogFlags.Set("v", fmt.Sprint(*verbosity)); err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-driver: --v: %v\n", err)
		os.Exit(2)
	}
	logf.InitLogs()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, klog.Background(), "cert-manager-driver")

	err := run(ctx, *kubeconfig, *namespace, *workers)
	logf.FlushLogs()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-driver: %v\n", err)
		os.Exit(1)
	}
}

// run builds the controllers, starts the informers and runs the controllers until ctx ends or a
// controller fails (its error is returned).
func run(ctx context.Context, kubeconfig, namespace string, workers int) error {
	factory, err := controllerpkg.NewContextFactory(ctx, controllerpkg.ContextOptions{
		Kubeconfig: kubeconfig,
		Namespace:  namespace,
		// cert-manager's defaults (its controller configuration, v1alpha1 defaults).
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		IssuerOptions: controllerpkg.IssuerOptions{
			ClusterResourceNamespace: "kube-system",
		},
		CertificateOptions: controllerpkg.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return fmt.Errorf("building the controller context: %w", err)
	}

	known := controllerpkg.Known()
	built := make(map[string]controllerpkg.Interface, len(controllers))
	for _, name := range controllers {
		construct, ok := known[name]
		if !ok {
			return fmt.Errorf("controller %q is not registered by the cert-manager module", name)
		}
		c, err := construct(factory)
		if err != nil {
			return fmt.Errorf("building controller %q: %w", name, err)
		}
		built[name] = c
	}

	// Every Context the factory builds shares its informer factories, on which the constructors
	// registered their informers: starting them through one Context starts every informer.
	shared, err := factory.Build()
	if err != nil {
		return fmt.Errorf("building the shared context: %w", err)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	failed := make(chan error, len(built))
	for name, c := range built {
		wg.Go(func() {
			if err := c.Run(workers, ctx); err != nil {
				failed <- fmt.Errorf("controller %q: %w", name, err)
				cancel()
			}
		})
	}
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())

	synced := true
	for _, ok := range shared.SharedInformerFactory.WaitForCacheSync(ctx.Done()) {
		synced = synced && ok
	}
	for _, ok := range shared.KubeSharedInformerFactory.WaitForCacheSync(ctx.Done()) {
		synced = synced && ok
	}
	if synced {
		names := append([]string(nil), controllers...)
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "cert-manager-driver: running %s\n", strings.Join(names, ","))
	}

	wg.Wait()
	shared.SharedInformerFactory.Shutdown()
	shared.KubeSharedInformerFactory.Shutdown()
	close(failed)
	return <-failed
}
