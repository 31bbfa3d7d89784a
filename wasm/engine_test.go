package wasm_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

func TestCallEchoWAT(t *testing.T) {
	e := newEngine(t, wasm.Limits{OutputBytes: 1 << 20})
	m := e.load(t, wasm.Spec{Name: "echo", Wasm: wat(t, "echo"), Entrypoints: []string{"admit", "probe"}})
	for _, in := range []string{`{}`, `{"a":[1,2,3]}`, `{"big":"` + strings.Repeat("x", 200_000) + `"}`} {
		out, err := m.Call(context.Background(), "admit", []byte(in))
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != in {
			if len(in) > 60 && len(out) != len(in) {
				t.Fatalf("echo of %d bytes returned %d bytes", len(in), len(out))
			} else if len(in) <= 60 {
				t.Fatalf("echo %q returned %q", in, out)
			}
		}
	}
	if got := m.Info(); got.ABIVersion != 1 || strings.Join(got.Entrypoints, ",") != "admit,probe" {
		t.Fatalf("info = %+v", got)
	}
	if !strings.HasPrefix(m.Digest(), "sha256:") || len(m.Digest()) != 71 {
		t.Fatalf("digest = %q", m.Digest())
	}
}

// The C policy shows that the ABI is not Go-only.
func TestCallCPolicy(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	m := e.load(t, wasm.Spec{Name: "deny-host-network", Wasm: wasmtest.BuildC(t, "policies/examples/c/deny-host-network/policy.c"), Entrypoints: []string{"admit"}})
	for _, tc := range []struct {
		pod     string
		allowed bool
	}{
		{`{"spec":{"containers":[{"name":"a"}]}}`, true},
		{`{"spec":{"hostNetwork":true,"containers":[{"name":"a"}]}}`, false},
		{`{"spec":{"hostNetwork":false,"containers":[{"name":"a"}]}}`, true},
	} {
		for i := 0; i < 3; i++ { // the bump allocator resets between calls
			out, err := m.Call(context.Background(), "admit", []byte(`{"pod":`+tc.pod+`,"node":{"name":"n"}}`))
			if err != nil {
				t.Fatal(err)
			}
			if got := decode(t, out)["allowed"]; got != tc.allowed {
				t.Fatalf("pod %s: allowed = %v, want %v", tc.pod, got, tc.allowed)
			}
		}
	}
	if !strings.Contains(e.logs.String(), "denying a hostNetwork pod") || !strings.Contains(e.logs.String(), "module=deny-host-network") {
		t.Fatalf("the C policy's log line is missing:\n%s", e.logs)
	}
}

func TestLoadRefusals(t *testing.T) {
	e := newEngine(t, wasm.Limits{InitTimeout: 300 * time.Millisecond})
	other := e.load(t, wasm.Spec{Name: "echo", Wasm: wat(t, "echo"), Entrypoints: []string{"admit"}})
	cases := []struct {
		name    string
		wasm    []byte
		grants  []wasm.Grant
		kind    error
		mention []string
	}{
		{"garbage bytes", []byte("\x00asm garbage that is not a module"), nil, wasm.ErrInvalidModule, []string{"malformed", "version 1"}},
		{"not wasm at all", []byte("#!/bin/sh\nrm -rf /\n"), nil, wasm.ErrInvalidModule, nil},
		{"empty", nil, nil, wasm.ErrInvalidModule, []string{"empty"}},
		{"missing entry point", wat(t, "noexport"), nil, wasm.ErrMissingExport, []string{`"admit"`}},
		{"no exported memory", wat(t, "nomemory"), nil, wasm.ErrMissingExport, []string{"memory"}},
		{"ungranted import", wat(t, "ungranted"), nil, wasm.ErrUngrantedImport, []string{"holdfast.http_request", `"http" grant`}},
		{"ungranted import, other grants", wat(t, "ungranted"), []wasm.Grant{wasm.GrantTCP, wasm.GrantFile}, wasm.ErrUngrantedImport, []string{"holdfast.http_request"}},
		{"foreign import", wat(t, "foreignimport"), nil, wasm.ErrUngrantedImport, []string{"env.system"}},
		{"reserved import", wat(t, "reservedimport"), nil, wasm.ErrUngrantedImport, []string{"holdfast:runtime.checkpoint"}},
		{"unsupported ABI", wat(t, "abi2"), nil, wasm.ErrInvalidModule, []string{"ABI version 2"}},
		{"_initialize never returns", wat(t, "initloop"), nil, wasm.ErrTimeout, []string{"_initialize"}},
		{"command module", wat(t, "command"), nil, wasm.ErrInvalidModule, []string{"-buildmode=c-shared"}},
		{"initial memory over limit", wat(t, "bigmemory"), nil, wasm.ErrMemoryLimit, []string{"2048 pages"}},
		{"unknown grant", wat(t, "echo"), []wasm.Grant{"root"}, wasm.ErrInvalidModule, []string{"root"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			m, err := e.Load(context.Background(), wasm.Spec{Name: "bad", Wasm: tc.wasm, Grants: tc.grants, Entrypoints: []string{"admit"}})
			if m != nil {
				t.Fatal("a refused module was returned")
			}
			wantKind(t, err, tc.kind)
			for _, s := range tc.mention {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refusal took %s", d)
			}
			healthy(t, other, "admit", `{"still":"here"}`)
		})
	}
}

