// Command opa is Open Policy Agent's own CLI (upstream's main package, with the Wasm engine its
// release binaries have) at the version pinned in go.mod, built for holdfast's tests and
// benchmarks: the Rego policies holdfast accepts (policies.yaml `kind: opa`) are compiled by
// `opa build -t wasm` exactly as a user compiles them, and `make bench` compares holdfast's
// evaluation of those bundles with `opa bench`: OPA's Go evaluator and its own Wasm engine on
// the same policy and input. It lives in a module of its own so that OPA's dependencies never
// reach holdfast's go.mod.
package main

import (
	"errors"
	"os"

	"github.com/open-policy-agent/opa/cmd"
	// OPA's own Wasm engine (wazero), as in upstream's release binaries: `opa bench -t wasm`
	// gives make bench a third figure beside holdfast's engine and OPA's Go evaluator.
	_ "github.com/open-policy-agent/opa/features/wasm"
)

// main is upstream's: a failing command exits with OPA's own code.
func main() {
	var exit int
	defer func() {
		if exit != 0 {
			os.Exit(exit)
		}
	}()
	if err := cmd.RootCommand.Execute(); err != nil {
		if e, ok := errors.AsType[*cmd.ExitError](err); ok {
			exit = e.Exit
		} else {
			exit = 1
		}
	}
}
