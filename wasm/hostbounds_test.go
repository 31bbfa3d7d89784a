package wasm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm"
)

// heapCost is what the agent's heap paid for f: every byte allocated while
// f ran (TotalAlloc, which counts garbage too and does not depend on when
// the collector runs), and the highest live heap sampled meanwhile above
// the heap before.
type heapCost struct {
	allocated, peak uint64
}

func (c heapCost) String() string {
	return fmt.Sprintf("%.2f MiB allocated, heap peak +%.2f MiB", float64(c.allocated)/(1<<20), float64(c.peak)/(1<<20))
}

func measureHeap(f func()) heapCost {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	live := func() uint64 { metrics.Read(sample); return sample[0].Value.Uint64() }
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	base := live()
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for {
			if v := live(); v > base && v-base > peak {
				peak = v - base
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	f()
	close(stop)
	wg.Wait()
	runtime.ReadMemStats(&after)
	return heapCost{allocated: after.TotalAlloc - before.TotalAlloc, peak: peak}
}

// TestHostAllocationBounded: a guest hands the host function calls as large
// as its memory (a request, a write to stdout, a log line, a million
// writes); what the host allocates for them is bounded by the policy's
// limits, not by the guest's memory, and each returns well within the call's
// deadline.
func TestHostAllocationBounded(t *testing.T) {
	e := newEngine(t, wasm.Limits{CallTimeout: 5 * time.Second})
	m := e.load(t, wasm.Spec{Name: "hostbloat", Wasm: wat(t, "hostbloat"), Grants: []wasm.Grant{wasm.GrantHTTP}})
	lim := m.Limits()
	healthy(t, m, "ok", `{}`)
	// What a call of the well-behaved export costs, plus room for the
	// test's own noise.
	const slack = 1 << 20
	cases := []struct {
		export string
		bound  uint64 // beyond slack
		check  func(t *testing.T, out []byte)
	}{
		{"bigrequest", 0, func(t *testing.T, out []byte) {
			if got := decode(t, out); got["code"] != "invalid" || !strings.Contains(fmt.Sprint(got["error"]), "over the limit") {
				t.Errorf("a request of 32 MiB: answer %s, want it refused as over the limit", out)
			}
		}},
		{"bigwrite", 0, nil},
		{"manywrites", 0, nil},
		{"biglog", uint64(lim.LogLineBytes) * 8, func(t *testing.T, _ []byte) {
			if !strings.Contains(e.logs.String(), "[truncated]") {
				t.Errorf("the 32 MiB line was not logged truncated")
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.export, func(t *testing.T) {
			var out []byte
			var err error
			start := time.Now()
			cost := measureHeap(func() { out, err = m.Call(context.Background(), tc.export, []byte(`{}`)) })
			took := time.Since(start)
			t.Logf("%s: %s, %s", tc.export, cost, took.Round(time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			if cost.allocated > tc.bound+slack {
				t.Errorf("%s cost the host %s, over the bound of %d KiB", tc.export, cost, (tc.bound+slack)>>10)
			}
			if took > 2*time.Second {
				t.Errorf("%s took %s", tc.export, took)
			}
			if tc.check != nil {
				tc.check(t, out)
			}
		})
	}
	// Sixteen such writes under a deadline of 200 ms: the writes fail
	// once it has passed, and the call ends.
	t.Run("manywrites16 under a deadline", func(t *testing.T) {
		quick := e.load(t, wasm.Spec{Name: "hostbloat-quick", Wasm: wat(t, "hostbloat"), Grants: []wasm.Grant{wasm.GrantHTTP}, Limits: wasm.Limits{CallTimeout: 200 * time.Millisecond}})
		start := time.Now()
		_, err := quick.Call(context.Background(), "manywrites16", []byte(`{}`))
		took := time.Since(start)
		t.Logf("manywrites16: %s (%v)", took.Round(time.Millisecond), err)
		if took > time.Second {
			t.Errorf("16 fd_writes of a million buffers held a call with a deadline of 200ms for %s", took)
		}
	})
}

// TestHostAnswersWithinLimit: a host function's answer is at most
// Limits.HostResponseBytes as JSON, also when what it read is made of
// characters JSON writes as six bytes each; what does not fit is cut and
// the answer says so.
func TestHostAnswersWithinLimit(t *testing.T) {
	const limit = 64 << 10
	payload := func(c string) string { return strings.Repeat(c, 60000) }
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, payload("<"))
	}))
	defer pod.Close()
	tcpPort := serveTCP(t, func(c net.Conn) { c.Write([]byte(payload("\x00"))) })
	rootfs := t.TempDir()
	if err := os.WriteFile(filepath.Join(rootfs, "ctl"), []byte(payload("\x01")), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, wasm.Limits{HostResponseBytes: limit, OutputBytes: 1 << 20})
	m := hostcall(t, e)
	cases := []struct {
		name, export, req, field, char string
		opts                           []wasm.CallOption
	}{
		{"http body of <", "http", `{"url":"` + pod.URL + `/"}`, "body", "<", []wasm.CallOption{wasm.WithNetwork("127.0.0.1", port(t, pod.URL))}},
		{"tcp bytes of NUL", "tcp", fmt.Sprintf(`{"address":"127.0.0.1:%d","readBytes":60000}`, tcpPort), "received", "\x00", []wasm.CallOption{wasm.WithNetwork("127.0.0.1", tcpPort)}},
		{"file of control characters", "read", `{"path":"/data/ctl"}`, "data", "\x01", []wasm.CallOption{wasm.WithFiles([]string{"/data"}, wasm.FileMount{GuestPath: "/data", HostPath: rootfs})}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := m.Call(context.Background(), tc.export, []byte(tc.req), tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) > limit {
				t.Errorf("answer of %d bytes, over the limit of %d", len(out), limit)
			}
			var got map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("answer %.200q: %v", out, err)
			}
			s, _ := got[tc.field].(string)
			if got["truncated"] != true || len(s) == 0 || strings.Trim(s, tc.char) != "" || len(s) > limit/6 {
				t.Errorf("answer %.200q: want %s cut to at most %d bytes of %q, marked truncated", out, tc.field, limit/6, tc.char)
			}
		})
	}
}
