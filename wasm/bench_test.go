package wasm_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/holdfast-dev/holdfast/test/repo"
	"github.com/holdfast-dev/holdfast/test/testenv"
	"github.com/holdfast-dev/holdfast/wasm"
)

// pod2KB is a realistic pod of about 2 KB of JSON, as the agent sends it.
const pod2KB = `{"metadata":{"name":"sensor-gateway-7f9c","namespace":"edge","uid":"0b7c2f4e-2d7e-4b7a-9f1e-7c1d2a3b4c5d","labels":{"app":"sensor-gateway","tier":"edge","version":"1.4.2"},"annotations":{"probe.holdfast.dev/collector.readiness":"http-json","kubernetes.io/config.source":"file"}},"spec":{"nodeName":"gw-0042","restartPolicy":"Always","terminationGracePeriodSeconds":30,"securityContext":{"runAsNonRoot":true,"runAsUser":1000},"initContainers":[{"name":"migrate","image":"registry.local:5000/edge/migrate:1.4.2","command":["/migrate","--once"],"resources":{"limits":{"cpu":"200m","memory":"64Mi"}}}],"containers":[{"name":"collector","image":"registry.local:5000/edge/collector:1.4.2","args":["--listen=:8080","--buffer=/data/buffer","--upstream=https://ingest.example.com"],"ports":[{"name":"http","containerPort":8080,"protocol":"TCP"},{"name":"metrics","containerPort":9090,"protocol":"TCP"}],"env":[{"name":"SITE","value":"plant-7"},{"name":"LOG_LEVEL","value":"info"}],"resources":{"limits":{"cpu":"500m","memory":"256Mi"},"requests":{"cpu":"100m","memory":"128Mi"}},"volumeMounts":[{"name":"buffer","mountPath":"/data"}],"readinessProbe":{"exec":{"command":["holdfast-wasm-probe"]},"periodSeconds":10,"timeoutSeconds":1},"securityContext":{"allowPrivilegeEscalation":false,"readOnlyRootFilesystem":true,"capabilities":{"drop":["ALL"]}}},{"name":"modbus-bridge","image":"docker.io/library/modbus-bridge:2.1","ports":[{"containerPort":502,"protocol":"TCP"}],"resources":{"limits":{"cpu":"250m","memory":"64Mi"}},"securityContext":{"capabilities":{"add":["NET_BIND_SERVICE"],"drop":["ALL"]}}}],"volumes":[{"name":"buffer","emptyDir":{"sizeLimit":"512Mi"}},{"name":"serial","hostPath":{"path":"/dev/ttyUSB0","type":"CharDevice"}}],"tolerations":[{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute"}]},"status":{"phase":"Pending"}}`

func admissionInput(settings string) []byte {
	return []byte(`{"pod":` + pod2KB + `,"node":{"name":"gw-0042","labels":{"kubernetes.io/arch":"arm64"},"allocatable":{"cpu":"4","memory":"3800Mi","pods":"110"}},"settings":` + settings + `}`)
}

// admitBenchCase is an admission policy of the benchmarks and its settings.
type admitBenchCase struct {
	name     string
	wasm     func() []byte
	settings string
}

// admitBenchCases are the policies of BenchmarkAdmit (and BenchmarkBackstop).
func admitBenchCases(b testing.TB) []admitBenchCase {
	return []admitBenchCase{
		{"go/allowed-registries", func() []byte { return goModule(b, "policies/examples/admission/allowed-registries") }, `{"registries":["registry.local:5000","docker.io/library"]}`},
		{"go/resource-caps", func() []byte { return goModule(b, "policies/examples/admission/resource-caps") }, `{"maxCPU":"2","maxMemory":"1Gi"}`},
		{"c/deny-host-network", func() []byte { return cModule(b, "policies/examples/c/deny-host-network/policy.c") }, `{}`},
	}
}

