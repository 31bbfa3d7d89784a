package policy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/holdfast-dev/holdfast/agent/metrics"
	"github.com/holdfast-dev/holdfast/agent/metrics/metricstest"
	"github.com/holdfast-dev/holdfast/wasm"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

type fixture struct {
	t   *testing.T
	dir string
	m   *Manager
}

func newFixture(t *testing.T) *fixture {
	return &fixture{t: t, dir: t.TempDir()}
}

func (f *fixture) module(name string, b []byte) {
	f.t.Helper()
	// Write then rename, as an operator's tooling should.
	tmp := filepath.Join(f.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(f.dir, name)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) wat(name string) []byte {
	return wasmtest.BuildWAT(f.t, "agent/policy/testdata/"+name+".wat")
}

func (f *fixture) config(policies string) {
	f.t.Helper()
	body := "apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\npolicies:\n" + policies
	if err := os.WriteFile(filepath.Join(f.dir, ConfigFileName), []byte(body), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) open() *Manager {
	f.t.Helper()
	m, err := Open(context.Background(), Options{Dir: f.dir, CacheDir: wasmtest.CacheDir(f.t, "wazero"), ReloadDelay: 50 * time.Millisecond})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { m.Close(context.Background()) })
	f.m = m
	return m
}

func pod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "edge", UID: "u1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "nginx:1.27",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}},
		}}},
	}
}

var node = NodeInfo{Name: "gw-1", Labels: map[string]string{"site": "plant-7"}, Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}}

func TestAdmit(t *testing.T) {
	f := newFixture(t)
	f.module("allow.wasm", f.wat("allow"))
	f.module("deny.wasm", f.wat("deny"))
	f.module("deny-badreason.wasm", f.wat("deny-badreason"))
	f.module("trap.wasm", f.wat("trap"))
	f.module("notadecision.wasm", f.wat("notadecision"))
	f.module("deny-escapes.wasm", f.wat("deny-escapes"))
	ctx := context.Background()

	cases := []struct {
		name     string
		config   string
		allowed  bool
		reason   string
		policy   string
		message  []string
		warnings int
	}{
		{"no policies", "", true, "", "", nil, 0},
		{"allow", "- {name: allow, kind: admission, module: allow.wasm}\n", true, "", "", nil, 1},
		{"deny", "- {name: allow, kind: admission, module: allow.wasm}\n- {name: deny, kind: admission, module: deny.wasm}\n",
			false, "NotOnThisNode", "deny", []string{`policy "deny"`, "sha256:", "pods of this kind do not run here"}, 1},
		{"first denial wins", "- {name: deny, kind: admission, module: deny.wasm}\n- {name: trap, kind: admission, module: trap.wasm}\n",
			false, "NotOnThisNode", "deny", nil, 0},
		{"guest text escaped", "- {name: esc, kind: admission, module: deny-escapes.wasm}\n", false, ReasonDenied, "esc", []string{`\x1b[31mred\x1b[0m\nfake: line`}, 0},
		{"invalid reason replaced", "- {name: bad, kind: admission, module: deny-badreason.wasm}\n", false, ReasonDenied, "bad", []string{"nope"}, 0},
		{"trap, Fail", "- {name: trap, kind: admission, module: trap.wasm}\n", false, ReasonError, "trap", []string{`policy "trap"`, "failurePolicy is Fail", "unreachable"}, 0},
		{"trap, Ignore", "- {name: trap, kind: admission, module: trap.wasm, failurePolicy: Ignore}\n- {name: allow, kind: admission, module: allow.wasm}\n", true, "", "", nil, 2},
		{"not a decision, Fail", "- {name: weird, kind: admission, module: notadecision.wasm}\n", false, ReasonError, "weird", []string{"not an admission decision"}, 0},
		{"module missing, Fail", "- {name: ghost, kind: admission, module: ghost.wasm}\n", false, ReasonError, "ghost", []string{"not loaded", "ghost.wasm"}, 0},
		{"module missing, Ignore", "- {name: ghost, kind: admission, module: ghost.wasm, failurePolicy: Ignore}\n", true, "", "", nil, 1},
		{"probe policies are not asked", "- {name: p, kind: probe, module: trap.wasm}\n", true, "", "", nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.config(tc.config)
			if f.m == nil {
				f.open()
			} else {
				f.m.Reload(ctx) // errors are part of the cases
			}
			d := f.m.Admit(ctx, pod(), node)
			if d.Allowed != tc.allowed || d.Reason != tc.reason || d.Policy != tc.policy {
				t.Fatalf("decision = %+v", d)
			}
			for _, s := range tc.message {
				if !strings.Contains(d.Message, s) {
					t.Errorf("message %q does not mention %q", d.Message, s)
				}
			}
			if i := strings.IndexFunc(d.Message, unicode.IsControl); i >= 0 {
				t.Errorf("message %q holds a control character at %d", d.Message, i)
			}
			if len(d.Warnings) != tc.warnings {
				t.Errorf("warnings = %q", d.Warnings)
			}
		})
	}
}

