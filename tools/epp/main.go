// The Gateway API Inference Extension's endpoint picker (GIE v1.5.0's
// runner, cmd/epp) with llm-d's prefill/decode plugins as written in pd.go:
// the stand-in for llm-d-router's cmd/epp, which registers its plugins the
// same way before running the same runner. Built by `just epp`.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
)

func main() {
	registerPD()
	if err := runner.NewRunner().Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
