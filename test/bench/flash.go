package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/holdfast-dev/holdfast/internal/procfs"
)

// OnlyFlash is Options.Only for the flash-wear phase alone (-bench.only=flash): the agent
// started, Pods pods created at once, the phase, nothing else.
const OnlyFlash = "flash"

// flipperName is the pod whose readiness flips in the flash-wear phase.
const flipperName = "flip"

// flipperReadyMargin is how much longer than the settle time and the steady window the
// flipping pod holds still after its container starts: room for its Ready status to reach the
// apiserver, which opens the settle time. A later report shortens the steady window (its length
// is measured, the figures are rates).
const flipperReadyMargin = 3 * time.Second

// Flash is the flash-wear phase: with SteadyPods pods running and one more whose readiness
// flips every PeriodS seconds (an exec readiness probe, every second, on a file its container
// creates and removes), first a window with no status change (the flipping pod already
// running, probed and Ready, not flipping yet), then a window of flips. In each: the agent's
// sync calls and the files they went to (strace), the bytes it wrote to storage
// (/proc/PID/io), its own log's growth, and the flipping pod's Ready transitions as a watch
// on the apiserver saw them.
type Flash struct {
	SteadyPods int     `json:"steadyPods"`
	PeriodS    float64 `json:"periodSeconds"`
	// Steady is the window with no status change; Churn the window of flips.
	Steady *FlashWindow `json:"steady"`
	Churn  *FlashWindow `json:"churn"`
}

// FlashWindow is what the agent did to storage in one window of the flash-wear phase.
type FlashWindow struct {
	WindowS float64 `json:"windowSeconds"`
	// StatusChanges counts the flipping pod's Ready condition transitions (True to False and
	// back) that a watch on the apiserver saw in the window; PodUpdates every update of that
	// pod it saw.
	StatusChanges int `json:"statusChanges"`
	PodUpdates    int `json:"podUpdates"`
	// Traced: strace counted the agent's syscalls in the window (SyncCalls and Files are
	// meaningless without it; TraceError says why not).
	Traced     bool   `json:"traced"`
	TraceError string `json:"traceError,omitempty"`
	// SyncCalls counts fsync, fdatasync, sync_file_range, syncfs, sync and msync with
	// MS_SYNC, by the agent and its children (strace -f); SyncsByCall splits them by call.
	SyncCalls   int            `json:"syncCalls"`
	SyncsByCall map[string]int `json:"syncsByCall,omitempty"`
	// Files is, per file (paths under the agent's directory shown as <dir>), the sync calls
	// and the write calls to it and the bytes they passed (strace -y).
	Files []FileIO `json:"files,omitempty"`
	// WriteBytes, CancelledWriteBytes and WChar are the deltas of /proc/PID/io write_bytes
	// (page cache pages the agent dirtied: what will reach storage), cancelled_write_bytes
	// (dirty pages it truncated away before writeback) and wchar (bytes passed to every write
	// call, sockets and pipes included).
	WriteBytes          int64 `json:"writeBytes"`
	CancelledWriteBytes int64 `json:"cancelledWriteBytes"`
	WChar               int64 `json:"wchar"`
	// LogBytes is how much the agent's own log (its stdout and stderr, a file here, the
	// journal on a gateway) grew.
	LogBytes int64 `json:"logBytes"`
	// NodeWriteBytes is write_bytes of containerd, its shims and the helper processes
	// (holdfast's container loggers, the CRI plugin's pause sandboxes) in the window.
	NodeWriteBytes int64 `json:"nodeWriteBytes"`
	// StatusWrites counts the agent's pod status writes (patch or update pods/status) in the
	// apiserver's audit log in the window.
	StatusWrites int `json:"statusWrites"`

	from, to time.Time
}

// FileIO is one file's part of a window: sync calls, write calls and the bytes they passed.
type FileIO struct {
	Path       string `json:"path"`
	Syncs      int    `json:"syncs"`
	WriteCalls int    `json:"writeCalls"`
	Bytes      int64  `json:"bytes"`
}

