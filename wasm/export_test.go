package wasm

import (
	"context"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// WithCloseOnContextDoneForTest returns c with wazero's
// RuntimeConfig.WithCloseOnContextDone turned on beside the checkpoints, for
// the tests and benchmarks that measure it as a backstop
// (backstop_bench_test.go). The engine itself never turns it on.
func WithCloseOnContextDoneForTest(c Config) Config {
	c.closeOnContextDone = true
	return c
}

// InstantiateRawForTest compiles b in e's own runtime, as written or
// rewritten with checkpoints, and instantiates it under no name: Load's
// checks and its ABI bypassed, as if the rewrite had missed everything (or
// to measure the rewrite alone).
func (e *Engine) InstantiateRawForTest(ctx context.Context, b []byte, rewrite bool) (api.Module, error) {
	if rewrite {
		var err error
		if b, err = instrumentCheckpoints(b); err != nil {
			return nil, err
		}
	}
	compiled, err := e.runtime.CompileModule(ctx, b)
	if err != nil {
		return nil, err
	}
	return e.runtime.InstantiateModule(ctx, compiled, wazero.NewModuleConfig().WithName(""))
}
