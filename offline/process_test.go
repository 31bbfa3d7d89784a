package offline

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// runHelper is the child side of the multi-process tests: the test binary
// re-executed with helperEnv set.
func runHelper(mode, path string) int {
	switch mode {
	case "hold":
		// Open the store, say so, and hold it until stdin closes.
		s, _, err := Open(path, Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			return 1
		}
		fmt.Printf("locked %d\n", os.Getpid())
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = s.Close()
		return 0
	case "write":
		return helperWrite(path)
	}
	fmt.Fprintln(os.Stderr, "helper: unknown mode", mode)
	return 2
}

// helperWrite writes pods, admissions, ConfigMaps and statuses from several
// goroutines as fast as it can, printing "ack <uid> <i>" after the writes
// for one (uid, i) returned, until it is killed.
func helperWrite(path string) int {
	s, _, err := Open(path, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	var out sync.Mutex
	fail := make(chan error, 4)
	for w := range 4 {
		go func() {
			for i := 0; ; i++ {
				uid := types.UID(fmt.Sprintf("w%d-%d", w, i))
				steps := []error{
					s.PutPod(SourceAPI, testPod(string(uid), string(uid))),
					s.SetAdmission(uid, Admission{Accepted: true, At: t0}),
					s.PutConfigMap(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: string(uid)}, Data: map[string]string{"i": strconv.Itoa(i)}}),
					func() error {
						_, err := s.AppendStatus(StatusUpdate{UID: uid, Name: string(uid), Status: testStatus(v1.PodRunning, int32(i)), Timestamp: t0})
						return err
					}(),
				}
				for _, err := range steps {
					if err != nil {
						fail <- err
						return
					}
				}
				out.Lock()
				fmt.Printf("ack %s %d\n", uid, i)
				out.Unlock()
			}
		}()
	}
	fmt.Fprintln(os.Stderr, "helper:", <-fail)
	return 1
}

func helperCmd(t *testing.T, mode, path string) (*exec.Cmd, io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperEnv+"_PATH="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, stdin, bufio.NewScanner(stdout)
}

// TestSecondProcessIsLockedOut holds the database in a child process: Open
// here must fail within the timeout, naming the path and the child, and
// succeed once the child is SIGKILLed (flock dies with its holder: no stale
// lock after a crash).
func TestSecondProcessIsLockedOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	cmd, _, lines := helperCmd(t, "hold", path)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "locked ") {
		t.Fatalf("child did not lock: %q %v", lines.Text(), lines.Err())
	}
	start := time.Now()
	_, _, err := Open(path, Options{Timeout: 200 * time.Millisecond})
	elapsed := time.Since(start)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("Open while a child holds it: %v, want ErrLocked", err)
	}
	msg := err.Error()
	for _, want := range []string{path, "process " + strconv.Itoa(cmd.Process.Pid), "another holdfast may be running"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if elapsed < 200*time.Millisecond || elapsed > 2*time.Second {
		t.Errorf("Open gave up after %s, want about the 200ms timeout", elapsed)
	}
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	s, rep := openTestStore(t, path, Options{Timeout: 2 * time.Second})
	if rep.Recovered != nil || rep.Created {
		t.Errorf("reopen after the holder died: %v", rep)
	}
	must(t, s.Close())
}

// TestKillDuringWrites SIGKILLs a child process in the middle of a stream
// of writes; every write the child saw return must be there afterwards,
// and the file must open cleanly. 3 rounds in `make test`;
// HOLDFAST_STORE_KILL_ROUNDS sets more (`make soak`: 300).
func TestKillDuringWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("kill test: spawns a writer process; skipped with -short")
	}
	rounds := 3
	if v := os.Getenv("HOLDFAST_STORE_KILL_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("HOLDFAST_STORE_KILL_ROUNDS=%q", v)
		}
		rounds = n
	}
	path := filepath.Join(t.TempDir(), "state.db")
	for round := range rounds {
		cmd, _, lines := helperCmd(t, "write", path)
		// Kill after a number of acks that varies by round, so the kill lands
		// at different points of the commit cycle.
		target := 150 + 97*(round%7) + round%13
		acked := map[string]int{}
		killer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
		for len(acked) < target && lines.Scan() {
			record(t, acked, lines.Text())
		}
		killer.Stop()
		must(t, cmd.Process.Signal(syscall.SIGKILL))
		for lines.Scan() { // acks already in the pipe were acknowledged too
			record(t, acked, lines.Text())
		}
		_ = cmd.Wait()
		if len(acked) < target {
			t.Fatalf("round %d: child acked %d writes before dying, want %d", round, len(acked), target)
		}

		s, rep := openTestStore(t, path, Options{})
		if rep.Recovered != nil {
			t.Fatalf("round %d: reopen after kill: %v", round, rep)
		}
		recs, errs, err := s.LoadPods()
		must(t, err)
		if len(errs) != 0 {
			t.Errorf("round %d: load errors after kill: %v", round, errs)
		}
		byUID := map[string]PodRecord{}
		for _, r := range recs {
			byUID[string(r.UID)] = r
		}
		pending, _, err := s.PendingStatuses()
		must(t, err)
		delivered := map[string]bool{}
		for _, p := range pending {
			delivered[string(p.UID)] = true
		}
		for uid, i := range acked {
			r, ok := byUID[uid]
			cm, err := s.GetConfigMap("default", uid)
			if !ok || !r.Admission.Accepted || err != nil || cm.Data["i"] != strconv.Itoa(i) || !delivered[uid] {
				t.Errorf("round %d: acked write %s lost: %+v, configmap %+v (%v)", round, uid, r, cm, err)
			}
		}
		// The next round's child writes the same keys over this state.
		must(t, s.Close())
		checkConsistency(t, path)
		if rounds <= 10 || round%50 == 0 || round == rounds-1 {
			t.Logf("round %d: %d acked writes, %d pods on disk", round, len(acked), len(recs))
		}
	}
}

func record(t *testing.T, acked map[string]int, line string) {
	var uid string
	var i int
	if _, err := fmt.Sscanf(line, "ack %s %d", &uid, &i); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	acked[uid] = i
}