// With the grant, the same module that was refused loads.
func TestGrantedImportLoads(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	e.load(t, wasm.Spec{Name: "ungranted", Wasm: wat(t, "ungranted"), Grants: []wasm.Grant{wasm.GrantHTTP}, Entrypoints: []string{"admit"}})
}

func TestCallUnknownExport(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	m := e.load(t, wasm.Spec{Name: "echo", Wasm: wat(t, "echo")})
	_, err := m.Call(context.Background(), "mutate", []byte(`{}`))
	wantKind(t, err, wasm.ErrMissingExport)
	_, err = m.Call(context.Background(), "alloc", []byte(`{}`)) // wrong signature
	wantKind(t, err, wasm.ErrMissingExport)
}

// Instances are reused across calls, and a broken one is replaced by a fresh
// one: the counter module counts calls per instance.
func TestPoolReusesAndReplaces(t *testing.T) {
	e := newEngine(t, wasm.Limits{MaxInstances: 1})
	m := e.load(t, wasm.Spec{Name: "counter", Wasm: wat(t, "counter")})
	count := func() string {
		t.Helper()
		out, err := m.Call(context.Background(), "count", []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	for i := 1; i <= 5; i++ {
		if got, want := count(), fmt.Sprintf(`{"n":%d}`, i); got != want {
			t.Fatalf("call %d: %s, want %s (the instance was not reused)", i, got, want)
		}
	}
	_, err := m.Call(context.Background(), "trap", []byte(`{}`))
	wantKind(t, err, wasm.ErrTrap)
	if got := count(); got != `{"n":1}` {
		t.Fatalf("after a trap: %s, want a fresh instance", got)
	}
	if got := count(); got != `{"n":2}` {
		t.Fatalf("after a trap: %s, want the fresh instance reused", got)
	}
}

func TestConcurrentCalls(t *testing.T) {
	e := newEngine(t, wasm.Limits{MaxInstances: 2})
	m := e.load(t, wasm.Spec{Name: "echo", Wasm: wat(t, "echo"), Entrypoints: []string{"admit"}})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				in := fmt.Sprintf(`{"g":%d,"i":%d}`, g, i)
				out, err := m.Call(context.Background(), "admit", []byte(in))
				if err != nil || string(out) != in {
					errs <- fmt.Errorf("call %s: %q %v", in, out, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A call waiting for a free instance gives up at its deadline.
func TestCallWaitsForInstanceWithinDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c // held open, silent: the call waits in tcp_dial
		}
	}()
	p := ln.Addr().(*net.TCPAddr).Port
	e := newEngine(t, wasm.Limits{MaxInstances: 1, CallTimeout: time.Second})
	m := hostcall(t, e)
	done := make(chan error, 1)
	go func() {
		_, err := m.Call(context.Background(), "tcp", []byte(fmt.Sprintf(`{"address":"127.0.0.1:%d","readBytes":10}`, p)), wasm.WithNetwork("127.0.0.1", p))
		done <- err
	}()
	conn := <-accepted // the only instance is now busy
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = m.Call(ctx, "read", []byte(`{"path":"/x"}`))
	wantKind(t, err, wasm.ErrTimeout)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the waiting call took %s", d)
	}
	<-done // the first call ends at its own deadline, whatever its result
	healthy(t, m, "read", `{"path":"/x"}`)
}

func TestCancel(t *testing.T) {
	e := newEngine(t, wasm.Limits{CallTimeout: 10 * time.Second})
	m := e.load(t, wasm.Spec{Name: "hostile", Wasm: wat(t, "hostile")})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := m.Call(ctx, "loop", []byte(`{}`))
	wantKind(t, err, wasm.ErrCanceled)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("cancel took %s", d)
	}
	healthy(t, m, "ok", `{}`)
}

// Closing a module lets calls in flight finish on it; new calls are refused.
func TestCloseLetsInFlightCallsFinish(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted, reply := make(chan struct{}), make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		close(accepted)
		<-reply
		c.Write([]byte("late answer\n"))
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	e := newEngine(t, wasm.Limits{CallTimeout: 10 * time.Second})
	m := hostcall(t, e)
	result := make(chan error, 1)
	go func() {
		out, err := m.Call(context.Background(), "tcp", []byte(fmt.Sprintf(`{"address":"127.0.0.1:%d","readBytes":100,"readUntil":"\n"}`, port)), wasm.WithNetwork("127.0.0.1", port))
		if err == nil && !strings.Contains(string(out), "late answer") {
			err = fmt.Errorf("answer %s", out)
		}
		result <- err
	}()
	<-accepted // the call is in flight
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err = m.Call(context.Background(), "tcp", []byte(`{}`))
	wantKind(t, err, wasm.ErrClosed)
	close(reply)
	if err := <-result; err != nil {
		t.Fatalf("in-flight call: %v", err)
	}
}

