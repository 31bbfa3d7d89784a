package wasm_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
	"github.com/tetratelabs/wazero/api"
)

// What stops a guest that the checkpoint rewrite misses? These tests and
// benchmarks measure wazero's own backstop, RuntimeConfig
// WithCloseOnContextDone, on modules compiled as written (the rewrite
// bypassed) and on the rewritten ones; RATIONALE.md has the figures.

// sumKernel sums n, n-1, ... 1 in a loop: the tightest loop a guest can
// write, where a per-iteration cost shows undiluted.
const sumKernel = `(module
  (func (export "sum") (param $n i64) (result i64) (local $s i64)
    (block $done
      (loop $next
        (br_if $done (i64.eqz (local.get $n)))
        (local.set $s (i64.add (local.get $s) (local.get $n)))
        (local.set $n (i64.sub (local.get $n) (i64.const 1)))
        (br $next)))
    (local.get $s)))`

// runawayGuests never end on their own. "loop" spins in a loop; "tree
// recursion" has no loop at all: it calls itself twice per call, 2^60 calls
// at a stack depth of at most 60, so it never overflows its stack either.
var runawayGuests = map[string]string{
	"loop": `(module (func (export "run") (loop (br 0))))`,
	"tree recursion": `(module
  (func $f (param $n i32) (result i32)
    (if (result i32) (i32.lt_u (local.get $n) (i32.const 2))
      (then (local.get $n))
      (else (i32.add (call $f (i32.sub (local.get $n) (i32.const 1)))
                     (call $f (i32.sub (local.get $n) (i32.const 2)))))))
  (func (export "run") (drop (call $f (i32.const 60)))))`,
}

// backstopCase is one runaway guest on one engine configuration.
type backstopCase struct {
	guest string
	// rewrite compiles the guest rewritten with checkpoints, as Load does;
	// otherwise it is compiled as written, as if the rewrite had missed
	// everything.
	rewrite bool
	// wazeroClose turns on wazero's WithCloseOnContextDone.
	wazeroClose bool
}

func (c backstopCase) String() string {
	rw := "as-written"
	if c.rewrite {
		rw = "rewritten"
	}
	return fmt.Sprintf("%s/%s/wazeroclose=%v", strings.ReplaceAll(c.guest, " ", "-"), rw, c.wazeroClose)
}

// backstopDeadline is the call's deadline in TestRunawayGuestBackstops.
const backstopDeadline = 100 * time.Millisecond