func TestReload(t *testing.T) {
	f := newFixture(t)
	f.module("gate.wasm", f.wat("deny"))
	f.module("other.wasm", f.wat("allow"))
	f.config("- {name: gate, kind: admission, module: gate.wasm}\n- {name: other, kind: admission, module: other.wasm}\n")
	m := f.open()
	ctx := context.Background()
	denyDigest := wasm.Digest(f.wat("deny"))
	if d := m.Admit(ctx, pod(), node); d.Allowed || d.Digest != denyDigest {
		t.Fatalf("before: %+v", d)
	}
	status := func(name string) Status {
		st, _ := m.Status()
		for _, s := range st {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no status for %s", name)
		return Status{}
	}
	otherLoadedAt := status("other").LoadedAt

	// The module changes: the policy reloads, the other is untouched.
	f.module("gate.wasm", f.wat("allow"))
	if err := m.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if d := m.Admit(ctx, pod(), node); !d.Allowed {
		t.Fatalf("after the module changed: %+v", d)
	}
	if s := status("other"); !s.LoadedAt.Equal(otherLoadedAt) {
		t.Fatal("an unchanged policy was reloaded")
	}

	// Garbage replaces the module: the old one keeps serving, the error is reported.
	f.module("gate.wasm", []byte("\x00asm\x01\x00\x00\x00 this is not a module"))
	err := m.Reload(ctx)
	if !errors.Is(err, wasm.ErrInvalidModule) {
		t.Fatalf("reload of garbage: %v", err)
	}
	if d := m.Admit(ctx, pod(), node); !d.Allowed {
		t.Fatalf("after garbage: %+v", d)
	}
	if s := status("gate"); !s.Loaded || s.Error == "" || s.Digest != wasm.Digest(f.wat("allow")) {
		t.Fatalf("status after garbage: %+v", s)
	}

	// A broken configuration file keeps everything.
	os.WriteFile(filepath.Join(f.dir, ConfigFileName), []byte("policies: [ {name: "), 0o644)
	if err := m.Reload(ctx); err == nil {
		t.Fatal("a broken configuration reloaded")
	}
	if _, cerr := m.Status(); cerr == nil {
		t.Fatal("the configuration error is not reported")
	}
	if d := m.Admit(ctx, pod(), node); !d.Allowed || len(d.Warnings) != 2 {
		t.Fatalf("after a broken configuration: %+v", d)
	}

	// A policy removed from the file stops judging.
	f.module("gate.wasm", f.wat("deny"))
	f.config("- {name: gate, kind: admission, module: gate.wasm}\n")
	if err := m.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if d := m.Admit(ctx, pod(), node); d.Allowed || len(d.Warnings) != 0 {
		t.Fatalf("after removing other: %+v", d)
	}
}

// Open refuses a broken configuration file but not a broken module.
func TestOpen(t *testing.T) {
	f := newFixture(t)
	os.WriteFile(filepath.Join(f.dir, ConfigFileName), []byte("apiVersion: holdfast.dev/v1alpha1\nkind: Nope\n"), 0o644)
	if _, err := Open(context.Background(), Options{Dir: f.dir}); err == nil {
		t.Fatal("Open accepted a broken configuration")
	}
	f.config("- {name: ghost, kind: admission, module: ghost.wasm}\n")
	m := f.open()
	st, cerr := m.Status()
	if cerr != nil || len(st) != 1 || st[0].Loaded || !strings.Contains(st[0].Error, "ghost.wasm") {
		t.Fatalf("status = %+v, %v", st, cerr)
	}
	// An empty directory is no policies.
	empty := t.TempDir()
	m2, err := Open(context.Background(), Options{Dir: empty})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close(context.Background())
	if d := m2.Admit(context.Background(), pod(), node); !d.Allowed {
		t.Fatalf("no policies: %+v", d)
	}
}

// Run reloads when files change, without a call to Reload.
func TestWatch(t *testing.T) {
	f := newFixture(t)
	f.module("gate.wasm", f.wat("deny"))
	f.config("- {name: gate, kind: admission, module: gate.wasm}\n")
	m := f.open()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// The watcher may not be watching yet when a file first changes, so
	// each change is repeated until it is seen (no sleep to guess when).
	waitFor := func(what string, change func(), cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			change()
			poll := time.Now().Add(500 * time.Millisecond)
			for time.Now().Before(poll) {
				if cond() {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	allow, trap := f.wat("allow"), f.wat("trap")
	waitFor("the new module", func() { f.module("gate.wasm", allow) },
		func() bool { return m.Admit(context.Background(), pod(), node).Allowed })
	waitFor("the new policy", func() {
		f.module("trap.wasm", trap)
		f.config("- {name: gate, kind: admission, module: gate.wasm}\n- {name: trap, kind: admission, module: trap.wasm}\n")
	}, func() bool { return m.Admit(context.Background(), pod(), node).Reason == ReasonError })
}

// While reloads swap modules, concurrent calls never fail for it.
func TestReloadUnderLoad(t *testing.T) {
	f := newFixture(t)
	allow, deny := f.wat("allow"), f.wat("deny")
	f.module("gate.wasm", allow)
	f.config("- {name: gate, kind: admission, module: gate.wasm}\n")
	m := f.open()
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d := m.Admit(ctx, pod(), node)
				if d.Reason == ReasonError {
					errs <- d.Message
					return
				}
			}
		}()
	}
	for i := 0; i < 20; i++ {
		if i%2 == 0 {
			f.module("gate.wasm", deny)
		} else {
			f.module("gate.wasm", allow)
		}
		if err := m.Reload(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestProbe(t *testing.T) {
	f := newFixture(t)
	f.module("ok.wasm", f.wat("probe-ok"))
	f.module("fail.wasm", f.wat("probe-fail"))
	f.module("trap.wasm", f.wat("trap"))
	f.module("allow.wasm", f.wat("allow"))
	f.config(`- {name: ok, kind: probe, module: ok.wasm}
- {name: fail, kind: probe, module: fail.wasm}
- {name: trap, kind: probe, module: trap.wasm}
- {name: trap-ignored, kind: probe, module: trap.wasm, failurePolicy: Ignore}
- {name: gate, kind: admission, module: allow.wasm}
`)
	m := f.open()
	target := ProbeTarget{Pod: pod(), Container: "app", PodIP: "10.88.0.9", Ports: []int32{8080}}
	cases := []struct {
		policy  string
		success bool
		message string
		err     bool
	}{
		{"ok", true, "all good", false},
		{"fail", false, "db down", false},
		{"trap", false, "unreachable", true},
		{"trap-ignored", true, "ignored", false},
		{"gate", false, "", true},
		{"missing", false, "", true},
	}
	for _, tc := range cases {
		ok, msg, err := m.Probe(context.Background(), tc.policy, target)
		if ok != tc.success || (err != nil) != tc.err || !strings.Contains(msg, tc.message) {
			t.Errorf("%s: %v %q %v", tc.policy, ok, msg, err)
		}
	}
}

// The example probe policy checks a real HTTP endpoint through the adapter;
// the pod's IP and ports are the only reachable targets.
func TestProbeHTTPJSONExample(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go policy")
	}
	status := "starting"
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, `{"status":%q}`, status)
	}))
	defer srv.Close()
	_, portStr, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	var port int32
	fmt.Sscan(portStr, &port)

	f := newFixture(t)
	f.module("http-json.wasm", wasmtest.BuildGo(t, "policies/examples/probe/http-json"))
	f.config(fmt.Sprintf("- {name: web, kind: probe, module: http-json.wasm, grants: {http: true}, settings: {port: %d, field: status, equals: ok}}\n", port))
	m := f.open()
	target := ProbeTarget{Pod: pod(), Container: "app", PodIP: "127.0.0.1", Ports: []int32{port}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // the probe's timeoutSeconds
	defer cancel()
	if ok, msg, err := m.Probe(ctx, "web", target); ok || err != nil || !strings.Contains(msg, `"starting"`) {
		t.Fatalf("starting: %v %q %v", ok, msg, err)
	}
	mu.Lock()
	status = "ok"
	mu.Unlock()
	if ok, msg, err := m.Probe(ctx, "web", target); !ok || err != nil {
		t.Fatalf("ok: %v %q %v", ok, msg, err)
	}
	target.Ports = []int32{port + 1}
	if ok, msg, _ := m.Probe(ctx, "web", target); ok || !strings.Contains(msg, "not among the targets") {
		t.Fatalf("undeclared port: %v %q", ok, msg)
	}
}

