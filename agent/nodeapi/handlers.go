package nodeapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/holdfast-dev/holdfast/agent/admission"
	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
	"github.com/holdfast-dev/holdfast/agent/stats"
)

// Streaming timeouts, the kubelet's defaults (streamingConnectionIdleTimeout, and the CRI
// streaming server's stream creation timeout).
const (
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = remotecommand.DefaultStreamCreationTimeout
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /pods", s.pods)
	mux.HandleFunc("GET /containerLogs/{ns}/{pod}/{container}", s.containerLogs)
	for _, p := range []string{"/exec/{ns}/{pod}/{container}", "/exec/{ns}/{pod}/{uid}/{container}"} {
		mux.HandleFunc("GET "+p, s.exec)
		mux.HandleFunc("POST "+p, s.exec)
	}
	for _, p := range []string{"/attach/{ns}/{pod}/{container}", "/attach/{ns}/{pod}/{uid}/{container}"} {
		mux.HandleFunc("GET "+p, s.attach)
		mux.HandleFunc("POST "+p, s.attach)
	}
	for _, p := range []string{"/portForward/{ns}/{pod}", "/portForward/{ns}/{pod}/{uid}"} {
		mux.HandleFunc("GET "+p, s.portForward)
		mux.HandleFunc("POST "+p, s.portForward)
	}
	if s.cfg.Stats != nil {
		mux.HandleFunc("GET /stats/summary", s.statsSummary)
		mux.HandleFunc("POST /stats/summary", s.statsSummary)
		mux.Handle("GET /metrics/resource", stats.ResourceMetricsHandler(s.cfg.Stats, s.cfg.Log))
	}
	if s.cfg.Metrics != nil {
		mux.Handle("GET /metrics", s.cfg.Metrics)
	}
	return mux
}