// perMinute is a count of the window as a rate per minute.
func (w *FlashWindow) perMinute(x float64) float64 {
	if w == nil || w.WindowS <= 0 {
		return 0
	}
	return x * 60 / w.WindowS
}

// perChange divides what the churn window saw, less what the steady window's rate accounts
// for over as long a time when lessSteady, by the status changes in the churn window; false
// when there was none.
func (f *Flash) perChange(of func(*FlashWindow) float64, lessSteady bool) (float64, bool) {
	if f == nil || f.Churn == nil || f.Churn.StatusChanges == 0 {
		return 0, false
	}
	x := of(f.Churn)
	if lessSteady {
		if f.Steady == nil || f.Steady.WindowS <= 0 {
			return 0, false
		}
		x -= of(f.Steady) * f.Churn.WindowS / f.Steady.WindowS
	}
	return x / float64(f.Churn.StatusChanges), true
}

// flipperPod is the flash-wear phase's pod whose readiness flips: the bench pod, its container
// a shell that creates /tmp/ready, holds it for hold, then removes and creates it again every
// period; an exec readiness probe reads it every second (the rest of the probe, as the other
// pods' fields, left to the API's defaults: 3 failures make it not ready).
func flipperPod(name, node string, hold, period time.Duration) *v1.Pod {
	p := benchPod(name, node)
	script := fmt.Sprintf(`touch /tmp/ready; sleep %d; while true; do rm -f /tmp/ready; sleep %d; touch /tmp/ready; sleep %d; done`,
		int64(hold/time.Second), int64(period/time.Second), int64(period/time.Second))
	c := &p.Spec.Containers[0]
	c.Command = []string{"sh", "-c", script}
	c.ReadinessProbe = &v1.Probe{
		ProbeHandler:  v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"cat", "/tmp/ready"}}},
		PeriodSeconds: 1,
	}
	return p
}

// readyWatch records, through an informer on one pod, every change of its Ready condition and
// every update, stamped with the time its event arrived.
type readyWatch struct {
	mu          sync.Mutex
	ready       *bool
	transitions []time.Time
	updates     []time.Time
	changed     chan struct{}
}

func watchReady(ctx context.Context, e *env, name string) (*readyWatch, error) {
	w := &readyWatch{changed: make(chan struct{})}
	_, inf := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.NewListWatchFromClient(e.cp.Admin.CoreV1().RESTClient(), "pods", metav1.NamespaceDefault,
			fields.OneTermEqualSelector("metadata.name", name)),
		ObjectType: &v1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.event(obj) },
			UpdateFunc: func(_, obj any) { w.event(obj) },
		},
	})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("watch of pod %s did not sync", name)
	}
	return w, nil
}

func (w *readyWatch) event(obj any) {
	now := time.Now()
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	var ready *bool
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			ready = ptr.To(c.Status == v1.ConditionTrue)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.updates = append(w.updates, now)
	if ready != nil && w.ready != nil && *ready != *w.ready {
		w.transitions = append(w.transitions, now)
		close(w.changed)
		w.changed = make(chan struct{})
	}
	if ready != nil {
		w.ready = ready
	}
}

// count returns the transitions and updates seen in [from, to).
func (w *readyWatch) count(from, to time.Time) (transitions, updates int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	in := func(ts []time.Time) int {
		n := 0
		for _, t := range ts {
			if !t.Before(from) && t.Before(to) {
				n++
			}
		}
		return n
	}
	return in(w.transitions), in(w.updates)
}

// transitionAfter waits for the first transition seen at or after t0 and returns its time.
func (w *readyWatch) transitionAfter(t0 time.Time, timeout time.Duration) (time.Time, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		for _, t := range w.transitions {
			if !t.Before(t0) {
				w.mu.Unlock()
				return t, nil
			}
		}
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			return time.Time{}, fmt.Errorf("no Ready transition of pod %s seen in %s", flipperName, timeout)
		}
	}
}

// procIO is /proc/PID/io.
type procIO struct {
	wchar, writeBytes, cancelled int64
}

func readProcIO(pid int) (procIO, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return procIO{}, err
	}
	var io procIO
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		var n int64
		if _, err := fmt.Sscan(v, &n); err != nil {
			continue
		}
		switch k {
		case "wchar":
			io.wchar = n
		case "write_bytes":
			io.writeBytes = n
		case "cancelled_write_bytes":
			io.cancelled = n
		}
	}
	return io, nil
}