// The example configuration loads with the example modules and judges pods.
func TestExampleConfigEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the Go examples")
	}
	f := newFixture(t)
	for _, ex := range []string{"admission/allowed-registries", "admission/no-privileged-or-hostpath", "admission/resource-caps",
		"probe/http-json", "probe/tcp-request-response", "probe/heartbeat-file"} {
		f.module(filepath.Base(ex)+".wasm", wasmtest.BuildGo(t, "policies/examples/"+ex))
	}
	b, err := os.ReadFile("../../policies/examples/policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f.module(ConfigFileName, b)
	m := f.open()
	st, cerr := m.Status()
	if cerr != nil {
		t.Fatal(cerr)
	}
	for _, s := range st {
		if !s.Loaded || s.Error != "" {
			t.Fatalf("%s: %+v", s.Name, s)
		}
	}
	ctx := context.Background()
	p := pod()
	if d := m.Admit(ctx, p, node); !d.Allowed {
		t.Fatalf("plain pod: %+v", d)
	}
	priv := true
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &priv}
	if d := m.Admit(ctx, p, node); d.Allowed || d.Policy != "no-privileged-or-hostpath" || d.Reason != "Privileged" {
		t.Fatalf("privileged pod: %+v", d)
	}
	p = pod()
	p.Spec.Containers[0].Image = "quay.io/someone/app:1"
	if d := m.Admit(ctx, p, node); d.Allowed || d.Policy != "allowed-registries" {
		t.Fatalf("foreign image: %+v", d)
	}

	// The heartbeat probe reads the container's root filesystem.
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "tmp"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "tmp/heartbeat"), nil, 0o644)
	target := ProbeTarget{Pod: pod(), Container: "app", PodIP: "127.0.0.1", RootFS: rootfs}
	if ok, msg, err := m.Probe(ctx, "worker-heartbeat", target); !ok || err != nil {
		t.Fatalf("fresh heartbeat: %v %q %v", ok, msg, err)
	}
	old := time.Now().Add(-time.Minute)
	os.Chtimes(filepath.Join(rootfs, "tmp/heartbeat"), old, old)
	if ok, msg, err := m.Probe(ctx, "worker-heartbeat", target); ok || err != nil || !strings.Contains(msg, "more than 30s") {
		t.Fatalf("stale heartbeat: %v %q %v", ok, msg, err)
	}
}

