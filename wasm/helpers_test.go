package wasm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// serveTCP serves every connection to a listener on loopback with handle, each in a goroutine
// of its own that closes it after, until the test ends (the listener closed and every handler
// returned), and returns the listener's port.
func serveTCP(t *testing.T, handle func(net.Conn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// lockedBuffer collects the engine's log.
type lockedBuffer struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type testEngine struct {
	*wasm.Engine
	logs *lockedBuffer
}

func newEngine(t testing.TB, limits wasm.Limits) *testEngine {
	t.Helper()
	return newEngineWith(t, limits, nil)
}

// newEngineWith is newEngine with the configuration changed by with, if
// not nil.
func newEngineWith(t testing.TB, limits wasm.Limits, with func(wasm.Config) wasm.Config) *testEngine {
	t.Helper()
	logs := &lockedBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := wasm.NewConfig().
		WithCacheDir(wasmtest.CacheDir(t, "wazero")).
		WithLogger(logger).
		WithDefaultLimits(limits)
	if with != nil {
		cfg = with(cfg)
	}
	e, err := wasm.NewEngine(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(context.Background()); err != nil {
			t.Errorf("close engine: %v", err)
		}
	})
	return &testEngine{Engine: e, logs: logs}
}

func (e *testEngine) load(t testing.TB, spec wasm.Spec) *wasm.Module {
	t.Helper()
	m, err := e.Load(context.Background(), spec)
	if err != nil {
		t.Fatalf("load %s: %v", spec.Name, err)
	}
	return m
}

// Built modules, shared by the tests of one run.
var (
	builtMu sync.Mutex // protects built
	built   = map[string][]byte{}
)

func wat(t testing.TB, name string) []byte {
	return memo(t, "wat:"+name, func() []byte { return wasmtest.BuildWAT(t, "wasm/testdata/"+name+".wat") })
}

func goModule(t testing.TB, pkg string) []byte {
	return memo(t, "go:"+pkg, func() []byte { return wasmtest.BuildGo(t, pkg) })
}

func cModule(t testing.TB, file string) []byte {
	return memo(t, "c:"+file, func() []byte { return wasmtest.BuildC(t, file) })
}

func memo(t testing.TB, key string, build func() []byte) []byte {
	t.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	if b, ok := built[key]; ok {
		return b
	}
	b := build()
	built[key] = b
	return b
}

// healthy asserts that a module answers a well-formed call correctly.
func healthy(t testing.TB, m *wasm.Module, export string, input string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := m.Call(ctx, export, []byte(input))
	if err != nil {
		t.Fatalf("%s is not healthy: %v", m.Name(), err)
	}
	if !json.Valid(out) {
		t.Fatalf("%s answered %q", m.Name(), out)
	}
}

func wantKind(t testing.TB, err error, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error = %v, want class %v", err, kind)
	}
	var we *wasm.Error
	if !errors.As(err, &we) {
		t.Fatalf("error %v is not a *wasm.Error", err)
	}
}

func decode(t testing.TB, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return m
}
