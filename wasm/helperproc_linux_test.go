package wasm_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm"
)

// What would running guests in a helper process cost? The agent would
// re-exec its own binary as a child that loads the policies and serves
// calls over a unix socketpair, and kill it with SIGKILL when a call
// overruns its deadline plus a slack: the one backstop that no guest code
// can escape, since the kernel enforces it. These benchmarks measure the
// pieces of that design with the test binary re-executed as the child:
// a call's round trip (BenchmarkHelperRoundTrip) and a child's start and
// memory (BenchmarkHelperStart). RATIONALE.md has the figures.

// helperRoleEnv tells TestHelperProcess, run in a child, what to load.
const helperRoleEnv = "HOLDFAST_WASM_HELPER_ROLE"

// helperModulesEnv names the directory where the parent wrote the modules
// of helperRoles, as helperModulePath names them: the child reads them
// rather than building them again (a C build takes seconds).
const helperModulesEnv = "HOLDFAST_WASM_HELPER_MODULES"

func helperModulePath(dir, policy string) string {
	return filepath.Join(dir, strings.ReplaceAll(policy, "/", "_")+".wasm")
}

// writeHelperModules writes the modules of admitBenchCases to a directory
// for the children and returns it.
func writeHelperModules(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, bc := range admitBenchCases(t) {
		if err := os.WriteFile(helperModulePath(dir, bc.name), bc.wasm(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// helperRoles: "echo" loads nothing and answers every call with
// helperReply, "engine" starts an engine and loads no module, the others
// load the admission policies named, and answer calls with the first one's
// admit.
var helperRoles = map[string][]string{
	"echo":   nil,
	"engine": nil,
	"c":      {"c/deny-host-network"},
	"go":     {"go/allowed-registries"},
	"go+c":   {"go/allowed-registries", "c/deny-host-network"},
}

const helperReply = `{"allowed":true}`

// A frame is a 4-byte big-endian length, then a type byte and a payload.
const (
	frameReady = 'R' // child to parent: loaded, and one call made
	frameCall  = 'C' // payload: the input; reply: the output
	frameStats = 'S' // reply: the child's CPU time so far, in ns
	frameGC    = 'G' // the child returns what it can to the OS (debug.FreeOSMemory)
)

func writeFrame(w io.Writer, typ byte, payload []byte) error {
	buf := make([]byte, 5+len(payload))
	binary.BigEndian.PutUint32(buf, uint32(1+len(payload)))
	buf[4] = typ
	copy(buf[5:], payload)
	_, err := w.Write(buf)
	return err
}

func readFrame(r *bufio.Reader) (typ byte, payload []byte, err error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > 1<<20 {
		return 0, nil, fmt.Errorf("frame of %d bytes", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return body[0], body[1:], nil
}

// TestHelperProcess is the child of the helper-process benchmarks, not a
// test: it loads what its role says and serves frames on fd 3.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(helperRoleEnv)
	if role == "" {
		// Not a test of its own: the entry point of the child that
		// startHelper starts (os/exec's helper-process idiom).
		return
	}
	policies, ok := helperRoles[role]
	if !ok {
		t.Fatalf("no role %q", role)
	}
	conn, err := net.FileConn(os.NewFile(3, "socket"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	call := func(in []byte) ([]byte, error) { return []byte(helperReply), nil }
	if role != "echo" {
		e := newEngine(t, wasm.Limits{})
		settings := map[string]string{}
		for _, bc := range admitBenchCases(t) {
			settings[bc.name] = bc.settings
		}
		for i, name := range policies {
			module, err := os.ReadFile(helperModulePath(os.Getenv(helperModulesEnv), name))
			if err != nil {
				t.Fatal(err)
			}
			m := e.load(t, wasm.Spec{Name: name, Wasm: module, Entrypoints: []string{"admit"}})
			if _, err := m.Call(ctx, "admit", admissionInput(settings[name])); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				call = func(in []byte) ([]byte, error) { return m.Call(ctx, "admit", in) }
			}
		}
	}
	if err := writeFrame(conn, frameReady, nil); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	for {
		typ, payload, err := readFrame(r)
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var reply []byte
		switch typ {
		case frameCall:
			if reply, err = call(payload); err != nil {
				t.Fatal(err)
			}
		case frameStats:
			reply = strconv.AppendInt(nil, int64(processCPU()), 10)
		case frameGC:
			debug.FreeOSMemory()
		default:
			t.Fatalf("frame type %q", typ)
		}
		if err := writeFrame(conn, typ, reply); err != nil {
			t.Fatal(err)
		}
	}
}

// helper is a running child of TestHelperProcess.
type helper struct {
	cmd  *exec.Cmd
	conn net.Conn
	r    *bufio.Reader
}

// startHelper starts a child in role, with the modules in dir
// (writeHelperModules), and waits until it is ready.
func startHelper(t testing.TB, role, dir string) *helper {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	parentEnd, childEnd := os.NewFile(uintptr(fds[0]), "helper"), os.NewFile(uintptr(fds[1]), "agent")
	conn, err := net.FileConn(parentEnd)
	parentEnd.Close()
	if err != nil {
		childEnd.Close()
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperRoleEnv+"="+role, helperModulesEnv+"="+dir)
	cmd.ExtraFiles = []*os.File{childEnd}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	childEnd.Close()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, conn: conn, r: bufio.NewReader(conn)}
	if typ, _, err := readFrame(h.r); err != nil || typ != frameReady {
		h.kill()
		t.Fatalf("helper %s did not get ready: %q %v", role, typ, err)
	}
	return h
}

func (h *helper) roundTrip(t testing.TB, typ byte, payload []byte) []byte {
	if err := writeFrame(h.conn, typ, payload); err != nil {
		t.Fatal(err)
	}
	rtyp, reply, err := readFrame(h.r)
	if err != nil || rtyp != typ {
		t.Fatalf("reply %q to %q: %v", rtyp, typ, err)
	}
	return reply
}

func (h *helper) cpu(t testing.TB) time.Duration {
	n, err := strconv.ParseInt(string(h.roundTrip(t, frameStats, nil)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(n)
}

// kill ends the child as the agent would end one that overran a call's
// deadline, and returns how long the kill took until the child was reaped.
func (h *helper) kill() time.Duration {
	start := time.Now()
	_ = h.cmd.Process.Signal(syscall.SIGKILL)
	_ = h.cmd.Wait()
	took := time.Since(start)
	h.conn.Close()
	return took
}

// helperMemory is what a child holds, in KiB, from /proc/PID/smaps_rollup.
// Pss shares each page among the processes that map it: the binary's code,
// mapped by the agent too, counts half. Pss_Anon (the heap, the guests'
// memories, the compiled code) is the child's alone.
type helperMemory struct{ rss, pss, anon int64 }

func (h *helper) memory(t testing.TB) helperMemory {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", h.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	field := func(name string) int64 {
		for line := range strings.SplitSeq(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, name+":"); ok {
				n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err != nil {
					t.Fatalf("smaps_rollup: %s: %v", line, err)
				}
				return n
			}
		}
		t.Fatalf("no %s in smaps_rollup", name)
		return 0
	}
	return helperMemory{rss: field("Rss"), pss: field("Pss"), anon: field("Pss_Anon")}
}

// BenchmarkHelperRoundTrip measures a call to a helper process over a unix
// socketpair: a 2 KB admission input (admissionInput) out and the reply
// back. child=echo answers at once (the round trip alone); child=c and
// child=go run the admission policy (compare with BenchmarkAdmit, the same
// call in the agent's process). cpu-ns/op is the agent side's CPU,
// helper-cpu-ns/op the child's.
func BenchmarkHelperRoundTrip(b *testing.B) {
	in := admissionInput(`{"registries":["registry.local:5000","docker.io/library"]}`)
	dir := writeHelperModules(b)
	for _, role := range []string{"echo", "c", "go"} {
		h := startHelper(b, role, dir)
		b.Run("child="+role, func(b *testing.B) {
			h.roundTrip(b, frameCall, in)
			b.SetBytes(int64(len(in)))
			childCPU := h.cpu(b)
			b.ResetTimer()
			cpu := processCPU()
			for i := 0; i < b.N; i++ {
				h.roundTrip(b, frameCall, in)
			}
			reportCPU(b, cpu)
			b.StopTimer()
			b.ReportMetric(float64(h.cpu(b)-childCPU)/float64(b.N), "helper-cpu-ns/op")
		})
		h.kill()
	}
}

// BenchmarkHelperStart measures a helper process's start, until it has
// loaded its policies (from the compilation cache) and made one call each:
// what replacing a killed helper costs (ns/op). It reports the child's
// memory then (rss-KiB, pss-KiB, anon-KiB: see helperMemory), its anonymous
// memory again once it has returned what it can to the OS (idle-anon-KiB),
// the CPU time it took to get there (helper-cpu-ns/op) and how long the
// kill took until the child was reaped (kill-ns). Run it
// with -benchtime=Nx: each operation is a process.
func BenchmarkHelperStart(b *testing.B) {
	dir := writeHelperModules(b)
	for _, role := range []string{"echo", "engine", "c", "go", "go+c"} {
		b.Run("child="+role, func(b *testing.B) {
			startHelper(b, role, dir).kill() // fills the compilation cache if it is empty
			var sum, idle helperMemory
			var kill, childCPU time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				h := startHelper(b, role, dir)
				b.StopTimer()
				m := h.memory(b)
				h.roundTrip(b, frameGC, nil)
				im := h.memory(b)
				childCPU += h.cpu(b)
				sum.rss, sum.pss, sum.anon, idle.anon = sum.rss+m.rss, sum.pss+m.pss, sum.anon+m.anon, idle.anon+im.anon
				kill += h.kill()
				b.StartTimer()
			}
			n := float64(b.N)
			b.ReportMetric(float64(sum.rss)/n, "rss-KiB")
			b.ReportMetric(float64(sum.pss)/n, "pss-KiB")
			b.ReportMetric(float64(sum.anon)/n, "anon-KiB")
			b.ReportMetric(float64(idle.anon)/n, "idle-anon-KiB")
			b.ReportMetric(float64(kill.Nanoseconds())/n, "kill-ns")
			b.ReportMetric(float64(childCPU.Nanoseconds())/n, "helper-cpu-ns/op")
		})
	}
}
