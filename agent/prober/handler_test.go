package prober

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// target builds an attempt on a local server: the pod's IP is loopback.
func target(p *v1.Probe, c v1.Container) Target {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "edge", UID: "u1"}, Spec: v1.PodSpec{Containers: []v1.Container{c}}}
	return Target{Pod: pod, Container: &pod.Spec.Containers[0], ContainerID: "c1", Kind: Readiness, Probe: p, PodIP: "127.0.0.1", Timeout: time.Second}
}

func probeCtx(t *testing.T, tg Target) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), tg.Timeout)
	t.Cleanup(cancel)
	return ctx
}

func serverPort(t *testing.T, rawURL string) int {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}

func TestHTTPGet(t *testing.T) {
	var mu sync.Mutex
	var lastReq *http.Request
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		lastReq = r.Clone(context.Background())
		mu.Unlock()
		fmt.Fprint(w, "fine")
	})
	mux.HandleFunc("/missing", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "secret detail", http.StatusNotFound) })
	mux.HandleFunc("/local-redirect", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	port := serverPort(t, srv.URL)
	// Another host: the same server under the name localhost.
	mux.HandleFunc("/away", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://localhost:"+strconv.Itoa(port)+"/ok", http.StatusMovedPermanently)
	})
	tlsSrv := httptest.NewTLSServer(mux)
	defer tlsSrv.Close()

	named := v1.Container{Name: "app", Ports: []v1.ContainerPort{{Name: "http", ContainerPort: int32(port)}}}
	get := func(path string, mod func(*v1.HTTPGetAction)) *v1.Probe {
		a := &v1.HTTPGetAction{Path: path, Port: intstr.FromInt32(int32(port))}
		if mod != nil {
			mod(a)
		}
		return &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: a}}
	}
	cases := []struct {
		name    string
		probe   *v1.Probe
		timeout time.Duration
		want    Outcome
		output  string // substring
		err     string // substring of the error, if errored
	}{
		{name: "200", probe: get("/ok", nil), want: Success, output: "fine"},
		{name: "404, body kept out", probe: get("/missing", nil), want: Failure, output: "HTTP probe failed with statuscode: 404"},
		{name: "redirect on the same host followed", probe: get("/local-redirect", nil), want: Success, output: "fine"},
		{name: "redirect to another host not followed", probe: get("/away", nil), want: Warning, output: "Probe terminated redirects"},
		{name: "redirect loop", probe: get("/loop", nil), want: Failure, output: "stopped after 10 redirects"},
		{name: "timeout", probe: get("/slow", nil), timeout: 200 * time.Millisecond, want: Failure, output: "context deadline exceeded"},
		{name: "named port", probe: get("/ok", func(a *v1.HTTPGetAction) { a.Port = intstr.FromString("http") }), want: Success},
		{name: "port as a numeric string", probe: get("/ok", func(a *v1.HTTPGetAction) { a.Port = intstr.FromString(strconv.Itoa(port)) }), want: Success},
		{name: "unknown port name", probe: get("/ok", func(a *v1.HTTPGetAction) { a.Port = intstr.FromString("metrics") }), err: `port "metrics" not found`},
		{name: "explicit host", probe: get("/ok", func(a *v1.HTTPGetAction) { a.Host = "127.0.0.1" }), want: Success},
		{name: "path with query", probe: get("/ok?verbose=1", nil), want: Success},
		{name: "https without verification", probe: get("/ok", func(a *v1.HTTPGetAction) {
			a.Scheme = v1.URISchemeHTTPS
			a.Port = intstr.FromInt32(int32(serverPort(t, tlsSrv.URL)))
		}), want: Success},
		{name: "refused", probe: get("/ok", func(a *v1.HTTPGetAction) { a.Port = intstr.FromInt32(int32(closedPort(t))) }), want: Failure, output: "connection refused"},
	}
	h := &HTTPGetHandler{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tg := target(tc.probe, named)
			if tc.timeout > 0 {
				tg.Timeout = tc.timeout
			}
			got, out, err := h.Probe(probeCtx(t, tg), tg)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || !strings.Contains(out, tc.output) {
				t.Errorf("got %s %q, want %s containing %q", got, out, tc.want, tc.output)
			}
			if strings.Contains(out, "secret detail") {
				t.Errorf("failure message %q carries the body", out)
			}
		})
	}

	t.Run("headers", func(t *testing.T) {
		tg := target(get("/ok", nil), named)
		if _, _, err := h.Probe(probeCtx(t, tg), tg); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		r := lastReq
		mu.Unlock()
		if ua := r.Header.Get("User-Agent"); ua != "kube-probe/1.37" {
			t.Errorf("User-Agent %q, want kube-probe/1.37 (kubelet's, for the Kubernetes version of k8s.io/api)", ua)
		}
		if a := r.Header.Get("Accept"); a != "*/*" {
			t.Errorf("Accept %q", a)
		}
		tg = target(get("/ok", func(a *v1.HTTPGetAction) {
			a.HTTPHeaders = []v1.HTTPHeader{{Name: "Host", Value: "app.example"}, {Name: "User-Agent", Value: "mine"}, {Name: "x-token", Value: "t1"}, {Name: "Accept", Value: ""}}
		}), named)
		if _, _, err := h.Probe(probeCtx(t, tg), tg); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		r = lastReq
		mu.Unlock()
		if r.Host != "app.example" || r.Header.Get("User-Agent") != "mine" || r.Header.Get("X-Token") != "t1" {
			t.Errorf("host %q headers %v", r.Host, r.Header)
		}
		if _, ok := r.Header["Accept"]; ok {
			t.Errorf("an empty Accept header must remove it: %v", r.Header)
		}
	})
}