// flash runs the flash-wear phase with the pods already running on the node (steadyPods of
// them): it creates the flipping pod, measures the window with no status change, then the
// window of flips, and deletes the flipping pod.
func (e *env) flash(steadyPods int) *Flash {
	t := e.t
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	period, steady, window, settle := e.opts.FlashPeriod, e.opts.FlashSteady, e.opts.FlashWindow, e.opts.Settle
	tasksBefore, err := runningTasks(ctx, e.cd, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	w, err := watchReady(ctx, e, flipperName)
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	hold := (settle + steady + flipperReadyMargin).Round(time.Second)
	e.logf("flash wear: %d pods running, pod %s created, Ready for %s after its container starts, then flipping every %s", steadyPods, flipperName, hold, period)
	if _, err := e.pods.Create(ctx, flipperPod(flipperName, e.agent.node, hold, period), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	readyAt, err := e.tr.podsReadyAfter([]string{flipperName}, created, podTimeout)
	if err != nil {
		t.Fatal(err)
	}
	// The container started at StartedAt or in the second after it (the API keeps whole
	// seconds), after the pod's creation in any case: it removes the file at started+hold at
	// the earliest, and the probe's third failure, the first status change, comes 2s later at
	// the earliest. The steady window opens after the settle time, lasts `steady`, and ends
	// by then whatever happens.
	started, apiStarted := created, "none"
	if p, err := e.cp.Admin.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, flipperName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if cs := p.Status.ContainerStatuses; len(cs) > 0 && cs[0].State.Running != nil {
		at := cs[0].State.Running.StartedAt.Time
		apiStarted = at.Format("15:04:05")
		if at.After(started) {
			started = at
		}
	}
	begin := readyAt.Add(settle)
	end := begin.Add(steady)
	if flipAt := started.Add(hold + time.Second); end.After(flipAt) {
		end = flipAt
	}
	e.logf("flash wear: pod %s created %s, its container started %s (the API's startedAt), seen Ready %.1fs after its creation",
		flipperName, created.Format("15:04:05.000"), apiStarted, readyAt.Sub(created).Seconds())
	if end.Sub(begin) < steady/2 {
		t.Fatalf("flash wear: pod %s seen Ready %.1fs after its creation, too late for a steady window of %s before it flips", flipperName, readyAt.Sub(created).Seconds(), steady)
	}
	time.Sleep(time.Until(begin))
	f := &Flash{SteadyPods: steadyPods, PeriodS: period.Seconds()}
	e.logf("flash wear: steady window, %.0fs, no status change", end.Sub(begin).Seconds())
	f.Steady = e.flashWindow("steady", w, end)

	// The churn window opens half a period after a flip was seen and lasts whole periods, so
	// its edges fall between flips and each flip in it is whole.
	first, err := w.transitionAfter(end, period+30*time.Second+time.Until(started.Add(hold)))
	if err != nil {
		t.Fatal(err)
	}
	begin = first.Add(period / 2)
	time.Sleep(time.Until(begin))
	e.logf("flash wear: churn window, %s, pod %s flipping every %s", window, flipperName, period)
	f.Churn = e.flashWindow("churn", w, begin.Add(window))
	if f.Churn.StatusChanges == 0 {
		t.Errorf("flash wear: no Ready transition of pod %s seen in the %s churn window", flipperName, window)
	}
	if f.Steady.StatusChanges != 0 {
		t.Errorf("flash wear: %d Ready transitions of pod %s seen in the steady window", f.Steady.StatusChanges, flipperName)
	}
	// Counted once the pod is gone (below), so that the audit log holds every request
	// received in the windows.
	defer func() {
		e.countStatusWrites(f.Steady)
		e.countStatusWrites(f.Churn)
		e.logf("flash wear: pod status writes: %d with no status change, %d in the window of flips", f.Steady.StatusWrites, f.Churn.StatusWrites)
	}()
	for _, x := range []struct {
		name string
		w    *FlashWindow
	}{{"steady", f.Steady}, {"churn", f.Churn}} {
		e.logf("flash wear: %s: %.0fs, %d status changes (%d pod updates), %d syncs %v, write_bytes %.1f KiB (log %.1f KiB, cancelled %.1f KiB), wchar %.1f KiB, node write_bytes %.1f KiB",
			x.name, x.w.WindowS, x.w.StatusChanges, x.w.PodUpdates, x.w.SyncCalls, x.w.SyncsByCall, float64(x.w.WriteBytes)/1024,
			float64(x.w.LogBytes)/1024, float64(x.w.CancelledWriteBytes)/1024, float64(x.w.WChar)/1024, float64(x.w.NodeWriteBytes)/1024)
		for _, fi := range x.w.Files {
			e.logf("flash wear: %s:   %s: %d syncs, %d writes, %.1f KiB", x.name, fi.Path, fi.Syncs, fi.WriteCalls, float64(fi.Bytes)/1024)
		}
	}

	// Gone from the API, and its tasks (the CRI plugin's sandbox too) from containerd, so that
	// what follows sees the steady pods' tasks only.
	if err := e.pods.Delete(ctx, flipperName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := e.tr.podsGone([]string{flipperName}, podTimeout); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(podTimeout)
	for {
		tasks, err := runningTasks(ctx, e.cd, e.ns)
		extra := 0
		for id := range tasks {
			if _, ok := tasksBefore[id]; !ok {
				extra++
			}
		}
		if err == nil && extra == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flash wear: %d tasks of pod %s still running %s after its deletion (err %v)", extra, flipperName, podTimeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return f
}

// flashWindow measures the agent from now until end (the window called name; strace's record
// of it goes to the results directory as AGENT-strace-NAME.txt): strace on it meanwhile, /proc/PID/io and
// its log's size at both ends, its node's processes' write_bytes, the watch's count of
// the flipping pod's transitions, and the audit log's of its status writes.
func (e *env) flashWindow(name string, w *readyWatch, end time.Time) *FlashWindow {
	t := e.t
	pid := e.agent.pid()
	if pid == 0 {
		t.Fatal("agent not running")
	}
	p0, err := procfs.ReadProcess(pid, false)
	if err != nil {
		t.Fatalf("read the agent's /proc: %v", err)
	}
	// Attached before the window opens; detached after it closes.
	st, traceErr := startStrace(pid, t.TempDir())
	if traceErr != nil {
		e.logf("flash wear: sync calls not counted: %v", traceErr)
	} else {
		t.Cleanup(st.abort)
	}
	np := findNodeProcs(e.cd.Address, isHelper)
	nodeIO := func() map[int]int64 {
		m := map[int]int64{}
		for _, p := range np.overhead() {
			if io, err := readProcIO(p); err == nil {
				m[p] = io.writeBytes
			}
		}
		return m
	}
	logSize := func() int64 {
		fi, err := os.Stat(e.agent.proc.LogPath())
		if err != nil {
			return 0
		}
		return fi.Size()
	}

	from := time.Now()
	io0, err := readProcIO(pid)
	if err != nil {
		t.Fatalf("read the agent's /proc/%d/io: %v", pid, err)
	}
	log0, node0 := logSize(), nodeIO()
	time.Sleep(time.Until(end))
	to := time.Now()
	io1, err := readProcIO(pid)
	if err != nil {
		t.Fatalf("read the agent's /proc/%d/io: %v", pid, err)
	}
	log1, node1 := logSize(), nodeIO()
	if p1, err := procfs.ReadProcess(pid, false); err != nil || p1.StartTime != p0.StartTime {
		t.Fatalf("flash wear: the agent (pid %d) did not live through the window", pid)
	}

	fw := &FlashWindow{
		WindowS:             to.Sub(from).Seconds(),
		WriteBytes:          io1.writeBytes - io0.writeBytes,
		CancelledWriteBytes: io1.cancelled - io0.cancelled,
		WChar:               io1.wchar - io0.wchar,
		LogBytes:            log1 - log0,
	}
	for p, b1 := range node1 {
		if b0, ok := node0[p]; ok {
			fw.NodeWriteBytes += b1 - b0
		}
	}
	fw.StatusChanges, fw.PodUpdates = w.count(from, to)
	if traceErr == nil {
		tr, err := st.stop()
		if e.opts.OutDir != "" {
			copyFile(st.out, filepath.Join(e.opts.OutDir, e.agent.kind+"-strace-"+name+".txt"))
		}
		if err != nil {
			traceErr = err
			e.logf("flash wear: sync calls not counted: %v", err)
		} else {
			fw.Traced, fw.SyncCalls, fw.SyncsByCall = true, tr.syncs, tr.syncsByCall
			fw.Files = tr.files(e.agent.dir)
		}
	}
	if traceErr != nil {
		fw.TraceError = traceErr.Error()
	}
	fw.from, fw.to = from, to
	return fw
}

// countStatusWrites counts the agent's pod status writes in the audit log in fw's window
// (read later than the window's end, so that requests received in it are all written).
func (e *env) countStatusWrites(fw *FlashWindow) {
	reqs, err := countRequests(e.audit, "system:node:"+e.agent.node, fw.from, fw.to)
	if err != nil {
		e.t.Errorf("flash wear: %v", err)
		return
	}
	fw.StatusWrites = reqs["patch pods/status"] + reqs["update pods/status"]
}

// flashRows adds the flash-wear phase's rows, if any agent went through it.
func (r *Report) flashRows(row func(section, metric, unit string, get func(*AgentResult) (float64, bool))) {
	var ref *Flash
	for _, a := range r.Agents {
		if a.Flash != nil && a.Flash.Steady != nil && a.Flash.Churn != nil {
			ref = a.Flash
			break
		}
	}
	if ref == nil {
		return
	}
	sec := fmt.Sprintf("flash wear: %d pods, and one whose readiness flips every %.0fs; a window of %v with no status change, then %v of flips",
		ref.SteadyPods, ref.PeriodS, r.Options["flashSteady"], r.Options["flashWindow"])
	flash := func(traced bool, f func(*Flash) (float64, bool)) func(*AgentResult) (float64, bool) {
		return func(a *AgentResult) (float64, bool) {
			fl := a.Flash
			if fl == nil || fl.Steady == nil || fl.Churn == nil || (traced && (!fl.Steady.Traced || !fl.Churn.Traced)) {
				return 0, false
			}
			return f(fl)
		}
	}
	steady := func(traced bool, of func(*FlashWindow) float64) func(*AgentResult) (float64, bool) {
		return flash(traced, func(f *Flash) (float64, bool) { return f.Steady.perMinute(of(f.Steady)), true })
	}
	churn := func(traced bool, of func(*FlashWindow) float64) func(*AgentResult) (float64, bool) {
		return flash(traced, func(f *Flash) (float64, bool) { return of(f.Churn), true })
	}
	perChange := func(traced, lessSteady bool, of func(*FlashWindow) float64) func(*AgentResult) (float64, bool) {
		return flash(traced, func(f *Flash) (float64, bool) { return f.perChange(of, lessSteady) })
	}
	syncs := func(w *FlashWindow) float64 { return float64(w.SyncCalls) }
	kib := func(w *FlashWindow) float64 { return float64(w.WriteBytes) / 1024 }
	logKiB := func(w *FlashWindow) float64 { return float64(w.LogBytes) / 1024 }
	r.Notes = append(r.Notes, "flash wear: sync calls are counted by strace attached to the agent for each window "+
		"(it stops the agent at every system call: the agent runs slower meanwhile); disk writes are /proc/PID/io write_bytes, "+
		"the page cache pages the agent (and the children it reaped) dirtied, each counted once until written back, "+
		"so a page rewritten after a sync counts again; also any inode page its calls dirty (on an ext4 without a journal, "+
		"as on the machine of 2026-12-06, the atime a read of a changed file updates: write_bytes then grows with no write call, "+
		"which the by-file lists, from strace, do not show); not counted: the journal writes that each sync forces on a file "+
		"system with one (written by the kernel), nor what containerd and the runtime write for the agent (their own row). "+
		"\"Less the steady rate\" subtracts the window with no status change, rate for rate: write_bytes in a minute is noisy "+
		"(periodic work, atime updates), so that figure can be negative; the raw figure is the window's total over its changes")
	row(sec, "no status change: sync calls (fsync, fdatasync, sync_file_range, syncfs, sync, msync MS_SYNC)", "/min", steady(true, syncs))
	row(sec, "no status change: disk writes (/proc/PID/io write_bytes)", "KiB/min", steady(false, kib))
	row(sec, "  of which the agent's own log", "KiB/min", steady(false, logKiB))
	row(sec, "flips: status changes in the window (Ready transitions a watch saw)", "count", churn(false, func(w *FlashWindow) float64 { return float64(w.StatusChanges) }))
	row(sec, "flips: sync calls in the window", "count", churn(true, syncs))
	row(sec, "flips: disk writes in the window", "KiB", churn(false, kib))
	row(sec, "sync calls per status change", "/change", perChange(true, false, syncs))
	row(sec, "sync calls per status change, less the steady rate", "/change", perChange(true, true, syncs))
	row(sec, "disk writes per status change", "KiB", perChange(false, false, kib))
	row(sec, "disk writes per status change, less the steady rate", "KiB", perChange(false, true, kib))
	row(sec, "  of which the agent's own log", "KiB", perChange(false, true, logKiB))
	row(sec, "pod status writes to the apiserver per status change", "/change", perChange(false, false, func(w *FlashWindow) float64 { return float64(w.StatusWrites) }))
	row(sec, "node (containerd, shims, helpers) disk writes per status change, less the steady rate", "KiB",
		perChange(false, true, func(w *FlashWindow) float64 { return float64(w.NodeWriteBytes) / 1024 }))
}

// flashFiles lists, for every agent that went through the flash-wear phase with strace, the
// files its sync and write calls went to in each window.
func (r *Report) flashFiles(markdown bool) string {
	var b strings.Builder
	for _, a := range r.Agents {
		f := a.Flash
		if f == nil || f.Steady == nil || f.Churn == nil || !f.Churn.Traced {
			continue
		}
		if markdown {
			fmt.Fprintf(&b, "\n%s: sync calls, write calls and KiB written by file, window with no status change / window of %d status changes (strace -y; <dir> is the agent's directory):\n\n",
				a.Agent, f.Churn.StatusChanges)
			b.WriteString("| file | syncs | writes | KiB |\n|---|---:|---:|---:|\n")
		} else {
			fmt.Fprintf(&b, "\n%s: sync calls, write calls and KiB written by file, no status change / %d status changes (strace -y):\n", a.Agent, f.Churn.StatusChanges)
		}
		steady := map[string]FileIO{}
		for _, fi := range f.Steady.Files {
			steady[fi.Path] = fi
		}
		seen := map[string]bool{}
		var paths []string
		for _, list := range [][]FileIO{f.Churn.Files, f.Steady.Files} {
			for _, fi := range list {
				if !seen[fi.Path] {
					seen[fi.Path] = true
					paths = append(paths, fi.Path)
				}
			}
		}
		churn := map[string]FileIO{}
		for _, fi := range f.Churn.Files {
			churn[fi.Path] = fi
		}
		if len(paths) == 0 && markdown {
			b.WriteString("| (none) | 0 / 0 | 0 / 0 | 0 / 0 |\n")
		} else if len(paths) == 0 {
			b.WriteString("  (none)\n")
		}
		for _, p := range paths {
			s, c := steady[p], churn[p]
			if markdown {
				fmt.Fprintf(&b, "| %s | %d / %d | %d / %d | %.1f / %.1f |\n", p, s.Syncs, c.Syncs, s.WriteCalls, c.WriteCalls, float64(s.Bytes)/1024, float64(c.Bytes)/1024)
			} else {
				fmt.Fprintf(&b, "  %s: syncs %d / %d, writes %d / %d, KiB %.1f / %.1f\n", p, s.Syncs, c.Syncs, s.WriteCalls, c.WriteCalls, float64(s.Bytes)/1024, float64(c.Bytes)/1024)
			}
		}
	}
	return b.String()
}