// The child of TestRunawayGuestBackstops: it runs one runaway guest with
// a deadline of backstopDeadline, and a goroutine beside it that forces a
// garbage collection every 10 ms, as the agent's other goroutines need one
// (a collection stops every goroutine, and a goroutine running compiled
// guest code cannot be stopped). It reports on fd 3, each line prefixed
// with the time (Unix ns): "started", "gc" after each collection, "stopped
// <error>" when the call returns.
func TestRunawayGuestChild(t *testing.T) {
	spec := os.Getenv("HOLDFAST_RUNAWAY_GUEST")
	if spec == "" {
		// Not a test of its own: the entry point of the child that
		// runRunawayChild starts (os/exec's helper-process idiom).
		return
	}
	var c backstopCase
	for _, guest := range []string{"loop", "tree recursion"} {
		for _, rewrite := range []bool{false, true} {
			for _, wz := range []bool{false, true} {
				if cc := (backstopCase{guest, rewrite, wz}); cc.String() == spec {
					c = cc
				}
			}
		}
	}
	if c.guest == "" {
		t.Fatalf("no case %q", spec)
	}
	report := os.NewFile(3, "report")
	ctx := context.Background()
	cfg := wasm.NewConfig()
	if c.wazeroClose {
		cfg = wasm.WithCloseOnContextDoneForTest(cfg)
	}
	e, err := wasm.NewEngine(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := instantiateRaw(t, e, wasmtest.AssembleWAT(t, runawayGuests[c.guest]), c.rewrite).ExportedFunction("run")
	go func() {
		for {
			runtime.GC()
			fmt.Fprintln(report, time.Now().UnixNano(), "gc")
			time.Sleep(10 * time.Millisecond)
		}
	}()
	fmt.Fprintln(report, time.Now().UnixNano(), "started")
	cctx, cancel := context.WithTimeout(ctx, backstopDeadline)
	defer cancel()
	_, err = run.Call(cctx)
	msg, _, _ := strings.Cut(fmt.Sprint(err), "\n")
	fmt.Fprintln(report, time.Now().UnixNano(), "stopped", msg)
	// The parent kills the process once it has read this.
	select {}
}

// instantiateRaw instantiates b in e's runtime, as written or rewritten
// (Engine.InstantiateRawForTest).
func instantiateRaw(t testing.TB, e *wasm.Engine, b []byte, rewrite bool) api.Module {
	t.Helper()
	mod, err := e.InstantiateRawForTest(context.Background(), b, rewrite)
	if err != nil {
		t.Fatal(err)
	}
	return mod
}

// What each backstop does against a guest that runs away, measured in a
// child process (a guest that is never stopped cannot be stopped in this
// one): when the call ends after its deadline, and the longest wait for a
// garbage collection beside it. The test asserts only what must hold
// whatever the machine's load: the rewritten guests stop, and a loop under
// wazero's backstop stops; the times are logged, not asserted.
//
// The cases that are not stopped (the controls, compiled as written, and
// the hole in wazero's backstop) have nothing to assert: each spins a core
// for 2 s and shows that SIGKILL ends it. They are
// BenchmarkRunawayGuestControls, run when the figures of RATIONALE.md are
// regenerated.
func TestRunawayGuestBackstops(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child processes")
	}
	for _, c := range []backstopCase{
		{"loop", false, true},
		{"loop", true, false},
		{"loop", true, true},
		{"tree recursion", true, false},
	} {
		t.Run(c.String(), func(t *testing.T) {
			r := runRunawayChild(t, c, runawayWindow)
			if !r.stopped {
				t.Fatalf("the guest was not stopped %s after its %s deadline", runawayWindow, backstopDeadline)
			}
			t.Logf("stopped %s after the call began (deadline %s): %s; longest wait for a GC beside it: %s (%d GCs)",
				r.took.Round(time.Millisecond), backstopDeadline, r.err, r.longestGC.Round(time.Millisecond), r.gcs)
		})
	}
}

// runawayWindow is how long a guest that is not stopped is watched.
const runawayWindow = 2 * time.Second

// BenchmarkRunawayGuestControls runs the guests that nothing stops (the
// controls, compiled as written, and the hole in wazero's backstop: tree
// recursion has no loop header to check) once per iteration, and reports
// how long a collection beside them waited and how long SIGKILL took
// (RATIONALE.md, "What stops a guest the rewrite misses?"). Each iteration
// spins a core for runawayWindow: run it with -benchtime=1x.
func BenchmarkRunawayGuestControls(b *testing.B) {
	for _, c := range []backstopCase{
		{"loop", false, false},
		{"tree recursion", false, false},
		{"tree recursion", false, true},
	} {
		b.Run(c.String(), func(b *testing.B) {
			var longestGC, killed time.Duration
			for b.Loop() {
				r := runRunawayChild(b, c, runawayWindow)
				if r.stopped {
					b.Fatalf("the control was stopped after %s: %s", r.took, r.err)
				}
				longestGC, killed = max(longestGC, r.longestGC), max(killed, r.killed)
			}
			b.ReportMetric(float64(longestGC.Milliseconds()), "longest-gc-wait-ms")
			b.ReportMetric(float64(killed.Microseconds())/1000, "sigkill-ms")
		})
	}
}

type runawayResult struct {
	stopped   bool
	took      time.Duration
	err       string
	longestGC time.Duration // the longest time between two collections, or from the last to the end
	gcs       int
	killed    time.Duration // from SIGKILL until the child was reaped
}