func closedPort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return p
}

func TestTCPSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	c := v1.Container{Name: "app", Ports: []v1.ContainerPort{{Name: "db", ContainerPort: int32(port)}}}
	tcp := func(p intstr.IntOrString) *v1.Probe {
		return &v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: p}}}
	}
	h := TCPSocketHandler{}
	for _, tc := range []struct {
		name   string
		port   intstr.IntOrString
		podIP  string
		want   Outcome
		output string
		err    string
	}{
		{name: "open", port: intstr.FromInt32(int32(port)), want: Success},
		{name: "named", port: intstr.FromString("db"), want: Success},
		{name: "closed", port: intstr.FromInt32(int32(closedPort(t))), want: Failure, output: "connection refused"},
		{name: "invalid", port: intstr.FromInt32(70000), err: "invalid port number"},
		{name: "no pod IP yet", port: intstr.FromInt32(int32(port)), podIP: "-", err: "no IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := target(tcp(tc.port), c)
			if tc.podIP == "-" {
				tg.PodIP = ""
			}
			got, out, err := h.Probe(probeCtx(t, tg), tg)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want || !strings.Contains(out, tc.output) {
				t.Errorf("got %s %q %v, want %s containing %q", got, out, err, tc.want, tc.output)
			}
		})
	}
}

func TestGRPC(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	defer wg.Wait()
	defer srv.Stop()

	// A gRPC server without the health service.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bare := grpc.NewServer()
	wg.Go(func() { _ = bare.Serve(ln2) })
	defer bare.Stop()

	port := int32(ln.Addr().(*net.TCPAddr).Port)
	probe := func(port int32, service *string) *v1.Probe {
		return &v1.Probe{ProbeHandler: v1.ProbeHandler{GRPC: &v1.GRPCAction{Port: port, Service: service}}}
	}
	db, unknown := "db", "nope"
	h := &GRPCHandler{}
	for _, tc := range []struct {
		name   string
		probe  *v1.Probe
		want   Outcome
		output string
	}{
		{name: "serving", probe: probe(port, nil), want: Success, output: "service is serving"},
		{name: "not serving", probe: probe(port, &db), want: Failure, output: `service unhealthy (responded with "NOT_SERVING")`},
		{name: "unknown service", probe: probe(port, &unknown), want: Failure, output: "NotFound"},
		{name: "no health service", probe: probe(int32(ln2.Addr().(*net.TCPAddr).Port), nil), want: Failure, output: "does not implement the grpc health protocol"},
		{name: "refused", probe: probe(int32(closedPort(t)), nil), want: Failure, output: "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := target(tc.probe, v1.Container{Name: "app"})
			got, out, err := h.Probe(probeCtx(t, tg), tg)
			if err != nil || got != tc.want || !strings.Contains(out, tc.output) {
				t.Errorf("got %s %q %v, want %s containing %q", got, out, err, tc.want, tc.output)
			}
		})
	}
}

