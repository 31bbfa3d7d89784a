package wasm

import (
	"testing"

	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// BenchmarkInstrument measures the rewrite of a Go policy, which every
// Load pays (a cold start included).
func BenchmarkInstrument(b *testing.B) {
	module := wasmtest.BuildGo(b, "policies/examples/admission/allowed-registries")
	b.SetBytes(int64(len(module)))
	for b.Loop() {
		if _, err := instrumentCheckpoints(module); err != nil {
			b.Fatal(err)
		}
	}
}
