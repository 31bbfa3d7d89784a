package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/agent/config"
	"github.com/holdfast-dev/holdfast/agent/status"
	"github.com/holdfast-dev/holdfast/test/testenv"
)

// logsTalkerManifest prints numbered lines to stdout and stderr, about 40 a second, and one line
// longer than the 16 KiB line limit at start.
const logsTalkerManifest = `apiVersion: v1
kind: Pod
metadata:
  name: talker
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: talker
    image: docker.io/holdfast/busybox:test
    imagePullPolicy: Never
    command:
    - sh
    - -c
    - |
      head -c 20000 /dev/zero | tr '\0' x; echo
      i=0
      while true; do
        i=$((i+1)); echo "out $i"; echo "err $i" >&2; sleep 0.05
      done
`

// logsCRILine is kubelet's CRI log line: RFC 3339 timestamp, stream, tag, message.
var logsCRILine = regexp.MustCompile(`^(\S+) (stdout|stderr) ([FP]) (.*)$`)

// logsReadCRI reads a container's log files, rotated ones first (oldest first), then the live
// one, checking every line's form; it returns the lines as "STREAM TAG MESSAGE".
func logsReadCRI(t *testing.T, livePath string) ([]string, []string, error) {
	t.Helper()
	dir := filepath.Dir(livePath)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	var files []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), filepath.Base(livePath)+".") {
			files = append(files, e.Name())
		}
	}
	sort.Strings(files)
	files = append(files, filepath.Base(livePath))
	var lines []string
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, nil, err // rotated away between the listing and the read
		}
		for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			if l == "" {
				continue
			}
			m := logsCRILine.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("%s: line not in the CRI log format: %q", f, logsTruncate(l))
			}
			if _, err := time.Parse(time.RFC3339Nano, m[1]); err != nil {
				t.Fatalf("%s: timestamp of %q: %v", f, logsTruncate(l), err)
			}
			lines = append(lines, m[2]+" "+m[3]+" "+m[4])
		}
	}
	return files, lines, nil
}