type fakeExec struct {
	gotID  string
	gotCmd []string
	gotOpt runtime.ExecOptions
	res    runtime.ExecResult
	err    error
}

func (f *fakeExec) Exec(ctx context.Context, id string, cmd []string, opts runtime.ExecOptions) (runtime.ExecResult, error) {
	f.gotID, f.gotCmd, f.gotOpt = id, cmd, opts
	return f.res, f.err
}

func TestExec(t *testing.T) {
	c := v1.Container{Name: "app", Env: []v1.EnvVar{
		{Name: "FILE", Value: "/tmp/healthy"},
		{Name: "FROM_API", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
	}}
	p := &v1.Probe{ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"cat", "$(FILE)", "$(FROM_API)", "$$(FILE)"}}}}
	for _, tc := range []struct {
		name   string
		res    runtime.ExecResult
		err    error
		want   Outcome
		output string
		errs   string
	}{
		{name: "exit 0", res: runtime.ExecResult{Output: []byte("ok\n")}, want: Success, output: "ok\n"},
		{name: "exit 1 with output", res: runtime.ExecResult{ExitCode: 1, Output: []byte("cat: can't open '/tmp/healthy'")}, want: Failure, output: "can't open"},
		{name: "exit 1 silent", res: runtime.ExecResult{ExitCode: 1}, want: Failure, output: "exited with 1"},
		{name: "timeout", err: fmt.Errorf("%w: slow", runtime.ErrExecTimeout), want: Failure, output: "timed out after 1s"},
		{name: "runtime error", err: errors.New("containerd unreachable"), errs: "containerd unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fe := &fakeExec{res: tc.res, err: tc.err}
			tg := target(p, c)
			got, out, err := (&ExecHandler{Runtime: fe}).Probe(probeCtx(t, tg), tg)
			if tc.errs != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errs) {
					t.Fatalf("err %v", err)
				}
				return
			}
			if err != nil || got != tc.want || !strings.Contains(out, tc.output) {
				t.Errorf("got %s %q %v, want %s containing %q", got, out, err, tc.want, tc.output)
			}
			wantCmd := []string{"cat", "/tmp/healthy", "$(FROM_API)", "$(FILE)"}
			if fe.gotID != "c1" || strings.Join(fe.gotCmd, " ") != strings.Join(wantCmd, " ") || fe.gotOpt.Timeout != time.Second {
				t.Errorf("exec %s %q %+v", fe.gotID, fe.gotCmd, fe.gotOpt)
			}
		})
	}
}

func TestHandlersDispatch(t *testing.T) {
	called := ""
	mk := func(name string) Handler {
		return HandlerFunc(func(context.Context, Target) (Outcome, string, error) {
			called = name
			return Success, "", nil
		})
	}
	h := &Handlers{Exec: mk("exec"), HTTPGet: mk("http"), TCPSocket: mk("tcp"), GRPC: mk("grpc"), Wasm: mk("wasm")}
	for _, tc := range []struct {
		handler v1.ProbeHandler
		want    string
	}{
		{v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"true"}}}, "exec"},
		{v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{}}, "http"},
		{v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{}}, "tcp"},
		{v1.ProbeHandler{GRPC: &v1.GRPCAction{}}, "grpc"},
	} {
		called = ""
		tg := target(&v1.Probe{ProbeHandler: tc.handler}, v1.Container{Name: "app"})
		if _, _, err := h.Probe(context.Background(), tg); err != nil || called != tc.want {
			t.Errorf("%+v went to %q (%v), want %q", tc.handler, called, err, tc.want)
		}
	}
	// No handler at all, or one the node lacks: errored, never a silent success.
	tg := target(&v1.Probe{}, v1.Container{Name: "app"})
	if _, _, err := h.Probe(context.Background(), tg); err == nil {
		t.Error("a probe without a handler must error")
	}
	tg = target(&v1.Probe{ProbeHandler: v1.ProbeHandler{GRPC: &v1.GRPCAction{}}}, v1.Container{Name: "app"})
	if _, _, err := (&Handlers{}).Probe(context.Background(), tg); !errors.Is(err, ErrNoHandler) {
		t.Errorf("err %v, want ErrNoHandler", err)
	}
}