func TestEngineClose(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	m := e.load(t, wasm.Spec{Name: "echo", Wasm: wat(t, "echo")})
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := m.Call(context.Background(), "admit", []byte(`{}`))
	wantKind(t, err, wasm.ErrClosed)
	_, err = e.Load(context.Background(), wasm.Spec{Name: "echo", Wasm: wat(t, "echo")})
	wantKind(t, err, wasm.ErrClosed)
}

// The compilation cache directory is filled, so that the next start does not
// recompile.
func TestCompilationCacheOnDisk(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		// skip-ok: not on this architecture
		t.Skip("wazero interprets on " + runtime.GOARCH + ": there is no compiled code to cache")
	}
	dir := t.TempDir()
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		e, err := wasm.NewEngine(ctx, wasm.NewConfig().WithCacheDir(dir))
		if err != nil {
			t.Fatal(err)
		}
		m, err := e.Load(ctx, wasm.Spec{Name: "echo", Wasm: wat(t, "echo")})
		if err != nil {
			t.Fatal(err)
		}
		healthy(t, m, "admit", `{}`)
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var files int
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files++
		}
		return nil
	})
	if files == 0 {
		t.Fatal("the compilation cache directory is empty")
	}
}

func TestInspect(t *testing.T) {
	e := newEngine(t, wasm.Limits{})
	info, err := e.Inspect(context.Background(), "hostcall.wasm", wat(t, "hostcall"))
	if err != nil {
		t.Fatal(err)
	}
	if info.ABIVersion != 1 || !strings.Contains(strings.Join(info.Imports, " "), "holdfast.http_request") {
		t.Fatalf("info = %+v", info)
	}
	// A version this host does not implement is described, and refused.
	info, err = e.Inspect(context.Background(), "abi2.wasm", wat(t, "abi2"))
	wantKind(t, err, wasm.ErrInvalidModule)
	if info.ABIVersion != 2 || !strings.Contains(err.Error(), "ABI version 2") {
		t.Fatalf("abi2: %+v %v", info, err)
	}
	_, err = e.Inspect(context.Background(), "foreignimport.wasm", wat(t, "foreignimport"))
	wantKind(t, err, wasm.ErrUngrantedImport)
	// Errors name the module as the caller did (its file), not "inspect".
	_, err = e.Inspect(context.Background(), "policies/garbage.wasm", []byte("garbage"))
	wantKind(t, err, wasm.ErrInvalidModule)
	if !strings.Contains(err.Error(), `module "policies/garbage.wasm"`) {
		t.Fatalf("error %q does not name the file", err)
	}
}

func TestErrorClassesAreDistinct(t *testing.T) {
	classes := []error{wasm.ErrInvalidModule, wasm.ErrMissingExport, wasm.ErrUngrantedImport, wasm.ErrTimeout, wasm.ErrCanceled,
		wasm.ErrMemoryLimit, wasm.ErrTrap, wasm.ErrBadPointer, wasm.ErrBadInput, wasm.ErrBadOutput, wasm.ErrOutputTooLarge, wasm.ErrLogFlood, wasm.ErrClosed}
	for _, c := range classes {
		err := error(&wasm.Error{Kind: c, Module: "m", Op: "admit"})
		for _, other := range classes {
			if errors.Is(err, other) != (c == other) {
				t.Errorf("errors.Is(%v, %v) = %v", c, other, !(c == other))
			}
		}
	}
}

// The engine rewrites modules (checkpoints, the stack budget): a function
// leaving by every way there is keeps its results and gives its stack
// budget back, or 400000 calls in one call would run out of stack.
func TestRewriteKeepsEveryExit(t *testing.T) {
	testRewrite(t, "exits")
}

// The rewrite keeps module shapes Go and clang rarely produce: tables and
// element segments of every kind, blocks with parameters, a start function,
// no imports or globals of its own.
func TestRewriteKeepsModuleShapes(t *testing.T) {
	testRewrite(t, "shapes")
}

func testRewrite(t *testing.T, name string) {
	e := newEngine(t, wasm.Limits{})
	m := e.load(t, wasm.Spec{Name: name, Wasm: wat(t, name), Entrypoints: []string{"admit"}})
	for range 3 {
		out, err := m.Call(context.Background(), "admit", []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != `{"ok":true}` {
			t.Fatalf("output %q", out)
		}
	}
}
