package containerd_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/runtime/containerd"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// TestExec runs commands in a real container through a real containerd: exit codes, output
// capture and its limit, the container's process spec, timeouts that kill, and no exec
// process left behind.
func TestExec(t *testing.T) {
	cd := testenv.StartContainerd(t, testenv.ContainerdOptions{})
	ctx := context.Background()
	const ns = "holdfast-exec"
	cd.ImportTestImages(ctx, ns)
	rt, err := containerd.Connect(ctx, cd.Address, ns, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	id, err := rt.CreateContainer(ctx, runtime.ContainerConfig{
		PodUID: "pod-exec", PodName: "exec", PodNamespace: "default", Name: "app",
		Image: testenv.BusyboxImage, Command: []string{"sleep", "3600"},
		Env: []string{"GREETING=hello"}, WorkingDir: "/tmp", Hostname: "exec",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	// processes lists the container's processes other than its init.
	processes := func() int {
		t.Helper()
		nctx := namespaces.WithNamespace(ctx, ns)
		c, err := cd.Client.LoadContainer(nctx, id)
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.Task(nctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := task.Pids(nctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(pids) - 1
	}

	t.Run("exit code and both streams", func(t *testing.T) {
		res, err := rt.Exec(ctx, id, []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, runtime.ExecOptions{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 3 || !strings.Contains(string(res.Output), "out\n") || !strings.Contains(string(res.Output), "err\n") || res.Truncated {
			t.Errorf("result %+v (%q)", res, res.Output)
		}
	})
	// A command may run longer than the clean-up bound, interactive or not: the bound is for
	// the clean-up alone (every exec, a shell of kubectl exec -it included, ended after it
	// with "context deadline exceeded").
	t.Run("longer than the clean-up bound", func(t *testing.T) {
		defer containerd.SetExecCleanupTimeout(time.Second)()
		res, err := rt.Exec(ctx, id, []string{"sh", "-c", "sleep 2; echo done"}, runtime.ExecOptions{Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 || string(res.Output) != "done\n" {
			t.Errorf("Exec: %+v (%q), %v", res, res.Output, err)
		}
		var out, errOut strings.Builder
		code, err := rt.ExecStream(ctx, id, []string{"sh", "-c", "sleep 2; echo done"}, runtime.ExecStreams{Stdout: &out, Stderr: &errOut})
		if err != nil || code != 0 || out.String() != "done\n" {
			t.Errorf("ExecStream: exit %d (%q), %v", code, out.String(), err)
		}
	})
	t.Run("the container's env and working directory", func(t *testing.T) {
		res, err := rt.Exec(ctx, id, []string{"sh", "-c", "echo $GREETING; pwd"}, runtime.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || string(res.Output) != "hello\n/tmp\n" {
			t.Errorf("result %+v (%q)", res, res.Output)
		}
	})
	t.Run("output limit", func(t *testing.T) {
		res, err := rt.Exec(ctx, id, []string{"sh", "-c", "yes | head -c 100000"}, runtime.ExecOptions{OutputLimit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Output) != 1000 || !res.Truncated || res.ExitCode != 0 {
			t.Errorf("%d bytes, truncated %v, exit %d", len(res.Output), res.Truncated, res.ExitCode)
		}
		res, err = rt.Exec(ctx, id, []string{"sh", "-c", "yes | head -c 100000"}, runtime.ExecOptions{})
		if err != nil || len(res.Output) != runtime.DefaultExecOutputLimit {
			t.Errorf("%d bytes (%v), want the default limit %d", len(res.Output), err, runtime.DefaultExecOutputLimit)
		}
	})
	t.Run("timeout kills", func(t *testing.T) {
		start := time.Now()
		_, err := rt.Exec(ctx, id, []string{"sleep", "30"}, runtime.ExecOptions{Timeout: 500 * time.Millisecond})
		if !errors.Is(err, runtime.ErrExecTimeout) || !strings.Contains(err.Error(), `"sleep 30" timed out after 500ms`) {
			t.Fatalf("err %v, want runtime.ErrExecTimeout", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %s", d)
		}
		testenv.Eventually(t, 5*time.Second, "the timed-out process gone", func() error {
			if n := processes(); n != 0 {
				return errors.New("exec process still in the container")
			}
			return nil
		})
		// A ctx deadline is a timeout too.
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if _, err := rt.Exec(dctx, id, []string{"sleep", "30"}, runtime.ExecOptions{}); !errors.Is(err, runtime.ErrExecTimeout) {
			t.Errorf("err %v, want runtime.ErrExecTimeout", err)
		}
	})
	t.Run("cancellation is not a timeout", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(300*time.Millisecond, cancel)
		_, err := rt.Exec(cctx, id, []string{"sleep", "30"}, runtime.ExecOptions{Timeout: time.Minute})
		if !errors.Is(err, context.Canceled) || errors.Is(err, runtime.ErrExecTimeout) {
			t.Errorf("err %v, want context.Canceled", err)
		}
		testenv.Eventually(t, 5*time.Second, "the cancelled process gone", func() error {
			if n := processes(); n != 0 {
				return errors.New("exec process still in the container")
			}
			return nil
		})
	})
	t.Run("missing executable", func(t *testing.T) {
		res, err := rt.Exec(ctx, id, []string{"/no/such/probe"}, runtime.ExecOptions{Timeout: 10 * time.Second})
		// runc refuses to start it; older runtimes start it and report 127.
		t.Logf("result %+v err %v", res, err)
		if !errors.Is(err, runtime.ErrExecStart) && !(err == nil && res.ExitCode == 127) {
			t.Errorf("result %+v err %v, want runtime.ErrExecStart", res, err)
		}
	})
	t.Run("a background child does not hold Exec", func(t *testing.T) {
		start := time.Now()
		res, err := rt.Exec(ctx, id, []string{"sh", "-c", "sleep 30 & echo started"}, runtime.ExecOptions{Timeout: 10 * time.Second})
		if err != nil || res.ExitCode != 0 || string(res.Output) != "started\n" {
			t.Errorf("result %+v (%q) err %v", res, res.Output, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %s: waited for the background child's stdout", d)
		}
	})
	// A terminal command starts on the client's size, even when the size comes a moment after
	// the request (kubectl sends it on its own stream once the streams are up): a `stty size`
	// typed at once used to see 0x0 and fail ("stty: standard input").
	t.Run("terminal of the client's size from the start", func(t *testing.T) {
		sizes := make(chan runtime.TerminalSize)
		sent := make(chan struct{})
		go func() { // ends after one send or when ExecStream gave up waiting
			defer close(sent)
			time.Sleep(300 * time.Millisecond)
			select {
			case sizes <- runtime.TerminalSize{Width: 100, Height: 40}:
			case <-time.After(10 * time.Second):
			}
		}()
		var out strings.Builder
		code, err := rt.ExecStream(ctx, id, []string{"sh", "-c", "stty size"}, runtime.ExecStreams{Stdout: &out, TTY: true, Resize: sizes})
		<-sent
		if err != nil || code != 0 || strings.TrimSpace(out.String()) != "40 100" {
			t.Errorf("stty size: exit %d (%q), %v; want 40 100", code, out.String(), err)
		}

		// A client that sends no size still gets its command run.
		out.Reset()
		silent := make(chan runtime.TerminalSize)
		code, err = rt.ExecStream(ctx, id, []string{"echo", "ok"}, runtime.ExecStreams{Stdout: &out, TTY: true, Resize: silent})
		if err != nil || code != 0 || strings.TrimSpace(out.String()) != "ok" {
			t.Errorf("echo without a size: exit %d (%q), %v", code, out.String(), err)
		}
	})
	t.Run("not running", func(t *testing.T) {
		if err := rt.StopContainer(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.Exec(ctx, id, []string{"true"}, runtime.ExecOptions{}); !errors.Is(err, runtime.ErrContainerNotRunning) {
			t.Errorf("err %v, want runtime.ErrContainerNotRunning", err)
		}
		if _, err := rt.Exec(ctx, "no-such-container", []string{"true"}, runtime.ExecOptions{}); !errors.Is(err, runtime.ErrContainerNotRunning) {
			t.Errorf("err %v, want runtime.ErrContainerNotRunning", err)
		}
	})
}

// An exec's FIFOs are made where WithExecFIFODir says (tmpfs in the default configuration),
// never under the system's temporary directory, which on a gateway is often the flash: there,
// the FIFOs of an exec probe every second cost about 540 KiB of metadata writes a minute
// (make bench's flash-wear phase). And none is left behind.
func TestExecFIFOsInTheirDirectory(t *testing.T) {
	cd := testenv.StartContainerd(t, testenv.ContainerdOptions{})
	ctx := context.Background()
	const ns = "holdfast-exec-fifo"
	cd.ImportTestImages(ctx, ns)
	fifoDir, tmpDir := t.TempDir(), t.TempDir()
	t.Setenv("TMPDIR", tmpDir)
	rt, err := containerd.Connect(ctx, cd.Address, ns, slog.New(slog.DiscardHandler), containerd.WithExecFIFODir(fifoDir))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	id, err := rt.CreateContainer(ctx, runtime.ContainerConfig{
		PodUID: "pod-fifo", PodName: "fifo", PodNamespace: "default", Name: "app",
		Image: testenv.BusyboxImage, Command: []string{"sleep", "3600"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.StartContainer(ctx, id); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() {
		_, err := rt.Exec(ctx, id, []string{"sleep", "2"}, runtime.ExecOptions{Timeout: 30 * time.Second})
		done <- err
	}()
	go func() {
		_, err := rt.ExecStream(ctx, id, []string{"sleep", "2"}, runtime.ExecStreams{Stdout: io.Discard, Stderr: io.Discard})
		done <- err
	}()
	seen := 0
	for deadline := time.Now().Add(10 * time.Second); seen < 2 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		entries, _ := os.ReadDir(fifoDir)
		seen = len(entries)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if seen < 2 {
		t.Errorf("the FIFOs of two running execs not seen in %s (%d entries)", fifoDir, seen)
	}
	for dir, what := range map[string]string{tmpDir: "the system's temporary directory", fifoDir: "the FIFO directory after the execs"} {
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%s holds %d entries, e.g. %s", what, len(entries), entries[0].Name())
		}
	}
}
