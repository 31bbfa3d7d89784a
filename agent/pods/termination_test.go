package pods

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

func TestTerminationMessage(t *testing.T) {
	podDir := t.TempDir()
	logPath := filepath.Join(t.TempDir(), "ns_p_uid", "c", "0.log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		t.Fatal(err)
	}
	var log []byte
	for i := range 100 {
		log = logs.AppendLine(log, time.Unix(1000, 0), logs.Stderr, false, fmt.Appendf(nil, "line %03d %s", i, strings.Repeat("x", 20)))
	}
	log = logs.AppendLine(log, time.Unix(1000, 0), logs.Stdout, true, []byte("partial "))
	log = logs.AppendLine(log, time.Unix(1000, 0), logs.Stdout, false, []byte("end"))
	if err := os.WriteFile(logPath, log, 0o644); err != nil {
		t.Fatal(err)
	}
	c := &v1.Container{Name: "c", TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: v1.TerminationMessageReadFile}
	failed := runtime.Container{Name: "c", Attempt: 0, ExitCode: 1, LogPath: logPath, Recorded: true}

	mount, err := terminationLogMount(podDir, c, 0)
	if err != nil || mount.Destination != "/dev/termination-log" {
		t.Fatalf("mount %+v, %v", mount, err)
	}
	if fi, err := os.Stat(mount.Source); err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("termination log %v %v, want an empty file anyone may write", fi, err)
	}
	if got, ok := terminationMessage(podDir, c, failed); got != "" || !ok {
		t.Errorf("empty file, policy File: %q, %v", got, ok)
	}

	c.TerminationMessagePolicy = v1.TerminationMessageFallbackToLogsOnError
	unrecorded := failed
	unrecorded.Recorded = false
	if got, ok := terminationMessage(podDir, c, unrecorded); ok {
		t.Errorf("log fallback before the exit is recorded (the log may be incomplete): %q, want none yet", got)
	}
	got, _ := terminationMessage(podDir, c, failed)
	if len(got) != maxLogMessageBytes || !strings.HasSuffix(got, "line 099 "+strings.Repeat("x", 20)+"\npartial end\n") {
		t.Errorf("log fallback: %d bytes %q", len(got), got)
	}
	succeeded := failed
	succeeded.ExitCode = 0
	if got, ok := terminationMessage(podDir, c, succeeded); got != "" || !ok {
		t.Errorf("a container that succeeded does not fall back to its log: %q", got)
	}

	// The file wins when it holds something; only its last 4 KiB count.
	if err := os.WriteFile(mount.Source, []byte("head"+strings.Repeat("m", 5000)), 0o666); err != nil {
		t.Fatal(err)
	}
	if got, _ := terminationMessage(podDir, c, failed); got != strings.Repeat("m", 4096) {
		t.Errorf("file message of %d bytes, want its last 4096", len(got))
	}
	if got, ok := terminationMessage(podDir, c, unrecorded); !ok || got != strings.Repeat("m", 4096) {
		t.Errorf("the file's message of an exit not recorded yet: %d bytes, %v; want it at once (the file is complete)", len(got), ok)
	}

	// Only the last 80 lines of the log count.
	short := []byte(nil)
	for i := range 100 {
		short = logs.AppendLine(short, time.Unix(1000, 0), logs.Stdout, false, fmt.Appendf(nil, "%d", i))
	}
	if err := os.WriteFile(logPath, short, 0o644); err != nil {
		t.Fatal(err)
	}
	other := &v1.Container{Name: "other", TerminationMessagePolicy: v1.TerminationMessageFallbackToLogsOnError}
	if got, _ := terminationMessage(podDir, other, failed); !strings.HasPrefix(got, "20\n21\n") || !strings.HasSuffix(got, "\n99\n") {
		t.Errorf("last 80 lines: %q", got)
	}
}
