package wasm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/holdfast-dev/holdfast/wasm"
)

// BenchmarkBackstop measures what wazero's WithCloseOnContextDone would cost
// on top of the checkpoints, as a backstop for anything the rewrite misses:
// the calls of BenchmarkAdmit, BenchmarkAdmitOPA's holdfast case and
// BenchmarkProbe's heartbeat-file policy, each on an engine as it is
// (wazeroclose=false) and on one with WithCloseOnContextDone
// (wazeroclose=true). The two sub-benchmarks of a policy run one after the
// other, so that a change in the machine's load affects both alike; compare
// them with benchstat -col /wazeroclose. RATIONALE.md has the figures.
func BenchmarkBackstop(b *testing.B) {
	engines := map[bool]*testEngine{
		false: newEngine(b, wasm.Limits{}),
		true:  newEngineWith(b, wasm.Limits{}, wasm.WithCloseOnContextDoneForTest),
	}
	type call struct {
		name   string
		spec   wasm.Spec
		export string
		input  []byte
		opts   []wasm.CallOption
	}
	var calls []call
	for _, bc := range admitBenchCases(b) {
		calls = append(calls, call{
			name:   "admit/" + bc.name,
			spec:   wasm.Spec{Name: bc.name, Wasm: bc.wasm(), Entrypoints: []string{"admit"}},
			export: "admit",
			input:  admissionInput(bc.settings),
		})
	}
	mod, data, input := opaBenchPolicy(b)
	calls = append(calls, call{
		name:   "opa/registries",
		spec:   wasm.Spec{Name: "opa", Wasm: mod, ABI: wasm.ABIOPA, Data: data, Entrypoints: []string{opaBenchEntrypoint}},
		export: opaBenchEntrypoint,
		input:  input,
	})
	rootfs := b.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "tmp"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "tmp/heartbeat"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	calls = append(calls, call{
		name:   "probe/go/heartbeat-file",
		spec:   wasm.Spec{Name: "heartbeat-file", Wasm: goModule(b, "policies/examples/probe/heartbeat-file"), Grants: []wasm.Grant{wasm.GrantFile, wasm.GrantClock}, Entrypoints: []string{"probe"}},
		export: "probe",
		input:  []byte(`{"pod":` + pod2KB + `,"container":"collector","podIP":"127.0.0.1","ports":[],"settings":{"path":"/tmp/heartbeat","maxAgeSeconds":3600}}`),
		opts:   []wasm.CallOption{wasm.WithFiles([]string{"/tmp"}, wasm.FileMount{GuestPath: "/", HostPath: rootfs})},
	})

	for _, c := range calls {
		for _, wz := range []bool{false, true} {
			name := fmt.Sprintf("call=%s/wazeroclose=%v", strings.ReplaceAll(c.name, "/", "-"), wz)
			var m *wasm.Module // loaded at the first run, so that -bench picks what it loads
			b.Run(name, func(b *testing.B) {
				if m == nil {
					m = engines[wz].load(b, c.spec)
				}
				ctx := context.Background()
				if _, err := m.Call(ctx, c.export, c.input, c.opts...); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(c.input)))
				b.ReportAllocs()
				b.ResetTimer()
				cpu := processCPU()
				for i := 0; i < b.N; i++ {
					if _, err := m.Call(ctx, c.export, c.input, c.opts...); err != nil {
						b.Fatal(err)
					}
				}
				reportCPU(b, cpu)
			})
		}
	}
}