// restart asks for the pod's containers to be restarted (local socket only).
func (s *Server) restart(w http.ResponseWriter, r *http.Request) {
	pod, err := s.findPod(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if s.cfg.Restart == nil {
		writeError(w, errorf(http.StatusNotImplemented, "restart is not available"))
		return
	}
	if err := s.cfg.Restart(pod.UID, "restarted with holdfast restart (local API)"); err != nil {
		writeError(w, errorf(http.StatusConflict, "restart %s/%s: %v", pod.Namespace, pod.Name, err))
		return
	}
	fmt.Fprintf(w, "pod %s/%s: its running containers are stopped and start again by their restart policy\n", pod.Namespace, pod.Name)
}

// Description is what GET /describe/NS/POD answers on the local socket: the pod as the agent
// runs it (spec and the status it computed), its admission decision, and the agent's recent
// events about it, all from the agent's memory, with no apiserver.
type Description struct {
	Pod       *v1.Pod           `json:"pod"`
	Admission *admission.Result `json:"admission,omitempty"`
	Events    []v1.Event        `json:"events,omitempty"`
}

func (s *Server) describe(w http.ResponseWriter, r *http.Request) {
	pod, err := s.findPod(r)
	if err != nil {
		writeError(w, err)
		return
	}
	d := Description{Pod: pod}
	if s.cfg.Admission != nil {
		if a, ok := s.cfg.Admission(pod.UID); ok {
			d.Admission = &a
		}
	}
	if s.cfg.Events != nil {
		d.Events = s.cfg.Events(pod.UID)
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(d); err != nil {
		s.cfg.Log.Debug("write description", "err", err)
	}
}

// statsSummary serves the kubelet's Summary API. only_cpu_and_memory=true (as older
// metrics-server asks) leaves out file systems and networks.
func (s *Server) statsSummary(w http.ResponseWriter, r *http.Request) {
	sum, err := s.cfg.Stats.Summary(r.Context())
	if err != nil {
		writeError(w, fmt.Errorf("measure the node: %w", err))
		return
	}
	if r.URL.Query().Get("only_cpu_and_memory") == "true" {
		sum.Node.Fs, sum.Node.Runtime, sum.Node.Network = nil, nil, nil
		for i := range sum.Pods {
			sum.Pods[i].Network, sum.Pods[i].EphemeralStorage, sum.Pods[i].VolumeStats = nil, nil, nil
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(sum); err != nil {
		s.cfg.Log.Debug("write stats summary", "err", err)
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Healthy != nil {
		if err := s.cfg.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	fmt.Fprint(w, "ok")
}

func (s *Server) pods(w http.ResponseWriter, r *http.Request) {
	list := v1.PodList{TypeMeta: typeMeta("PodList")}
	for _, p := range s.cfg.Pods.Pods() {
		p.TypeMeta = typeMeta("Pod")
		list.Items = append(list.Items, *p)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&list)
}

// httpError is an error with the HTTP status it answers.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func errorf(code int, format string, args ...any) error {
	return &httpError{code: code, msg: fmt.Sprintf(format, args...)}
}

func writeError(w http.ResponseWriter, err error) {
	var he *httpError
	if errors.As(err, &he) {
		http.Error(w, he.msg, he.code)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// target is the pod, and optionally the container, a request names.
type target struct {
	pod       *v1.Pod
	container *runtime.Container // the latest attempt, or the previous one when asked
}

// findTarget resolves the path's pod and container (findPod, findContainer). When it cannot,
// it writes the error and returns false.
func (s *Server) findTarget(w http.ResponseWriter, r *http.Request, previous bool) (target, bool) {
	pod, err := s.findPod(r)
	if err != nil {
		writeError(w, err)
		return target{}, false
	}
	c, err := s.findContainer(r.Context(), pod, r.PathValue("container"), previous)
	if err != nil {
		writeError(w, err)
		return target{}, false
	}
	return target{pod: pod, container: c}, true
}

// findPod resolves the path's namespace, pod name and optional UID. Names are checked as
// Kubernetes names first: nothing else reaches the lookup.
func (s *Server) findPod(r *http.Request) (*v1.Pod, error) {
	ns, name, uid := r.PathValue("ns"), r.PathValue("pod"), r.PathValue("uid")
	if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		return nil, errorf(http.StatusBadRequest, "invalid namespace %q: %s", ns, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return nil, errorf(http.StatusBadRequest, "invalid pod name %q: %s", name, strings.Join(msgs, "; "))
	}
	for _, p := range s.cfg.Pods.Pods() {
		if p.Namespace == ns && p.Name == name && (uid == "" || string(p.UID) == uid) {
			return p, nil
		}
	}
	return nil, errorf(http.StatusNotFound, "pod %q does not exist on node %s", ns+"/"+name, s.cfg.NodeName)
}

// findContainer resolves the container of pod by name: its latest attempt, or with previous
// the one before it (the kubelet's previous terminated container).
func (s *Server) findContainer(ctx context.Context, pod *v1.Pod, name string, previous bool) (*runtime.Container, error) {
	if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
		return nil, errorf(http.StatusBadRequest, "invalid container name %q: %s", name, strings.Join(msgs, "; "))
	}
	declared := false
	for _, c := range pod.Spec.InitContainers {
		declared = declared || c.Name == name
	}
	for _, c := range pod.Spec.Containers {
		declared = declared || c.Name == name
	}
	for _, c := range pod.Spec.EphemeralContainers {
		declared = declared || c.Name == name
	}
	if !declared {
		return nil, errorf(http.StatusNotFound, "container %q not found in pod %q", name, pod.Namespace+"/"+pod.Name)
	}
	all, err := s.cfg.Runtime.ListPod(ctx, string(pod.UID))
	if err != nil {
		return nil, fmt.Errorf("list containers of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	var attempts []runtime.Container
	for _, c := range all {
		if c.Name == name {
			attempts = append(attempts, c)
		}
	}
	sort.Slice(attempts, func(i, j int) bool { return attempts[i].Attempt > attempts[j].Attempt })
	idx := 0
	if previous {
		idx = 1
	}
	if len(attempts) <= idx {
		if previous {
			return nil, errorf(http.StatusBadRequest, "previous terminated container %q in pod %q not found", name, pod.Namespace+"/"+pod.Name)
		}
		return nil, errorf(http.StatusBadRequest, "container %q in pod %q is waiting to start: no container has been created yet", name, pod.Namespace+"/"+pod.Name)
	}
	c := attempts[idx]
	return &c, nil
}

// logOptions parses kubelet's /containerLogs query (v1.PodLogOptions) and checks it as the
// apiserver validates PodLogOptions.
func logOptions(q url.Values, now time.Time) (opts logs.ReadOptions, previous bool, err error) {
	opts.TailLines = -1
	boolParam := func(name string) (bool, error) {
		v := q.Get(name)
		if v == "" {
			return false, nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("%s=%q: not a boolean", name, v)
		}
		return b, nil
	}
	intParam := func(name string, min int64) (int64, bool, error) {
		v := q.Get(name)
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < min {
			return 0, false, fmt.Errorf("%s=%q: want an integer of at least %d", name, v, min)
		}
		return n, true, nil
	}
	if opts.Follow, err = boolParam("follow"); err != nil {
		return opts, false, err
	}
	if previous, err = boolParam("previous"); err != nil {
		return opts, false, err
	}
	if opts.Timestamps, err = boolParam("timestamps"); err != nil {
		return opts, false, err
	}
	if n, ok, err := intParam("tailLines", 0); err != nil {
		return opts, false, err
	} else if ok {
		opts.TailLines = n
	}
	if n, _, err := intParam("limitBytes", 1); err != nil {
		return opts, false, err
	} else {
		opts.LimitBytes = n
	}
	secs, hasSecs, err := intParam("sinceSeconds", 1)
	if err != nil {
		return opts, false, err
	}
	sinceTime := q.Get("sinceTime")
	if hasSecs && sinceTime != "" {
		return opts, false, errors.New("at most one of sinceTime or sinceSeconds may be specified")
	}
	if hasSecs {
		opts.Since = now.Add(-time.Duration(secs) * time.Second)
	}
	if sinceTime != "" {
		t, err := time.Parse(time.RFC3339, sinceTime)
		if err != nil {
			return opts, false, fmt.Errorf("sinceTime=%q: not an RFC 3339 time", sinceTime)
		}
		opts.Since = t
	}
	return opts, previous, nil
}

func (s *Server) containerLogs(w http.ResponseWriter, r *http.Request) {
	opts, previous, err := logOptions(r.URL.Query(), s.cfg.Now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tg, ok := s.findTarget(w, r, previous)
	if !ok {
		return
	}
	pod, c := tg.pod, tg.container
	if c.LogPath == "" {
		http.Error(w, fmt.Sprintf("container %q in pod %q has no log", c.Name, pod.Namespace+"/"+pod.Name), http.StatusNotFound)
		return
	}
	release, ok := s.acquireStream(w)
	if !ok {
		return
	}
	defer release()
	if opts.Follow && c.State == runtime.StateRunning {
		id, uid := c.ID, string(pod.UID)
		opts.Running = func() bool { return s.running(r.Context(), uid, id) }
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// The first byte commits the 200; an error after it can only end the body early.
	cw := &committedWriter{w: w}
	if err := logs.Read(r.Context(), c.LogPath, opts, cw); err != nil {
		s.cfg.Log.Warn("node API: read container log", "pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "err", err)
		if !cw.written {
			code := http.StatusInternalServerError
			if errors.Is(err, logs.ErrUnsafePath) {
				code = http.StatusForbidden
			} else if errors.Is(err, fs.ErrNotExist) {
				code = http.StatusNotFound
			}
			http.Error(w, fmt.Sprintf("read log of container %q in pod %q: %v", c.Name, pod.Namespace+"/"+pod.Name, err), code)
		}
	}
}

func typeMeta(kind string) metav1.TypeMeta { return metav1.TypeMeta{APIVersion: "v1", Kind: kind} }

// running reports whether the container still runs (a follow ends when it does not).
func (s *Server) running(ctx context.Context, podUID, id string) bool {
	cs, err := s.cfg.Runtime.ListPod(ctx, podUID)
	if err != nil {
		return true // unknown: keep following; the request's end stops it anyway
	}
	for _, c := range cs {
		if c.ID == id {
			return c.State == runtime.StateRunning
		}
	}
	return false
}

// committedWriter remembers whether anything was written, and passes Flush on.
type committedWriter struct {
	w       http.ResponseWriter
	written bool
}

func (c *committedWriter) Write(p []byte) (int, error) {
	c.written = c.written || len(p) > 0
	return c.w.Write(p)
}

func (c *committedWriter) Flush() {
	if f, ok := c.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	cmd := r.URL.Query()["command"]
	if len(cmd) == 0 {
		http.Error(w, "no command given (command=...)", http.StatusBadRequest)
		return
	}
	s.serveStream(w, r, func(tg target, opts *remotecommand.Options) {
		pod, c := tg.pod, tg.container
		remotecommand.ServeExec(hijackCloser(w, r), r, &streamer{rt: s.cfg.Runtime, id: c.ID}, pod.Namespace+"/"+pod.Name, string(pod.UID), c.Name, cmd, opts,
			streamIdleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
	})
}

// attach connects the client to a running container's main process (kubectl attach): its
// output, and with stdin: true in the container's spec its stdin.
func (s *Server) attach(w http.ResponseWriter, r *http.Request) {
	s.serveStream(w, r, func(tg target, opts *remotecommand.Options) {
		pod, c := tg.pod, tg.container
		if opts.Stdin && !declaresStdin(pod, c.Name) {
			http.Error(w, fmt.Sprintf("container %q in pod %q has no stdin to attach to: its spec does not set stdin: true", c.Name, pod.Namespace+"/"+pod.Name), http.StatusBadRequest)
			return
		}
		remotecommand.ServeAttach(hijackCloser(w, r), r, &streamer{rt: s.cfg.Runtime, id: c.ID}, pod.Namespace+"/"+pod.Name, string(pod.UID), c.Name, opts,
			streamIdleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
	})
}

// serveStream is what exec and attach share before the upgrade: the stream options, the
// container, which must be running, and a stream slot.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request, serve func(target, *remotecommand.Options)) {
	streamOpts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tg, ok := s.findTarget(w, r, false)
	if !ok {
		return
	}
	pod, c := tg.pod, tg.container
	if c.State != runtime.StateRunning {
		http.Error(w, fmt.Sprintf("container %q in pod %q is not running (%s)", c.Name, pod.Namespace+"/"+pod.Name, c.State), http.StatusBadRequest)
		return
	}
	release, ok := s.acquireStream(w)
	if !ok {
		return
	}
	defer release()
	serve(tg, streamOpts)
}

// declaresStdin reports whether pod's container name sets stdin: true.
func declaresStdin(pod *v1.Pod, name string) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return c.Stdin
		}
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == name {
			return c.Stdin
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if c.Name == name {
			return c.Stdin
		}
	}
	return false
}

// streamer runs one exec or attach request in the container resolved before the upgrade.
type streamer struct {
	rt Runtime
	id string
}

func (e *streamer) ExecInContainer(ctx context.Context, _, _, _ string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	streams, stop := execStreams(in, out, errw, tty, resize)
	defer stop()
	code, err := e.rt.ExecStream(ctx, e.id, cmd, streams)
	if err != nil {
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: code}
	}
	return nil
}

func (e *streamer) AttachContainer(ctx context.Context, _, _, _ string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	streams, stop := execStreams(in, out, errw, tty, resize)
	defer stop()
	return e.rt.Attach(ctx, e.id, streams)
}

// execStreams turns the streams remotecommand hands over into the runtime's. stop ends the
// resize relay and closes the output streams (the client sees their end): call it when the
// command or attach is over.
func execStreams(in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) (runtime.ExecStreams, func()) {
	streams := runtime.ExecStreams{Stdin: in, TTY: tty}
	// Typed nils must not reach the runtime as non-nil writers.
	if out != nil {
		streams.Stdout = out
	}
	if errw != nil {
		streams.Stderr = errw
	}
	done := make(chan struct{})
	var relay sync.WaitGroup
	if resize != nil {
		sizes := make(chan runtime.TerminalSize)
		streams.Resize = sizes
		relay.Add(1)
		go func() { // ends with stop (done) or with resize
			defer relay.Done()
			for {
				select {
				case sz, ok := <-resize:
					if !ok {
						return
					}
					select {
					case sizes <- runtime.TerminalSize{Width: sz.Width, Height: sz.Height}:
					case <-done:
						return
					}
				case <-done:
					return
				}
			}
		}()
	}
	return streams, func() {
		close(done)
		relay.Wait()
		if out != nil {
			out.Close()
		}
		if errw != nil {
			errw.Close()
		}
	}
}

func (s *Server) portForward(w http.ResponseWriter, r *http.Request) {
	opts, err := portforward.NewV4Options(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	pod, err := s.findPod(r)
	if err != nil {
		writeError(w, err)
		return
	}
	netns := ""
	if !pod.Spec.HostNetwork {
		if s.cfg.NetNS != nil {
			netns = s.cfg.NetNS(string(pod.UID))
		}
		if netns == "" {
			// Never the host's ports in place of the pod's.
			http.Error(w, fmt.Sprintf("pod %q has no network namespace yet", pod.Namespace+"/"+pod.Name), http.StatusServiceUnavailable)
			return
		}
	}
	release, ok := s.acquireStream(w)
	if !ok {
		return
	}
	defer release()
	pf := &forwarder{netns: netns}
	portforward.ServePortForward(hijackCloser(w, r), r, pf, pod.Namespace+"/"+pod.Name, string(pod.UID), opts,
		streamIdleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
}

// forwarder copies a port-forward stream to and from a port on the pod's loopback.
type forwarder struct {
	netns string // "": the host's network (a hostNetwork pod)
}

func (f *forwarder) PortForward(ctx context.Context, _, _ string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	if port <= 0 || port > 65535 {
		return fmt.Errorf("invalid port %d", port)
	}
	conn, err := dialInNetNS(ctx, f.netns, net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("port forward to port %d: %w", port, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close(); stream.Close() })
	defer stop()
	done := make(chan struct{})
	go func() { // ends when either side closes: both are closed below
		defer close(done)
		_, _ = io.Copy(conn, stream)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	_, _ = io.Copy(stream, conn)
	stream.Close()
	conn.Close()
	<-done
	return nil
}

// hijackCloser wraps w so that a connection hijacked for SPDY or WebSocket is closed when the
// request's context ends (the agent stopping): the streaming handlers then return.
func hijackCloser(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	return &closingHijacker{ResponseWriter: w, ctx: r.Context()}
}

type closingHijacker struct {
	http.ResponseWriter
	ctx context.Context
}

func (c *closingHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := c.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("connection cannot be hijacked")
	}
	conn, rw, err := h.Hijack()
	if err == nil {
		context.AfterFunc(c.ctx, func() { conn.Close() })
	}
	return conn, rw, err
}

func (c *closingHijacker) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
