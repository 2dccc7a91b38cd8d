// llm-d's own endpoint picker: llm-d-inference-scheduler's plugins (its
// prefill/decode profile handler and filters, its precise prefix-cache
// scorer, which indexes the pods' KV events from ZMQ) registered on GIE's
// runner, as that module's cmd/epp does. A wrapper module because the
// module proxy refuses the scheduler's version list, which
// `go install module@version` reads; the exact version is served. Built by
// `just llmd-epp`.
package main

import (
	"os"

	"github.com/llm-d/llm-d-inference-scheduler/pkg/metrics"
	"github.com/llm-d/llm-d-inference-scheduler/pkg/plugins"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
)

func main() {
	plugins.RegisterAllPlugins()
	if err := runner.NewRunner().
		WithCustomCollectors(metrics.GetCollectors()...).
		Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