// runRunawayChild runs TestRunawayGuestChild for c and watches it for up to
// window after the call begins; a child whose guest stopped is watched for
// another 100 ms of collections. Then it kills the child.
func runRunawayChild(t testing.TB, c backstopCase, window time.Duration) runawayResult {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunawayGuestChild$")
	cmd.Env = append(os.Environ(), "HOLDFAST_RUNAWAY_GUEST="+c.String())
	cmd.ExtraFiles = []*os.File{pw}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	kill := func() time.Duration {
		start := time.Now()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return time.Since(start)
	}
	defer func() {
		kill()
		pr.Close()
	}()
	type line struct {
		text string
		at   time.Time
	}
	lines := make(chan line)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(pr)
		for s.Scan() {
			// Times are the child's, so that a delay in reading them
			// here does not count.
			at, text, _ := strings.Cut(s.Text(), " ")
			ns, err := strconv.ParseInt(at, 10, 64)
			if err != nil {
				continue
			}
			lines <- line{text, time.Unix(0, ns)}
		}
	}()
	var (
		r       runawayResult
		start   time.Time
		lastGC  time.Time
		end     <-chan time.Time
		startup = time.After(60 * time.Second)
	)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the child exited early: %v", r)
			}
			switch {
			case l.text == "started":
				start, lastGC = l.at, l.at
				end = time.After(window)
			case l.text == "gc" && !start.IsZero():
				r.gcs++
				r.longestGC = max(r.longestGC, l.at.Sub(lastGC))
				lastGC = l.at
			case strings.HasPrefix(l.text, "stopped "):
				r.stopped, r.took, r.err = true, l.at.Sub(start), strings.TrimPrefix(l.text, "stopped ")
				end = time.After(100 * time.Millisecond)
			}
		case <-end:
			now := time.Now()
			r.longestGC = max(r.longestGC, now.Sub(lastGC))
			// The helper-process backstop: whatever the guest does, SIGKILL ends it.
			r.killed = kill()
			return r
		case <-startup:
			if start.IsZero() {
				t.Fatal("the child did not start its call within 60 s")
			}
		}
	}
}

// BenchmarkLoopKernel measures a call of sumKernel, the tightest loop, per
// iteration (n=100000) and as a call's fixed cost (n=0): compiled as written
// or rewritten with checkpoints, with wazero's WithCloseOnContextDone off or
// on. Each call has its own deadline, as Module.call gives one. Compare the
// rows with benchstat -col /wazeroclose.
func BenchmarkLoopKernel(b *testing.B) {
	ctx := context.Background()
	src := wasmtest.AssembleWAT(b, sumKernel)
	engines := map[bool]*wasm.Engine{}
	for _, wz := range []bool{false, true} {
		cfg := wasm.NewConfig()
		if wz {
			cfg = wasm.WithCloseOnContextDoneForTest(cfg)
		}
		e, err := wasm.NewEngine(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close(ctx)
		engines[wz] = e
	}
	for _, n := range []uint64{0, 100_000} {
		for _, rewrite := range []bool{false, true} {
			for _, wz := range []bool{false, true} {
				sum := instantiateRaw(b, engines[wz], src, rewrite).ExportedFunction("sum")
				name := fmt.Sprintf("n=%d/rewrite=%v/wazeroclose=%v", n, rewrite, wz)
				b.Run(name, func(b *testing.B) {
					b.ReportAllocs()
					cpu := processCPU()
					for b.Loop() {
						cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
						res, err := sum.Call(cctx, n)
						cancel()
						if err != nil || res[0] != n*(n+1)/2 {
							b.Fatalf("sum(%d) = %v, %v", n, res, err)
						}
					}
					used := processCPU() - cpu
					b.ReportMetric(float64(used)/float64(b.N), "cpu-ns/op")
					if n > 0 {
						b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/iter")
						b.ReportMetric(float64(used)/float64(b.N)/float64(n), "cpu-ns/iter")
					}
				})
			}
		}
	}
}