// TestEvaluationMetrics: each evaluation is counted by policy, kind and result, and timed.
func TestEvaluationMetrics(t *testing.T) {
	f := newFixture(t)
	f.module("allow.wasm", f.wat("allow"))
	f.module("deny.wasm", f.wat("deny"))
	f.module("trap.wasm", f.wat("trap"))
	f.module("ok.wasm", f.wat("probe-ok"))
	f.module("fail.wasm", f.wat("probe-fail"))
	f.config(`- {name: trap, kind: admission, module: trap.wasm, failurePolicy: Ignore}
- {name: allow, kind: admission, module: allow.wasm}
- {name: deny, kind: admission, module: deny.wasm}
- {name: ok, kind: probe, module: ok.wasm}
- {name: fail, kind: probe, module: fail.wasm}
`)
	met := metrics.New()
	ctx := context.Background()
	m, err := Open(ctx, Options{Dir: f.dir, CacheDir: wasmtest.CacheDir(t, "wazero"), Metrics: met})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	for range 2 {
		if d := m.Admit(ctx, pod(), node); d.Allowed {
			t.Fatalf("admitted: %+v", d)
		}
	}
	target := ProbeTarget{Pod: pod(), Container: "app"}
	m.Probe(ctx, "ok", target)
	m.Probe(ctx, "fail", target)

	fams := metricstest.Scrape(t, met.Handler())
	for _, c := range []struct {
		policy, kind, result string
		want                 float64
	}{
		{"trap", "admission", "error", 2},
		{"allow", "admission", "allowed", 2},
		{"deny", "admission", "denied", 2},
		{"ok", "probe", "success", 1},
		{"fail", "probe", "failure", 1},
	} {
		if got, _ := fams.Value("holdfast_policy_evaluations_total", "policy", c.policy, "kind", c.kind, "result", c.result); got != c.want {
			t.Errorf("evaluations of %s (%s) with result %s: %v, want %v", c.policy, c.kind, c.result, got, c.want)
		}
	}
	if got, _ := fams.Value("holdfast_policy_evaluation_duration_seconds", "policy", "deny", "kind", "admission"); got != 2 {
		t.Errorf("timed evaluations of deny: %v, want 2", got)
	}
}