func BenchmarkAdmit(b *testing.B) {
	e := newEngine(b, wasm.Limits{})
	for _, bc := range admitBenchCases(b) {
		b.Run(bc.name, func(b *testing.B) {
			m := e.load(b, wasm.Spec{Name: bc.name, Wasm: bc.wasm(), Entrypoints: []string{"admit"}})
			in := admissionInput(bc.settings)
			b.SetBytes(int64(len(in)))
			ctx := context.Background()
			if out, err := m.Call(ctx, "admit", in); err != nil || decode(b, out)["allowed"] != true {
				b.Fatalf("%s %v", out, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := processCPU()
			for i := 0; i < b.N; i++ {
				if _, err := m.Call(ctx, "admit", in); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu)
		})
	}
}

func BenchmarkProbe(b *testing.B) {
	e := newEngine(b, wasm.Limits{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"checks":{"db":{"status":"ok"}}}`)
	}))
	defer srv.Close()
	p := port(b, srv.URL)
	rootfs := b.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "tmp"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "tmp/heartbeat"), nil, 0o644)
	for _, bc := range []struct {
		name     string
		pkg      string
		grants   []wasm.Grant
		settings string
		opt      wasm.CallOption
	}{
		{"go/http-json", "policies/examples/probe/http-json", []wasm.Grant{wasm.GrantHTTP}, fmt.Sprintf(`{"port":%d,"field":"checks.db.status","equals":"ok"}`, p), wasm.WithNetwork("127.0.0.1", p)},
		{"go/heartbeat-file", "policies/examples/probe/heartbeat-file", []wasm.Grant{wasm.GrantFile, wasm.GrantClock}, `{"path":"/tmp/heartbeat","maxAgeSeconds":3600}`, wasm.WithFiles([]string{"/tmp"}, wasm.FileMount{GuestPath: "/", HostPath: rootfs})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := e.load(b, wasm.Spec{Name: bc.name, Wasm: goModule(b, bc.pkg), Grants: bc.grants, Entrypoints: []string{"probe"}})
			in := []byte(`{"pod":` + pod2KB + `,"container":"collector","podIP":"127.0.0.1","ports":[` + fmt.Sprint(p) + `],"settings":` + bc.settings + `}`)
			ctx := context.Background()
			if out, err := m.Call(ctx, "probe", in, bc.opt); err != nil || decode(b, out)["success"] != true {
				b.Fatalf("%s %v", out, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := processCPU()
			for i := 0; i < b.N; i++ {
				if _, err := m.Call(ctx, "probe", in, bc.opt); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu)
		})
	}
}

// BenchmarkColdStart measures what an agent restart costs per policy: a new
// engine, Load (compile, or fetch from the on-disk compilation cache, then
// instantiate one instance) and the first call.
func BenchmarkColdStart(b *testing.B) {
	module := goModule(b, "policies/examples/admission/allowed-registries")
	in := admissionInput(`{"registries":["registry.local:5000","docker.io/library"]}`)
	run := func(b *testing.B, cacheDir string) {
		ctx := context.Background()
		cfg := wasm.NewConfig()
		if cacheDir != "" {
			cfg = cfg.WithCacheDir(cacheDir)
		}
		e, err := wasm.NewEngine(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close(ctx)
		m, err := e.Load(ctx, wasm.Spec{Name: "allowed-registries", Wasm: module, Entrypoints: []string{"admit"}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.Call(ctx, "admit", in); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("from-cache", func(b *testing.B) {
		dir := b.TempDir()
		run(b, dir) // fill the cache
		b.ResetTimer()
		cpu := processCPU()
		for i := 0; i < b.N; i++ {
			run(b, dir)
		}
		reportCPU(b, cpu)
	})
	b.Run("compile", func(b *testing.B) {
		cpu := processCPU()
		for i := 0; i < b.N; i++ {
			run(b, "")
		}
		reportCPU(b, cpu)
	})
	// The Rego policy of BenchmarkAdmitOPA, from the compilation cache: an agent's start with it.
	b.Run("opa-from-cache", func(b *testing.B) {
		mod, data, input := opaBenchPolicy(b)
		dir := b.TempDir()
		opaRun := func() {
			ctx := context.Background()
			e, err := wasm.NewEngine(ctx, wasm.NewConfig().WithCacheDir(dir))
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close(ctx)
			m, err := e.Load(ctx, wasm.Spec{Name: "opa", Wasm: mod, ABI: wasm.ABIOPA, Data: data, Entrypoints: []string{opaBenchEntrypoint}})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := m.Call(ctx, opaBenchEntrypoint, input); err != nil {
				b.Fatal(err)
			}
		}
		opaRun() // fill the cache
		b.ResetTimer()
		cpu := processCPU()
		for i := 0; i < b.N; i++ {
			opaRun()
		}
		reportCPU(b, cpu)
	})
}

// opaBenchEntrypoint is the rule of wasm/testdata/opa/registries.rego the benchmarks evaluate.
const opaBenchEntrypoint = "holdfast/admission/deny"

// opaBenchPolicy compiles wasm/testdata/opa/registries.rego with opa build -t wasm and returns
// the module, its data document and the input (the AdmissionReview of pod2KB).
func opaBenchPolicy(b *testing.B) (module, data, input []byte) {
	dir := filepath.Join(repo.Root(b), "wasm", "testdata", "opa")
	read := func(name string) []byte {
		body, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			b.Fatal(err)
		}
		return body
	}
	data, input = read("data.json"), read("input.json")
	bundle := testenv.OPABundle(b, string(read("registries.rego")), string(data), opaBenchEntrypoint)
	return testenv.OPAModule(b, bundle), data, input
}

// BenchmarkAdmitOPA evaluates the allowed-registries rule written in Rego
// (testdata/opa/registries.rego), compiled by opa build -t wasm, on the
// AdmissionReview of pod2KB (testdata/opa/input.json) as the agent sends it.
// make bench runs OPA's own Go evaluator and Wasm engine on the same files
// (opa bench) beside it.
func BenchmarkAdmitOPA(b *testing.B) {
	e := newEngine(b, wasm.Limits{})
	mod, data, input := opaBenchPolicy(b)
	m := e.load(b, wasm.Spec{Name: "opa", Wasm: mod, ABI: wasm.ABIOPA, Data: data, Entrypoints: []string{opaBenchEntrypoint}})
	const entrypoint = opaBenchEntrypoint
	b.Run("holdfast", func(b *testing.B) {
		b.SetBytes(int64(len(input)))
		ctx := context.Background()
		if out, err := m.Call(ctx, entrypoint, input); err != nil || string(out) != `[{"result":[]}]` {
			b.Fatalf("%s %v", out, err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		cpu := processCPU()
		for i := 0; i < b.N; i++ {
			if _, err := m.Call(ctx, entrypoint, input); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu)
	})
}
