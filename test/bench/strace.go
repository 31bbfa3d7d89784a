package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// syncCalls are the calls that force data to storage. msync counts only with MS_SYNC.
var syncCalls = []string{"fsync", "fdatasync", "sync_file_range", "syncfs", "sync", "msync"}

// writeCalls are the calls that write through a file descriptor; strace -y names its file.
var writeCalls = []string{"write", "pwrite64", "writev", "pwritev", "pwritev2"}

// straceRun is strace attached to a running process and its threads (and children it
// forks), recording the sync and write calls to a file.
type straceRun struct {
	cmd  *exec.Cmd
	out  string
	done chan error
	once sync.Once
}

// startStrace attaches strace to pid and returns once every thread of pid is traced. strace
// stops the tracee at every system call (it can filter in the kernel with seccomp only for
// processes it starts), so the agent runs slower while it is attached.
// With HOLDFAST_BENCH_STRACE_ALL=1 it records every call (to find what dirtied pages without a
// write call, say), not only the sync and write calls; the figures are the same.
func startStrace(pid int, dir string) (*straceRun, error) {
	bin, err := exec.LookPath("strace")
	if err != nil {
		return nil, fmt.Errorf("strace not found: %w", err)
	}
	var trace []string
	for _, c := range append(slices.Clone(syncCalls), writeCalls...) {
		trace = append(trace, "?"+c) // "?": no error for a call this architecture lacks
	}
	set := "trace=" + strings.Join(trace, ",")
	if os.Getenv("HOLDFAST_BENCH_STRACE_ALL") == "1" {
		set = "trace=all"
	}
	s := &straceRun{out: filepath.Join(dir, "strace.out"), done: make(chan error, 1)}
	// -f: threads and children; -qq: no attach, detach or exit messages; -y: file paths of
	// descriptors; -s 0: no buffer contents.
	s.cmd = exec.Command(bin, "-f", "-qq", "-y", "-s", "0", "-tt", "-e", "signal=none", "-e", set,
		"-o", s.out, "-p", strconv.Itoa(pid))
	var stderr strings.Builder
	s.cmd.Stderr = &stderr
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start strace: %w", err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if traced(pid, s.cmd.Process.Pid) {
			return s, nil
		}
		select {
		case err := <-s.done:
			return nil, fmt.Errorf("strace -p %d exited before it attached (%v): %s", pid, err, strings.TrimSpace(stderr.String()))
		default:
		}
		if time.Now().After(deadline) {
			s.abort()
			return nil, fmt.Errorf("strace -p %d: not attached to every thread after 10s: %s", pid, strings.TrimSpace(stderr.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// traced reports whether every thread of pid is traced by tracer.
func traced(pid, tracer int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	want := "TracerPid:\t" + strconv.Itoa(tracer) + "\n"
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil || !strings.Contains(string(b), want) {
			return false
		}
	}
	return true
}

// stop detaches strace (SIGINT: it detaches and exits) and parses what it recorded.
func (s *straceRun) stop() (*straceResult, error) {
	var err error
	s.once.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
			err = fmt.Errorf("strace did not detach in 30s")
		}
	})
	if err != nil {
		return nil, err
	}
	f, err := os.Open(s.out)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseStrace(f)
}

// abort detaches strace if it still runs (a run that failed in the window).
func (s *straceRun) abort() {
	s.once.Do(func() {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
		}
	})
}

// straceResult is what one strace recording holds.
type straceResult struct {
	syncs       int
	syncsByCall map[string]int
	byFile      map[string]*FileIO
}

// files lists the files written or synced, most bytes first, with dir shown as <dir>.
func (r *straceResult) files(dir string) []FileIO {
	var out []FileIO
	for _, f := range r.byFile {
		fi := *f
		if dir != "" {
			fi.Path = strings.Replace(fi.Path, dir, "<dir>", 1)
		}
		out = append(out, fi)
	}
	slices.SortFunc(out, func(a, b FileIO) int {
		if a.Bytes != b.Bytes {
			return int(b.Bytes - a.Bytes)
		}
		if a.Syncs != b.Syncs {
			return b.Syncs - a.Syncs
		}
		return strings.Compare(a.Path, b.Path)
	})
	return out
}

var (
	// "1234  02:49:36.123456 fdatasync(7</var/lib/x/state.db>) = 0": -f's pid, -tt's time.
	straceLine = regexp.MustCompile(`^(\d+)\s+(?:\d\d:\d\d:\d\d\.\d+ )?(.*)$`)
	// The call, its first argument (a descriptor) and the descriptor's path.
	straceCall = regexp.MustCompile(`^([a-z_0-9]+)\((-?\d+)?(?:<(.*?)>)?`)
	// "<... write resumed>"
	straceResumed = regexp.MustCompile(`^<\.\.\. ([a-z_0-9]+) resumed>`)
	// " = 180" (or " = -1 EINTR (...)") at the end of a finished call.
	straceReturn = regexp.MustCompile(`\) += (-?\d+)(?: .*)?$`)
)

// parseStrace reads strace -f -y output: every sync call counted (whatever it returned),
// every write call's returned byte count added to its file. A call split in two lines by
// another thread's (`<unfinished ...>`, `<... resumed>`) is counted once, at its start for a
// sync, at its end for a write; a write to a descriptor that is not a file (a socket, a pipe)
// is left out.
func parseStrace(r io.Reader) (*straceResult, error) {
	res := &straceResult{syncsByCall: map[string]int{}, byFile: map[string]*FileIO{}}
	type pending struct{ call, path string }
	open := map[string]pending{}
	file := func(path string) *FileIO {
		if path == "" {
			path = "?"
		}
		f := res.byFile[path]
		if f == nil {
			f = &FileIO{Path: path}
			res.byFile[path] = f
		}
		return f
	}
	isFile := func(path string) bool { return strings.HasPrefix(path, "/") && !strings.HasPrefix(path, "/dev/") }
	write := func(call, path, line string) {
		m := straceReturn.FindStringSubmatch(line)
		if m == nil || !isFile(path) {
			return
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		f := file(path)
		f.WriteCalls++
		if n > 0 {
			f.Bytes += n
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := straceLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		pid, rest := m[1], m[2]
		if rm := straceResumed.FindStringSubmatch(rest); rm != nil {
			p, ok := open[pid]
			delete(open, pid)
			if ok && p.call == rm[1] && slices.Contains(writeCalls, p.call) {
				write(p.call, p.path, rest)
			}
			continue
		}
		cm := straceCall.FindStringSubmatch(rest)
		if cm == nil {
			continue
		}
		call, path := cm[1], cm[3]
		unfinished := strings.HasSuffix(rest, "<unfinished ...>")
		switch {
		case slices.Contains(syncCalls, call):
			if call == "msync" && !strings.Contains(rest, "MS_SYNC") {
				continue
			}
			res.syncs++
			res.syncsByCall[call]++
			if path != "" {
				file(path).Syncs++
			}
		case slices.Contains(writeCalls, call):
			if unfinished {
				open[pid] = pending{call, path}
			} else {
				write(call, path, rest)
			}
		}
	}
	return res, sc.Err()
}
