// istio-pilot-xds: Istio's pilot (istio.io/istio, pinned in go.mod) turns Kubernetes and Istio
// objects into the xDS it would send one gateway proxy, printed as JSON. It runs pilot's own
// fake discovery server (pilot/test/xds): the real config store, validation, Gateway API
// controller, EnvoyFilter patching and xDS generators, fed from a YAML file instead of an API
// server. tests/e2e/istio.rs runs it on the rendered deploy/istio overlay.
//
//	istio-pilot-xds -f objects.yaml -namespace llm -gateway llm-gw > xds.json
//
// The output: {"listeners": [...], "routes": [...], "clusters": [...], "extension_configs":
// [...], "warnings": [...]}, each resource in protojson with proto field names.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"istio.io/istio/pilot/pkg/config/kube/crd"
	"istio.io/istio/pilot/pkg/model"
	v3 "istio.io/istio/pilot/pkg/xds/v3"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/config/schema/collections"
	"istio.io/istio/pkg/log"
	"istio.io/istio/pkg/test"
	"istio.io/istio/pkg/util/sets"
)

func main() {
	file := flag.String("f", "", "the objects, a multi-document YAML file")
	namespace := flag.String("namespace", "default", "the gateway's namespace")
	gateway := flag.String("gateway", "", "the Gateway API Gateway whose proxy to generate for")
	class := flag.String("class", "istio", "the Gateway's class")
	ip := flag.String("ip", "10.0.0.7", "the gateway pod's IP")
	extensions := flag.String("extension-configs", "", "ECDS resource names to generate, comma-separated")
	flag.Parse()
	if *file == "" || *gateway == "" {
		flag.Usage()
		os.Exit(2)
	}
	// pilot's log to stderr: stdout is the xDS.
	logOpts := log.DefaultOptions()
	logOpts.OutputPaths = []string{"stderr"}
	logOpts.ErrorOutputPaths = []string{"stderr"}
	if err := log.Configure(logOpts); err != nil {
		fail("%v", err)
	}
	input, err := os.ReadFile(*file)
	if err != nil {
		fail("%v", err)
	}
	objects := string(input)
	warnings, err := validate(objects)
	if err != nil {
		fail("istiod would refuse the objects: %v", err)
	}

	var out map[string]any
	if err := test.Wrap(func(t test.Failer) {
		// As Istio's own tests of Gateway API gateways do: Istio objects go to the config
		// store (validated as istiod's webhook validates), and every object to the fake
		// Kubernetes client the service registry and the Gateway API controller read.
		s := xds.NewFakeDiscoveryServer(t, xds.FakeOptions{
			ConfigString:           objects,
			KubernetesObjectString: objects,
		})
		// The gateway pod as Istio's gateway Deployment template (kube-gateway.yaml) labels it.
		labels := map[string]string{
			"gateway.networking.k8s.io/gateway-name":       *gateway,
			"gateway.networking.k8s.io/gateway-class-name": *class,
			"gateway.istio.io/managed":                     "istio.io-gateway-controller",
			"service.istio.io/canonical-name":              *gateway + "-" + *class,
			"service.istio.io/canonical-revision":          "latest",
			"sidecar.istio.io/inject":                      "false",
		}
		proxy := s.SetupProxy(&model.Proxy{
			Type:            model.Router,
			ID:              *gateway + "-" + *class + "-0." + *namespace,
			ConfigNamespace: *namespace,
			Labels:          labels,
			IPAddresses:     []string{*ip},
			Metadata: &model.NodeMetadata{
				Labels:       labels,
				Namespace:    *namespace,
				ClusterID:    "Kubernetes",
				IstioVersion: "1.31.0",
			},
		})
		push := s.PushContext()
		listeners := s.Listeners(proxy)
		routes := s.RoutesFromListeners(proxy, listeners)
		clusters := s.Clusters(proxy)
		var ecds []proto.Message
		if *extensions != "" {
			gen := s.Discovery.Generators[v3.ExtensionConfigurationType]
			res, _, err := gen.Generate(proxy,
				&model.WatchedResource{ResourceNames: sets.New(strings.Split(*extensions, ",")...)},
				&model.PushRequest{Forced: true, Push: push})
			if err != nil {
				t.Fatalf("ECDS: %v", err)
			}
			for _, r := range res {
				m, err := r.Resource.UnmarshalNew()
				if err != nil {
					t.Fatalf("ECDS %s: %v", r.Name, err)
				}
				ecds = append(ecds, m)
			}
		}
		gateways := []string{}
		if proxy.MergedGateway != nil {
			for _, g := range proxy.MergedGateway.GatewayNameForServer {
				gateways = append(gateways, g)
			}
		}
		out = map[string]any{
			"listeners":         toJSON(t, listeners),
			"routes":            toJSON(t, routes),
			"clusters":          toJSON(t, clusters),
			"extension_configs": toJSON(t, ecds),
			"gateways":          gateways,
			"warnings":          warnings,
		}
	}); err != nil {
		fail("pilot: %v", err)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		fail("%v", err)
	}
}

// validate runs istiod's validation (its webhook's) on each Istio object, and returns the
// warnings the webhook would give `kubectl apply`.
func validate(objects string) ([]string, error) {
	configs, _, err := crd.ParseInputs(objects)
	if err != nil {
		return nil, err
	}
	var warnings []string
	for _, c := range configs {
		s, ok := collections.PilotGatewayAPI().FindByGroupVersionAliasesKind(c.GroupVersionKind)
		if !ok {
			continue
		}
		w, _ := s.ValidateConfig(c)
		if w != nil {
			warnings = append(warnings, fmt.Sprintf("%s %s/%s: %v", c.GroupVersionKind.Kind, c.Namespace, c.Name, w))
		}
	}
	return warnings, nil
}

func toJSON[T proto.Message](t test.Failer, list []T) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(list))
	for _, m := range list {
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		out = append(out, b)
	}
	return out
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "istio-pilot-xds: "+format+"\n", args...)
	os.Exit(1)
}