func logsTruncate(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// sequence returns the numbers of the "out N" lines of stdout, in file order.
func logsSequence(lines []string, stream, word string) []int {
	var out []int
	for _, l := range lines {
		if n, ok := strings.CutPrefix(l, stream+" F "+word+" "); ok {
			if v, err := strconv.Atoi(n); err == nil {
				out = append(out, v)
			}
		}
	}
	return out
}

// logsProcessesOf returns the pids of the processes running the executable at path.
func logsProcessesOf(t *testing.T, path string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == path {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestContainerLogsSurviveAgentKill: a container's stdout and stderr land in
// PODLOGDIR/NS_NAME_UID/CONTAINER/0.log in the CRI log format, long lines cut into partial
// lines, rotated at containerLogMaxSize keeping containerLogMaxFiles files; the agent is
// killed with SIGKILL and restarted while the container prints, and not one line is lost.
func TestContainerLogsSurviveAgentKill(t *testing.T) {
	e := startEnv(t, false, func(c *config.Config) {
		c.ContainerLogMaxSize = "8Ki"
		c.ContainerLogMaxFiles = 3
	})
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(e.agent.Config.ManifestDir, "talker.yaml"), []byte(logsTalkerManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	var pod status.PodView
	testenv.Eventually(t, 60*time.Second, "talker running", func() error {
		pods, err := e.agent.Pods(ctx)
		if err != nil {
			return err
		}
		for _, p := range pods {
			if p.Name == "talker-"+node && p.Status.Phase == "Running" {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("pods %+v", pods)
	})
	live := filepath.Join(e.agent.Config.PodLogDir, "default_talker-"+node+"_"+string(pod.UID), "talker", "0.log")
	firstIDs := containerIDs(e.containers(t))

	// CRI format, both streams, the long line cut at 16 KiB.
	var lines []string
	testenv.Eventually(t, 30*time.Second, "both streams logged in CRI format", func() error {
		var err error
		if _, lines, err = logsReadCRI(t, live); err != nil {
			return err
		}
		if len(logsSequence(lines, "stdout", "out")) < 5 || len(logsSequence(lines, "stderr", "err")) < 5 {
			return fmt.Errorf("%d lines so far", len(lines))
		}
		return nil
	})
	long := strings.Repeat("x", 20000)
	var stdout []string
	for _, l := range lines {
		if strings.HasPrefix(l, "stdout ") {
			stdout = append(stdout, l)
		}
	}
	if stdout[0] != "stdout P "+long[:16384] || stdout[1] != "stdout F "+long[16384:] {
		t.Errorf("the 20000-byte line should be a 16384-byte partial line then a full one; first stdout lines: %q, %q",
			logsTruncate(stdout[0]), logsTruncate(stdout[1]))
	}

	// The writer is the dedicated logger binary installed beside holdfast, not holdfast itself
	// (six times the memory, one per container). On the CRI backend the runtime writes it.
	link := filepath.Join(e.agent.Config.StateDir, "bin", "holdfast-logger")
	target, lerr := os.Readlink(link)
	if e.cd.CRI {
		if lerr == nil {
			t.Errorf("logger link %s -> %q on the CRI backend, whose runtime writes the logs", link, target)
		}
	} else if lerr != nil || filepath.Base(target) != "holdfast-logger" {
		t.Errorf("logger link %s -> %q (%v), want the holdfast-logger binary", link, target, lerr)
	} else if pids := logsProcessesOf(t, target); len(pids) != 1 {
		t.Errorf("%d processes run %s, want one logger for the one container", len(pids), target)
	}

	// Kill the agent; the container keeps printing and its logger keeps writing: the lines
	// around the kill follow each other without a gap.
	before := logsSequence(lines, "stdout", "out")
	lastBefore := before[len(before)-1]
	e.agent.Kill()
	killedAt := time.Now()
	testenv.Eventually(t, 30*time.Second, "lines logged while the agent is dead", func() error {
		_, lines, err := logsReadCRI(t, live)
		if err != nil {
			return err
		}
		seq := logsSequence(lines, "stdout", "out")
		if got := seq[len(seq)-1]; got < lastBefore+40 {
			return fmt.Errorf("last line %d, %d when the agent died", got, lastBefore)
		}
		if seq[0] > lastBefore {
			t.Fatalf("the kept files no longer reach back to the kill (line %d): containerLogMaxSize too small for this test", lastBefore)
		}
		logsAssertNoGap(t, lines)
		return nil
	})
	t.Logf("agent dead for %s while the container logged", time.Since(killedAt).Round(time.Millisecond))

	e.agent.Start()
	testenv.Eventually(t, 60*time.Second, "agent back, same container", func() error {
		pods, err := e.agent.Pods(ctx)
		if err != nil {
			return err
		}
		for _, p := range pods {
			if p.UID == pod.UID && p.Status.Phase == "Running" && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == 0 {
				return nil
			}
		}
		return fmt.Errorf("pods %+v", pods)
	})
	if ids := containerIDs(e.containers(t)); fmt.Sprint(ids) != fmt.Sprint(firstIDs) {
		t.Fatalf("containers %v after the restart, want %v", ids, firstIDs)
	}
	_, lines, err := logsReadCRI(t, live)
	if err != nil {
		t.Fatal(err)
	}
	atRestart := logsSequence(lines, "stdout", "out")

	// Rotation: by now (about 2 KiB a second against 8 KiB) at most three files are kept,
	// rotated files named ATTEMPT.log.YYYYMMDD-HHMMSS[-NNN], each within the size limit unless
	// it holds a single line longer than it; lines still follow each other.
	var files []string
	testenv.Eventually(t, 60*time.Second, "rotations after the restart", func() error {
		var err error
		if files, lines, err = logsReadCRI(t, live); err != nil {
			return err
		}
		if seq := logsSequence(lines, "stdout", "out"); len(files) < 3 || seq[len(seq)-1] < atRestart[len(atRestart)-1]+100 {
			return fmt.Errorf("files %v, last line %d", files, seq[len(seq)-1])
		}
		return nil
	})
	logsAssertNoGap(t, lines)
	rotated := regexp.MustCompile(`^0\.log\.\d{8}-\d{6}(-\d{3})?$`)
	// The logger rotates as it writes. A CRI runtime writes the file itself, and holdfast
	// rotates it every 10 s, as the kubelet does: the file may grow by 10 s of output (about
	// 2 KiB a second here, twice that allowed) past the limit first.
	maxRotated := 8 << 10
	if e.cd.CRI {
		maxRotated += 10 * 4 << 10
	}
	if len(files) != 3 {
		t.Errorf("files %v, want 3 (containerLogMaxFiles)", files)
	}
	for _, f := range files[:len(files)-1] {
		if !rotated.MatchString(f) {
			t.Errorf("rotated file name %q", f)
		}
		b, err := os.ReadFile(filepath.Join(filepath.Dir(live), f))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > maxRotated && strings.Count(string(b), "\n") > 1 {
			t.Errorf("%s is %d bytes, over containerLogMaxSize", f, len(b))
		}
	}
}

// logsAssertNoGap checks that the numbered lines of each stream follow each other.
func logsAssertNoGap(t *testing.T, lines []string) {
	t.Helper()
	for _, s := range []struct{ stream, word string }{{"stdout", "out"}, {"stderr", "err"}} {
		seq := logsSequence(lines, s.stream, s.word)
		for i := 1; i < len(seq); i++ {
			if seq[i] != seq[i-1]+1 {
				t.Fatalf("%s: line %d follows %d: lines were lost", s.stream, seq[i], seq[i-1])
			}
		}
	}
}
