package wasm

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// The rewritten module is cached next to wazero's compilation cache, and a
// damaged entry is rewritten rather than failing the load.
func TestRewriteCache(t *testing.T) {
	ctx := context.Background()
	module := wasmtest.BuildWAT(t, "wasm/testdata/exits.wat")
	e, err := NewEngine(ctx, NewConfig().WithCacheDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	call := func() {
		t.Helper()
		m, err := e.Load(ctx, Spec{Name: "exits", Wasm: module, Entrypoints: []string{"admit"}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(ctx)
		if out, err := m.Call(ctx, "admit", []byte(`{}`)); err != nil || string(out) != `{"ok":true}` {
			t.Fatalf("call: %s, %v", out, err)
		}
	}
	call()
	path := e.rewritePath(Digest(module))
	cached, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the rewrite was not cached: %v", err)
	}
	want, err := instrumentCheckpoints(module)
	if err != nil || !bytes.Equal(cached, want) {
		t.Fatalf("the cached rewrite differs from the rewrite (%v)", err)
	}
	call()
	if err := os.WriteFile(path, []byte("\x00asm\x01\x00\x00\x00damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	call()
}
