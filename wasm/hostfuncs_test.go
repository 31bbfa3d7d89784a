package wasm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/wasm"
)

func hostcall(t *testing.T, e *testEngine) *wasm.Module {
	return e.load(t, wasm.Spec{Name: "hostcall", Wasm: wat(t, "hostcall"), Grants: []wasm.Grant{wasm.GrantHTTP, wasm.GrantTCP, wasm.GrantFile}})
}

func port(t testing.TB, rawURL string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(rawURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	fmt.Sscan(p, &n)
	return n
}

func TestHostHTTP(t *testing.T) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "SECRET FROM ANOTHER SERVICE")
	}))
	defer other.Close()
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"status":"ok"}`)
		case "/redirect-away":
			http.Redirect(w, r, other.URL+"/", http.StatusFound)
		case "/big":
			fmt.Fprint(w, strings.Repeat("x", 10000))
		case "/echo":
			b := make([]byte, 100)
			n, _ := r.Body.Read(b)
			fmt.Fprintf(w, "%s %s %s", r.Method, r.Header.Get("X-Probe"), b[:n])
		}
	}))
	defer pod.Close()
	podPort := port(t, pod.URL)
	e := newEngine(t, wasm.Limits{})
	m := hostcall(t, e)
	target := wasm.WithNetwork("127.0.0.1", podPort)
	cases := []struct {
		name   string
		req    string
		opts   []wasm.CallOption
		status float64
		body   string
		code   string
	}{
		{"allowed", `{"url":"` + pod.URL + `/health"}`, []wasm.CallOption{target}, 200, `{"status":"ok"}`, ""},
		{"method, header and body", `{"method":"POST","url":"` + pod.URL + `/echo","headers":{"X-Probe":"yes"},"body":"hello"}`, []wasm.CallOption{target}, 200, "POST yes hello", ""},
		{"truncated", `{"url":"` + pod.URL + `/big","maxBodyBytes":10}`, []wasm.CallOption{target}, 200, "xxxxxxxxxx", ""},
		{"no targets", `{"url":"` + pod.URL + `/health"}`, nil, 0, "", "denied"},
		{"other port", `{"url":"` + other.URL + `/"}`, []wasm.CallOption{target}, 0, "", "denied"},
		{"host name", `{"url":"http://localhost:` + fmt.Sprint(podPort) + `/health"}`, []wasm.CallOption{target}, 0, "", "denied"},
		{"redirect to a non-target", `{"url":"` + pod.URL + `/redirect-away"}`, []wasm.CallOption{target}, 0, "", "denied"},
		{"metadata service", `{"url":"http://169.254.169.254/latest/meta-data"}`, []wasm.CallOption{target}, 0, "", "denied"},
		{"file scheme", `{"url":"file:///etc/passwd"}`, []wasm.CallOption{target}, 0, "", "invalid"},
		{"not json", `GET /`, []wasm.CallOption{target}, 0, "", "invalid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := m.Call(context.Background(), "http", []byte(tc.req), tc.opts...)
			if err != nil {
				// Even a refusal is an answer ({"error":...}), not a failed call.
				t.Fatal(err)
			}
			got := decode(t, out)
			if tc.code != "" {
				if got["code"] != tc.code {
					t.Fatalf("answer %s, want code %q", out, tc.code)
				}
				if strings.Contains(string(out), "SECRET") {
					t.Fatalf("reached a non-target: %s", out)
				}
				return
			}
			if got["status"] != tc.status || got["body"] != tc.body {
				t.Fatalf("answer %s", out)
			}
		})
	}
}

func TestHostTCP(t *testing.T) {
	p := serveTCP(t, func(c net.Conn) {
		buf := make([]byte, 64)
		n, _ := c.Read(buf)
		if strings.HasPrefix(string(buf[:n]), "PING") {
			c.Write([]byte("+PONG\r\nand more that is not read"))
			io.Copy(io.Discard, c) // kept open until the call closes it
		}
	})
	e := newEngine(t, wasm.Limits{})
	m := hostcall(t, e)
	call := func(req string, opts ...wasm.CallOption) map[string]any {
		t.Helper()
		out, err := m.Call(context.Background(), "tcp", []byte(req), opts...)
		if err != nil {
			t.Fatal(err)
		}
		return decode(t, out)
	}
	start := time.Now()
	got := call(fmt.Sprintf(`{"address":"127.0.0.1:%d","send":"PING\r\n","readBytes":100,"readUntil":"\r\n"}`, p), wasm.WithNetwork("127.0.0.1", p))
	if got["connected"] != true || got["received"] != "+PONG\r\n" && !strings.HasPrefix(got["received"].(string), "+PONG\r\n") {
		t.Fatalf("answer %v", got)
	}
	if time.Since(start) > time.Second {
		t.Fatal("readUntil did not stop the read")
	}
	if got := call(fmt.Sprintf(`{"address":"127.0.0.1:%d"}`, p), wasm.WithNetwork("127.0.0.1", p+1)); got["code"] != "denied" {
		t.Fatalf("other port: %v", got)
	}
	if got := call(`{"address":"localhost:22"}`, wasm.WithNetwork("127.0.0.1", 22)); got["code"] != "denied" {
		t.Fatalf("host name: %v", got)
	}
	// A read that waits past its own timeout returns what came, with an error.
	got = call(fmt.Sprintf(`{"address":"127.0.0.1:%d","send":"PING","readBytes":1000,"timeoutMillis":300}`, p), wasm.WithNetwork("127.0.0.1", p))
	if !strings.HasPrefix(got["received"].(string), "+PONG") || got["error"] == nil {
		t.Fatalf("timed-out read: %v", got)
	}
}

func TestHostFiles(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "run/app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "run/app/heartbeat"), []byte("alive"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(rootfs, "run/app/passwd")); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, wasm.Limits{})
	m := hostcall(t, e)
	files := wasm.WithFiles([]string{"/run/app"}, wasm.FileMount{GuestPath: "/", HostPath: rootfs})
	call := func(export, req string, opts ...wasm.CallOption) map[string]any {
		t.Helper()
		out, err := m.Call(context.Background(), export, []byte(req), opts...)
		if err != nil {
			t.Fatal(err)
		}
		return decode(t, out)
	}
	if got := call("read", `{"path":"/run/app/heartbeat"}`, files); got["data"] != "alive" {
		t.Fatalf("read: %v", got)
	}
	if got := call("read", `{"path":"/run/app/heartbeat","maxBytes":2}`, files); got["data"] != "al" || got["truncated"] != true {
		t.Fatalf("read capped: %v", got)
	}
	if got := call("stat", `{"path":"/run/app/heartbeat"}`, files); got["size"] != float64(5) || got["modTimeUnixNano"] == nil {
		t.Fatalf("stat: %v", got)
	}
	if got := call("read", `{"path":"/run/app/passwd"}`, files); got["code"] == nil || strings.Contains(fmt.Sprint(got["data"]), "root:") {
		t.Fatalf("read through an absolute symlink reached the host: %v", got)
	}
	if got := call("read", `{"path":"/etc/passwd"}`, files); got["code"] != "denied" {
		t.Fatalf("read outside prefix: %v", got)
	}
	if got := call("read", `{"path":"/run/app/heartbeat"}`); got["code"] != "denied" {
		t.Fatalf("read without WithFiles: %v", got)
	}
}

// The Go SDK and the examples run against the real host functions.
func TestProbeExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Go policies")
	}
	e := newEngine(t, wasm.Limits{})
	healthStatus := "starting"
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"checks":{"db":{"status":%q}}}`, healthStatus)
	}))
	defer pod.Close()
	tcpPort := serveTCP(t, func(c net.Conn) {
		buf := make([]byte, 16)
		n, _ := c.Read(buf)
		if string(buf[:n]) == "PING\r\n" {
			c.Write([]byte("+PONG\r\n"))
		}
	})
	httpPort := port(t, pod.URL)
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "tmp"), 0o755)
	heartbeat := filepath.Join(rootfs, "tmp/heartbeat")
	os.WriteFile(heartbeat, nil, 0o644)

	probe := func(m *wasm.Module, settings string, opts ...wasm.CallOption) (bool, string) {
		t.Helper()
		in := fmt.Sprintf(`{"pod":{"metadata":{"name":"p"}},"container":"app","podIP":"127.0.0.1","ports":[%d,%d],"settings":%s}`, httpPort, tcpPort, settings)
		out, err := m.Call(context.Background(), "probe", []byte(in), opts...)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Success bool
			Message string
		}
		json.Unmarshal(out, &r)
		return r.Success, r.Message
	}
	targets := wasm.WithNetwork("127.0.0.1", httpPort, tcpPort)

	httpJSON := e.load(t, wasm.Spec{Name: "http-json", Wasm: goModule(t, "policies/examples/probe/http-json"), Grants: []wasm.Grant{wasm.GrantHTTP}, Entrypoints: []string{"probe"}})
	settings := fmt.Sprintf(`{"port":%d,"path":"/health","field":"checks.db.status","equals":"ok"}`, httpPort)
	if ok, msg := probe(httpJSON, settings, targets); ok || !strings.Contains(msg, `"starting"`) {
		t.Fatalf("http-json while starting: %v %s", ok, msg)
	}
	healthStatus = "ok"
	if ok, msg := probe(httpJSON, settings, targets); !ok {
		t.Fatalf("http-json when ok: %s", msg)
	}
	if ok, msg := probe(httpJSON, settings); ok || !strings.Contains(msg, "denied") {
		t.Fatalf("http-json with no targets: %v %s", ok, msg)
	}

	tcp := e.load(t, wasm.Spec{Name: "tcp", Wasm: goModule(t, "policies/examples/probe/tcp-request-response"), Grants: []wasm.Grant{wasm.GrantTCP}, Entrypoints: []string{"probe"}})
	if ok, msg := probe(tcp, fmt.Sprintf(`{"port":%d,"send":"PING\r\n","expect":"+PONG"}`, tcpPort), targets); !ok {
		t.Fatalf("tcp: %s", msg)
	}
	if ok, _ := probe(tcp, fmt.Sprintf(`{"port":%d,"send":"HELLO\r\n","expect":"+PONG"}`, tcpPort), targets); ok {
		t.Fatal("tcp: wrong answer succeeded")
	}

	hbSettings := `{"path":"/tmp/heartbeat","maxAgeSeconds":30}`
	files := wasm.WithFiles([]string{"/tmp"}, wasm.FileMount{GuestPath: "/", HostPath: rootfs})
	hb := e.load(t, wasm.Spec{Name: "heartbeat", Wasm: goModule(t, "policies/examples/probe/heartbeat-file"), Grants: []wasm.Grant{wasm.GrantFile, wasm.GrantClock}, Entrypoints: []string{"probe"}})
	if ok, msg := probe(hb, hbSettings, files); !ok {
		t.Fatalf("fresh heartbeat: %s", msg)
	}
	old := time.Now().Add(-time.Minute)
	os.Chtimes(heartbeat, old, old)
	if ok, msg := probe(hb, hbSettings, files); ok || !strings.Contains(msg, "more than 30s") {
		t.Fatalf("stale heartbeat: %v %s", ok, msg)
	}
	noClock := e.load(t, wasm.Spec{Name: "heartbeat-noclock", Wasm: goModule(t, "policies/examples/probe/heartbeat-file"), Grants: []wasm.Grant{wasm.GrantFile}})
	if ok, msg := probe(noClock, hbSettings, files); ok || !strings.Contains(msg, `grant it "clock"`) {
		t.Fatalf("heartbeat without clock: %v %s", ok, msg)
	}
	_, err := e.Load(context.Background(), wasm.Spec{Name: "heartbeat-nofile", Wasm: goModule(t, "policies/examples/probe/heartbeat-file"), Grants: []wasm.Grant{wasm.GrantClock}})
	wantKind(t, err, wasm.ErrUngrantedImport)
}

func TestAdmissionExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Go policies")
	}
	e := newEngine(t, wasm.Limits{})
	cases := []struct {
		pkg      string
		settings string
		pod      string
		reason   string
	}{
		{"allowed-registries", `{"registries":["docker.io/library"]}`, `{"spec":{"containers":[{"name":"a","image":"nginx:1.27"}]}}`, ""},
		{"allowed-registries", `{"registries":["docker.io/library"]}`, `{"spec":{"containers":[{"name":"a","image":"ghcr.io/x/y"}]}}`, "RegistryNotAllowed"},
		{"no-privileged-or-hostpath", `{}`, `{"spec":{"containers":[{"name":"a","securityContext":{"privileged":true}}]}}`, "Privileged"},
		{"no-privileged-or-hostpath", `{}`, `{"spec":{"containers":[{"name":"a"}],"volumes":[{"name":"v","hostPath":{"path":"/"}}]}}`, "HostPath"},
		{"no-privileged-or-hostpath", `{}`, `{"spec":{"containers":[{"name":"a"}],"volumes":[{"name":"v","emptyDir":{}}]}}`, ""},
		{"resource-caps", `{"maxMemory":"1Gi"}`, `{"spec":{"containers":[{"name":"a","resources":{"limits":{"memory":"2Gi"}}}]}}`, "ResourceCapExceeded"},
		{"resource-caps", `{"maxMemory":"1Gi"}`, `{"spec":{"containers":[{"name":"a","resources":{"limits":{"memory":"512Mi"}}}]}}`, ""},
	}
	mods := map[string]*wasm.Module{}
	for _, tc := range cases {
		m, ok := mods[tc.pkg]
		if !ok {
			m = e.load(t, wasm.Spec{Name: tc.pkg, Wasm: goModule(t, "policies/examples/admission/"+tc.pkg), Entrypoints: []string{"admit"}})
			mods[tc.pkg] = m
		}
		out, err := m.Call(context.Background(), "admit", []byte(`{"pod":`+tc.pod+`,"node":{"name":"n","allocatable":{"cpu":"4"}},"settings":`+tc.settings+`}`))
		if err != nil {
			t.Fatal(err)
		}
		got := decode(t, out)
		if (tc.reason == "") != (got["allowed"] == true) || tc.reason != "" && got["reason"] != tc.reason {
			t.Errorf("%s on %s: %s, want reason %q", tc.pkg, tc.pod, out, tc.reason)
		}
	}
}
