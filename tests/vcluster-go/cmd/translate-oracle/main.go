// Command translate-oracle answers, with vCluster's own code, how vCluster's syncer translates
// virtual objects into host objects. It is the referee of the Rust translation
// (syncer-runtime/src/translate.rs): tests/tests/translate_oracle.rs feeds both the same cases.
//
// Input: JSON lines on stdin, one request each; output: one JSON line per request, in order.
//
//	{"op":"metadata","vcluster":"vc","hostNamespace":"vcluster-vc","ownerUID":"u","object":{...}}
//	    -> {"metadata":{...}}: metadata of translate.HostMetadata(object, HostName(...)), with
//	       translate.VClusterName = vcluster, translate.Default a single-namespace translator
//	       for hostNamespace (as pkg/setup/config.InitAndValidateConfig sets them), and, when
//	       ownerUID is given, translate.Owner the vCluster's Service <vcluster> in hostNamespace
//	       with that uid (as pkg/setup/config.SetGlobalOwner sets it with
//	       experimental.syncSettings.setOwner, its default)
//	{"op":"update","vcluster":"vc","hostNamespace":"vcluster-vc","object":{...},"host":{...}}
//	    -> {"labels":{...},"annotations":{...}}: translate.HostLabels(object, host) and
//	       translate.HostAnnotations(object, host), the labels and annotations vCluster's
//	       pure functions give the existing host object `host` of `object`
//	{"op":"hostName","name":"n","namespace":"ns","vcluster":"vc"}
//	    -> {"name":...}: translate.SingleNamespaceHostName(name, namespace, vcluster)
//	{"op":"concat","parts":["a","b"]}
//	    -> {"name":...}: translate.SafeConcatName(parts...)
//	{"op":"hostLabel","vcluster":"vc","key":"release"}
//	    -> {"name":...}: translate.HostLabel(key) (a label key as vCluster writes it on the host)
//	{"op":"hostLabelSelector","vcluster":"vc","hostNamespace":"vcluster-vc","selector":{...}}
//	    -> {"selector":{...}}: translate.HostLabelSelector(selector), the selector of the host
//	       copies of the objects `selector` selects in the virtual cluster (what vCluster's
//	       PodDisruptionBudget syncer writes; the rule of a `labels` patch); a null selector
//	       answers {"selectorNull":true}
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"github.com/loft-sh/vcluster/pkg/util/translate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

type request struct {
	Op            string                 `json:"op"`
	VCluster      string                 `json:"vcluster"`
	HostNamespace string                 `json:"hostNamespace"`
	OwnerUID      string                 `json:"ownerUID"`
	Object        map[string]interface{} `json:"object"`
	Host          map[string]interface{} `json:"host"`
	Name          string                 `json:"name"`
	Namespace     string                 `json:"namespace"`
	Parts         []string               `json:"parts"`
	Key           string                 `json:"key"`
	Selector      *metav1.LabelSelector  `json:"selector"`
}

type response struct {
	Metadata    interface{}           `json:"metadata,omitempty"`
	Labels      map[string]string     `json:"labels,omitempty"`
	Annotations map[string]string     `json:"annotations,omitempty"`
	Name        *string               `json:"name,omitempty"`
	Selector    *metav1.LabelSelector `json:"selector,omitempty"`
	Null        bool                  `json:"selectorNull,omitempty"`
	Error       string                `json:"error,omitempty"`
}

// configure sets vCluster's globals as its syncer does at start-up for vCluster `name`
// in host namespace `hostNamespace`.
func configure(name, hostNamespace, ownerUID string) {
	translate.VClusterName = name
	translate.Default = translate.NewSingleNamespaceTranslator(hostNamespace)
	translate.Owner = nil
	if ownerUID != "" {
		translate.Owner = &corev1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: hostNamespace, UID: types.UID(ownerUID)},
		}
	}
}

func answer(req request) response {
	switch req.Op {
	case "metadata":
		configure(req.VCluster, req.HostNamespace, req.OwnerUID)
		vObj := &unstructured.Unstructured{Object: req.Object}
		name := translate.Default.HostName(nil, vObj.GetName(), vObj.GetNamespace())
		pObj := translate.HostMetadata(vObj, name)
		return response{Metadata: pObj.Object["metadata"]}
	case "update":
		configure(req.VCluster, req.HostNamespace, "")
		vObj := &unstructured.Unstructured{Object: req.Object}
		pObj := &unstructured.Unstructured{Object: req.Host}
		return response{
			Labels:      translate.HostLabels(vObj, pObj),
			Annotations: translate.HostAnnotations(vObj, pObj),
		}
	case "hostName":
		name := translate.SingleNamespaceHostName(req.Name, req.Namespace, req.VCluster)
		return response{Name: &name}
	case "concat":
		name := translate.SafeConcatName(req.Parts...)
		return response{Name: &name}
	case "hostLabel":
		configure(req.VCluster, "", "")
		name := translate.HostLabel(req.Key)
		return response{Name: &name}
	case "hostLabelSelector":
		configure(req.VCluster, req.HostNamespace, "")
		selector := translate.HostLabelSelector(req.Selector)
		return response{Selector: selector, Null: selector == nil}
	default:
		return response{Error: fmt.Sprintf("unknown op %q", req.Op)}
	}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for in.Scan() {
		var req request
		var resp response
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			resp = response{Error: err.Error()}
		} else {
			resp = answer(req)
		}
		if err := enc.Encode(resp); err != nil {
			fmt.Fprintln(os.Stderr, "translate-oracle:", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "translate-oracle:", err)
		os.Exit(1)
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "translate-oracle:", err)
		os.Exit(1)
	}
}
