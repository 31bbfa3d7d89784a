package logs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary act as the logger when run under LoggerName, as the holdfast
// binary does, so that the shim's protocol is exercised against a real process.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == LoggerName {
		os.Exit(Main(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

func TestParseArgs(t *testing.T) {
	want := Options{Path: "/p/ns_n_u/c/0.log", Root: "/p", MaxSize: 1024, MaxFiles: 3, MaxLine: 64}
	// The shim passes the query in map order: any order parses the same.
	orders := [][]string{
		{"path", want.Path, "root", "/p", "max-size", "1024", "max-files", "3", "max-line", "64"},
		{"max-line", "64", "max-files", "3", "root", "/p", "path", want.Path, "max-size", "1024"},
	}
	for _, args := range orders {
		got, err := ParseArgs(args)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("ParseArgs(%q) = %+v, %v; want %+v", args, got, err, want)
		}
	}
	var roundTrip []string
	for k, v := range want.Args() {
		roundTrip = append(roundTrip, k, v)
	}
	if got, err := ParseArgs(roundTrip); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Args does not parse back: %+v, %v", got, err)
	}
	for _, bad := range [][]string{
		{"path"},
		{"max-size", "1"},
		{"path", "/a", "path", "/b"},
		{"path", "/a", "colour", "red"},
		{"path", "/a", "max-size", "ten"},
		{"path", "/a", "max-size", "-1"},
		{"path", "/a", "max-line", "3"},
	} {
		if _, err := ParseArgs(bad); err == nil {
			t.Errorf("ParseArgs(%q) accepted", bad)
		}
	}
}

type pipes struct {
	outR, outW, errR, errW *os.File
}

func newPipes(t *testing.T) *pipes {
	t.Helper()
	p := &pipes{}
	var err error
	if p.outR, p.outW, err = os.Pipe(); err != nil {
		t.Fatal(err)
	}
	if p.errR, p.errW, err = os.Pipe(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, f := range []*os.File{p.outR, p.outW, p.errR, p.errW} {
			f.Close()
		}
	})
	return p
}

// criLines parses a log file into "STREAM TAG MESSAGE" lines, checking each timestamp.
func criLines(t *testing.T, content string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(content, "\n"), "\n") {
		if l == "" {
			continue
		}
		ts, rest, ok := strings.Cut(l, " ")
		if _, err := time.Parse(time.RFC3339Nano, ts); !ok || err != nil {
			t.Fatalf("line %q: bad timestamp: %v", l, err)
		}
		out = append(out, rest)
	}
	return out
}

func TestServeWritesBothStreams(t *testing.T) {
	root := t.TempDir()
	path := logPath(root)
	p := newPipes(t)
	readyCalls := 0
	done := make(chan error, 1)
	go func() {
		done <- Serve(context.Background(), Options{Path: path, Root: root}, p.outR, p.errR, func() error {
			readyCalls++
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("ready before the log file exists: %w", err)
			}
			return nil
		}, io.Discard)
	}()
	fmt.Fprint(p.outW, "out one\n")
	fmt.Fprint(p.errW, "err one\n")
	fmt.Fprint(p.outW, "out tail")
	p.outW.Close()
	p.errW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after both streams ended")
	}
	if readyCalls != 1 {
		t.Fatalf("ready called %d times", readyCalls)
	}
	got := criLines(t, readFile(t, path))
	want := map[string]bool{"stdout F out one": true, "stderr F err one": true, "stdout P out tail": true}
	if len(got) != len(want) {
		t.Fatalf("lines %q", got)
	}
	for _, l := range got {
		if !want[l] {
			t.Fatalf("unexpected line %q in %q", l, got)
		}
	}
}

// TestServeDrainsAfterStop: asked to stop while a writer still holds the pipe open, Serve
// takes what is buffered and returns within the drain bound.
func TestServeDrainsAfterStop(t *testing.T) {
	root := t.TempDir()
	path := logPath(root)
	p := newPipes(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Options{Path: path, Root: root, Drain: 300 * time.Millisecond}, p.outR, p.errR, func() error { return nil }, io.Discard)
	}()
	fmt.Fprint(p.outW, "before stop\n")
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the drain bound")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("drain took %s", d)
	}
	if got := criLines(t, readFile(t, path)); len(got) != 1 || got[0] != "stdout F before stop" {
		t.Fatalf("lines %q", got)
	}
}

// TestServeUnsafePathStillReady: a log file holdfast refuses to open does not keep the
// container from starting; its output is dropped.
func TestServeUnsafePathStillReady(t *testing.T) {
	root, host := t.TempDir(), hostDir(t)
	must(t, os.Symlink(host, filepath.Join(root, "default_web_uid-1")))
	p := newPipes(t)
	var diag bytes.Buffer
	ready := false
	done := make(chan error, 1)
	go func() {
		done <- Serve(context.Background(), Options{Path: logPath(root), Root: root}, p.outR, p.errR, func() error { ready = true; return nil }, &diag)
	}()
	fmt.Fprint(p.outW, "dropped\n")
	p.outW.Close()
	p.errW.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !ready {
		t.Fatal("ready not called")
	}
	if !strings.Contains(diag.String(), "unsafe log path") || !strings.Contains(diag.String(), "1 lines dropped") {
		t.Errorf("diagnostics %q", diag.String())
	}
	if got := readFile(t, filepath.Join(host, "0.log")); got != "host secret\n" {
		t.Errorf("host file changed: %q", got)
	}
}

// TestLoggerProcess runs the logger as containerd's shim does: a process named
// holdfast-logger, arguments as key value pairs, only CONTAINER_ID and CONTAINER_NAMESPACE in
// its environment, stdout and stderr pipes on fds 3 and 4, the readiness pipe on fd 5, SIGTERM
// to stop once the shim closed its ends.
func TestLoggerProcess(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), LoggerName)
	must(t, os.Symlink(exe, bin))
	root := t.TempDir()
	path := logPath(root)
	p := newPipes(t)
	readyR, readyW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer readyR.Close()
	opts := Options{Path: path, Root: root, MaxSize: 200, MaxFiles: 2}
	var args []string
	for k, v := range opts.Args() {
		args = append(args, k, v)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"CONTAINER_ID=c1", "CONTAINER_NAMESPACE=holdfast"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.ExtraFiles = []*os.File{p.outR, p.errR, readyW}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readyW.Close()
	p.outR.Close()
	p.errR.Close()
	b := make([]byte, 1)
	if n, err := readyR.Read(b); n != 1 || err != nil {
		t.Fatalf("readiness: read %d bytes, %v (stderr %q)", n, err, stderr.String())
	}
	for i := range 20 {
		fmt.Fprintf(p.outW, "out %02d\n", i)
		fmt.Fprintf(p.errW, "err %02d\n", i)
	}
	// The shim closes its write ends, then sends SIGTERM.
	p.outW.Close()
	p.errW.Close()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	select {
	case err := <-waitErr:
		if err != nil {
			t.Fatalf("logger exited with %v: %s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("logger did not exit after SIGTERM")
	}
	names := readDir(t, filepath.Dir(path))
	if len(names) != 2 {
		t.Fatalf("files %v: want the live file and one rotated (max-files 2)", names)
	}
	var last []string
	last = criLines(t, readFile(t, path))
	if len(last) == 0 || !strings.HasSuffix(last[len(last)-1], " F out 19") && !strings.HasSuffix(last[len(last)-1], " F err 19") {
		t.Fatalf("live file ends with %q", last)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() > 200 {
		t.Fatalf("live file %v, %v: larger than max-size", fi, err)
	}
}
