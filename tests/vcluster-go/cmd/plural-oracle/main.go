// Command plural-oracle answers, with Kubernetes' own code, the plural resource Kubernetes
// guesses for a kind: k8s.io/apimachinery/pkg/api/meta.UnsafeGuessKindToResource, the guess
// kubectl and vCluster make for a kind without discovery, and the one the requester admission
// policy (config/admission/requester.yaml) and vcp_crds::admission_plural must make.
//
// Input: one kind per line on stdin (such as `NetworkPolicy`); output: one JSON line per kind,
// in order:
//
//	{"kind":"NetworkPolicy","plural":"networkpolicies","singular":"networkpolicy"}
//
// The group and version play no part in the guess (only the kind does), so none is asked.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

type response struct {
	Kind     string `json:"kind"`
	Plural   string `json:"plural"`
	Singular string `json:"singular"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		kind := in.Text()
		plural, singular := meta.UnsafeGuessKindToResource(schema.GroupVersionKind{Kind: kind})
		if err := out.Encode(response{Kind: kind, Plural: plural.Resource, Singular: singular.Resource}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
