package nodeapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/holdfast-dev/holdfast/agent/kube/kubetest"
	"github.com/holdfast-dev/holdfast/agent/logs"
	"github.com/holdfast-dev/holdfast/agent/runtime"
)

// TestRequestAttributes: the kubelet's verb and subresource mapping.
func TestRequestAttributes(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         []attributes
	}{
		{"GET", "/containerLogs/default/web/app", []attributes{{"get", "proxy"}}},
		{"POST", "/exec/default/web/app", []attributes{{"create", "proxy"}}},
		{"GET", "/exec/default/web/app", []attributes{{"create", "proxy"}}},
		{"GET", "/attach/default/web/app", []attributes{{"create", "proxy"}}},
		{"HEAD", "/portForward/default/web", []attributes{{"create", "proxy"}}},
		{"GET", "/pods/../exec/default/web/app", []attributes{{"create", "proxy"}}},
		{"GET", "/execute", []attributes{{"get", "proxy"}}},
		{"POST", "/portForward/default/web", []attributes{{"create", "proxy"}}},
		{"GET", "/pods", []attributes{{"get", "pods"}, {"get", "proxy"}}},
		{"GET", "/pods/", []attributes{{"get", "pods"}, {"get", "proxy"}}},
		{"GET", "/podsx", []attributes{{"get", "proxy"}}},
		{"GET", "/healthz", []attributes{{"get", "healthz"}, {"get", "proxy"}}},
		{"GET", "/stats/summary", []attributes{{"get", "stats"}}},
		{"GET", "/metrics", []attributes{{"get", "metrics"}}},
		{"GET", "/metrics/resource", []attributes{{"get", "metrics"}}},
		{"GET", "/logs/syslog", []attributes{{"get", "log"}}},
		{"DELETE", "/checkpoint/x", []attributes{{"delete", "checkpoint"}}},
	} {
		if got := requestAttributes(tc.method, tc.path); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s %s: got %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
}

// TestLogOptions: the /containerLogs query, checked as the apiserver checks PodLogOptions.
func TestLogOptions(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	opts, prev, err := logOptions(url.Values{"follow": {"true"}, "previous": {"1"}, "tailLines": {"10"}, "limitBytes": {"100"}, "sinceSeconds": {"60"}, "timestamps": {"true"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if !opts.Follow || !prev || opts.TailLines != 10 || opts.LimitBytes != 100 || !opts.Since.Equal(now.Add(-time.Minute)) || !opts.Timestamps {
		t.Errorf("got %+v previous=%v", opts, prev)
	}
	opts, _, err = logOptions(url.Values{"sinceTime": {"2026-12-03T11:00:00Z"}}, now)
	if err != nil || !opts.Since.Equal(now.Add(-time.Hour)) || opts.TailLines != -1 {
		t.Errorf("sinceTime: %+v, %v", opts, err)
	}
	for _, bad := range []url.Values{
		{"tailLines": {"-1"}},
		{"limitBytes": {"0"}},
		{"sinceSeconds": {"0"}},
		{"sinceSeconds": {"5"}, "sinceTime": {"2026-12-03T11:00:00Z"}},
		{"sinceTime": {"yesterday"}},
		{"follow": {"maybe"}},
	} {
		if _, _, err := logOptions(bad, now); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// fakeRuntime answers ListPod from a fixed list.
type fakeRuntime struct{ containers []runtime.Container }

func (f *fakeRuntime) ListPod(_ context.Context, uid string) ([]runtime.Container, error) {
	var out []runtime.Container
	for _, c := range f.containers {
		if c.PodUID == uid {
			out = append(out, c)
		}
	}
	return out, nil
}

func (f *fakeRuntime) ExecStream(context.Context, string, []string, runtime.ExecStreams) (int, error) {
	return 0, errors.New("not in unit tests")
}

func (f *fakeRuntime) Attach(context.Context, string, runtime.ExecStreams) error {
	return errors.New("not in unit tests")
}

type fakePods []*v1.Pod

func (p fakePods) Pods() []*v1.Pod {
	var out []*v1.Pod
	for _, x := range p {
		out = append(out, x.DeepCopy())
	}
	return out
}

// apiReviews makes the fake clientset answer TokenReviews (token "good" is user alice, "bad"
// is not authenticated) and SubjectAccessReviews (alice may get and create nodes/proxy; bob,
// from a client certificate, may do nothing), or fail as an unreachable apiserver when down.
func apiReviews(down *atomic.Bool, reviews *atomic.Int32) *fake.Clientset {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		reviews.Add(1)
		if down.Load() {
			return true, nil, errors.New("connection refused")
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if tr.Spec.Token == "good" {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "alice", Groups: []string{"ops"}}}
		}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		reviews.Add(1)
		if down.Load() {
			return true, nil, errors.New("connection refused")
		}
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		ra := sar.Spec.ResourceAttributes
		sar.Status.Allowed = sar.Spec.User == "alice" && ra.Resource == "nodes" && ra.Name == "gw" && ra.Subresource == "proxy"
		return true, sar, nil
	})
	return cs
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return testCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca testCA) client(t *testing.T, cn string, groups ...string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn, Organization: groups}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestAuth: anonymous 401, unknown token 401, a token without the right 403, a certificate of
// another CA 401, the right client gets through; with the apiserver down, cached decisions
// stand and a new token is refused (fail closed).
func TestAuth(t *testing.T) {
	var down atomic.Bool
	var reviews atomic.Int32
	ca, other := newCA(t), newCA(t)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"}}
	s, err := New(Config{NodeName: "gw", PKIDir: dir, ClientCAFile: caFile, Client: kubetest.Wrap(apiReviews(&down, &reviews)),
		Pods: fakePods{pod}, Runtime: &fakeRuntime{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	defer srv.Close()

	get := func(path, token string, cert *tls.Certificate) (int, string) {
		t.Helper()
		tr := srv.Client().Transport.(*http.Transport).Clone()
		if cert != nil {
			tr.TLSClientConfig.Certificates = []tls.Certificate{*cert}
		}
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	alienCert := other.client(t, "alice")
	bobCert := ca.client(t, "bob", "system:masters")
	for _, tc := range []struct {
		name   string
		token  string
		cert   *tls.Certificate
		status int
	}{
		{"anonymous", "", nil, 401},
		{"unknown token", "bad", nil, 401},
		{"certificate of another CA", "", &alienCert, 401},
		{"certificate without the right", "", &bobCert, 403},
		{"token with the right", "good", nil, 200},
	} {
		if code, body := get("/pods", tc.token, tc.cert); code != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.status)
		}
	}
	// Every path the network side serves, and any other, asks for credentials first; the
	// local socket's operations are not there at all.
	for _, path := range []string{"/", "/healthz", "/pods", "/containerLogs/default/web/app", "/exec/default/web/app?command=id&output=1",
		"/attach/default/web/app?output=1", "/portForward/default/web", "/stats/summary", "/metrics/resource", "/metrics",
		"/describe/default/web", "/restart/default/web", "/configz", "/debug/pprof/", "/runningpods/"} {
		if code, body := get(path, "", nil); code != http.StatusUnauthorized {
			t.Errorf("anonymous %s: %d %s, want 401", path, code, body)
		}
	}
	for _, path := range []string{"/describe/default/web", "/configz", "/debug/pprof/"} {
		if code, body := get(path, "good", nil); code != http.StatusNotFound {
			t.Errorf("%s over the network: %d %s, want 404", path, code, body)
		}
	}
	code, body := get("/pods", "good", nil)
	var list v1.PodList
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || len(list.Items) != 1 || list.Items[0].Name != "web" || list.Kind != "PodList" {
		t.Errorf("/pods: %d %s", code, body)
	}

	down.Store(true)
	before := reviews.Load()
	if code, body := get("/pods", "good", nil); code != 200 {
		t.Errorf("cached token and decision with the apiserver down: %d %s", code, body)
	}
	if reviews.Load() != before {
		t.Errorf("the cache was not used: %d more reviews", reviews.Load()-before)
	}
	if code, body := get("/pods", "new-token", nil); code != http.StatusServiceUnavailable {
		t.Errorf("new token with the apiserver down: %d %s, want 503", code, body)
	}
}

// TestBadInput: names are checked before use, unknown pods and containers are 404, and a
// container that does not run cannot be exec'd into.
func TestBadInput(t *testing.T) {
	var down atomic.Bool
	var reviews atomic.Int32
	dir := t.TempDir()
	logPath := filepath.Join(dir, "logs", "default_web_u1", "app", "0.log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(logPath, logs.AppendLine(nil, time.Now(), logs.Stdout, false, []byte("hello")), 0o644); err != nil {
		t.Fatal(err)
	}
	// A container's log file replaced by a symlink to a host file: refused, never followed.
	linkedLog := filepath.Join(dir, "logs", "default_web_u1", "linked", "0.log")
	if err := os.MkdirAll(filepath.Dir(linkedLog), 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "host-secret")
	if err := os.WriteFile(secret, logs.AppendLine(nil, time.Now(), logs.Stdout, false, []byte("host secret")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, linkedLog); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app"}, {Name: "side"}, {Name: "linked"}, {Name: "live"}}}}
	rt := &fakeRuntime{containers: []runtime.Container{
		{ID: "c0", PodUID: "u1", Name: "app", Attempt: 0, State: runtime.StateExited, LogPath: logPath},
		{ID: "c1", PodUID: "u1", Name: "linked", Attempt: 0, State: runtime.StateExited, LogPath: linkedLog},
		{ID: "c2", PodUID: "u1", Name: "live", Attempt: 0, State: runtime.StateRunning, LogPath: logPath},
	}}
	s, err := New(Config{NodeName: "gw", PKIDir: dir, Client: kubetest.Wrap(apiReviews(&down, &reviews)), Pods: fakePods{pod}, Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		status       int
		body         string
	}{
		{"GET", "/containerLogs/default/web/app", 200, "hello\n"},
		{"GET", "/containerLogs/default/web/app?previous=true", 400, "previous terminated container"},
		{"GET", "/containerLogs/default/nope/app", 404, "does not exist"},
		{"GET", "/containerLogs/default/web/nope", 404, "not found"},
		{"GET", "/containerLogs/default/web/side", 400, "waiting to start"},
		// Refused before the handler, whose name checks the local socket's requests meet.
		{"GET", "/containerLogs/default/web%2F..%2F..%2Fetc/app", 400, "an escaped slash in the path"},
		{"GET", "/containerLogs/default/web/..%2F..%2Fetc", 400, "an escaped slash in the path"},
		{"GET", "/containerLogs/default/web/%2E%2E/app", 400, "a . or .. segment"},
		{"GET", "/containerLogs/default/web/app?tailLines=-5", 400, "tailLines"},
		{"POST", "/exec/default/web/app?command=sh&output=1", 400, "not running"},
		{"POST", "/exec/default/web/app?output=1", 400, "no command"},
		{"GET", "/containerLogs/default/web/linked", 403, "symlink"},
		{"POST", "/attach/default/web/app?output=1", 400, "not running"},
		{"POST", "/attach/default/web/live?input=1&output=1", 400, "does not set stdin: true"},
		{"POST", "/portForward/default/web", 503, "no network namespace"},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		req.Header.Set("Authorization", "Bearer good")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.body) {
			t.Errorf("%s %s: %d %q, want %d with %q", tc.method, tc.path, resp.StatusCode, b, tc.status, tc.body)
		}
	}
}

// TestServingCertificate: self-signed, naming the node and its addresses, kept across starts,
// remade when an address is new.
func TestServingCertificate(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ips := []net.IP{net.ParseIP("192.0.2.7")}
	c1, err := servingCertificate(dir, []string{"gw"}, ips, now)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(c1.Certificate[0])
	if err := leaf.VerifyHostname("192.0.2.7"); err != nil {
		t.Error(err)
	}
	if err := leaf.VerifyHostname("gw"); err != nil {
		t.Error(err)
	}
	if st, err := os.Stat(filepath.Join(dir, servingKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", st, err)
	}
	c2, err := servingCertificate(dir, []string{"gw"}, ips, now)
	if err != nil || string(c2.Certificate[0]) != string(c1.Certificate[0]) {
		t.Errorf("not kept across starts (%v)", err)
	}
	c3, err := servingCertificate(dir, []string{"gw"}, append(ips, net.ParseIP("198.51.100.1")), now)
	if err != nil || string(c3.Certificate[0]) == string(c1.Certificate[0]) {
		t.Errorf("not remade for a new address (%v)", err)
	}
}

// serveLocal serves s's local API at sock until the test ends.
func serveLocal(t *testing.T, s *Server, sock string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeLocal(ctx, sock) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// The local socket serves the agent's own Go profiles (its footprint on the gateway is
// measured with them); the network side never does (TestAuthentication's 404 above).
func TestLocalSocketServesProfiles(t *testing.T) {
	dir := t.TempDir()
	s, err := New(Config{NodeName: "gw", PKIDir: dir, Pods: fakePods{}, Runtime: &fakeRuntime{}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	serveLocal(t, s, sock)
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := client.Get("http://holdfast/debug/pprof/heap?debug=1")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("heap profile: %d %s", resp.StatusCode, b)
			}
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("local socket not served: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(body, "heap profile:") || !strings.Contains(body, "# HeapInuse") {
		t.Errorf("heap profile in text form: %.300s", body)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := client.Get("http://holdfast" + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, index := get("/debug/pprof/"); code != http.StatusOK || !strings.Contains(index, "\tgoroutine\n") || !strings.Contains(index, "\theap\n") {
		t.Errorf("index: %d %q", code, index)
	}
	if code, b := get("/debug/pprof/goroutine?debug=2"); code != http.StatusOK || !strings.Contains(b, "goroutine ") {
		t.Errorf("goroutine dump: %d %.300s", code, b)
	}
	if code, b := get("/debug/pprof/heap"); code != http.StatusOK || !strings.HasPrefix(b, "\x1f\x8b") {
		t.Errorf("heap profile, gzipped protobuf: %d %q", code, b[:min(len(b), 16)])
	}
	if code, b := get("/debug/pprof/profile?seconds=1"); code != http.StatusOK || !strings.HasPrefix(b, "\x1f\x8b") {
		t.Errorf("CPU profile, gzipped protobuf: %d %q", code, b[:min(len(b), 16)])
	}
	for _, path := range []string{"/debug/pprof/nosuch", "/debug/pprof/heap?seconds=5", "/debug/pprof/profile?seconds=x"} {
		if code, b := get(path); code == http.StatusOK {
			t.Errorf("%s: %d %.100s, want an error", path, code, b)
		}
	}

	// Heap profiling off (the agent's default, ConfigureHeapProfiling): the profile says how
	// to turn it on rather than serving an empty one; the text form keeps the MemStats.
	defer func(rate int) { goruntime.MemProfileRate = rate }(goruntime.MemProfileRate)
	goruntime.MemProfileRate = 0
	for _, path := range []string{"/debug/pprof/heap", "/debug/pprof/allocs"} {
		if code, b := get(path); code != http.StatusConflict || !strings.Contains(b, "GODEBUG=memprofilerate=524288") {
			t.Errorf("%s with heap profiling off: %d %.200s", path, code, b)
		}
	}
	if code, b := get("/debug/pprof/heap?debug=1"); code != http.StatusOK || !strings.Contains(b, "# HeapInuse") {
		t.Errorf("heap profile's text form with heap profiling off: %d %.200s", code, b)
	}
}

func TestConfigureHeapProfiling(t *testing.T) {
	defer func(rate int) { goruntime.MemProfileRate = rate }(goruntime.MemProfileRate)
	for _, c := range []struct {
		godebug string
		rate    int // the runtime's, as GODEBUG set it before main
		on      bool
	}{
		{"", goHeapProfileRate, false},
		{"madvdontneed=1", goHeapProfileRate, false},
		{"madvdontneed=1,memprofilerate=4096", 4096, true},
		{"memprofilerate=0", 0, false},
		// What the runtime does not read as a setting leaves the default: off here.
		{"madvdontneed=1, memprofilerate=4096", goHeapProfileRate, false},
		{"memprofilerate=-1", -1, false},
		{"memprofilerate=x", goHeapProfileRate, false},
		{"memprofilerate=4096,memprofilerate=x", 4096, true}, // the runtime kept the 4096
	} {
		goruntime.MemProfileRate = c.rate
		if on := ConfigureHeapProfiling(c.godebug); on != c.on || (goruntime.MemProfileRate > 0) != c.on {
			t.Errorf("GODEBUG=%q: on %v, MemProfileRate %d; want on %v", c.godebug, on, goruntime.MemProfileRate, c.on)
		}
	}
}

// TestReadOnlyCannotExec: exec, attach and port-forward run commands in a pod or open its
// network whatever the HTTP method, and a WebSocket upgrade is a GET: they need create on
// nodes/proxy, so that a caller allowed only to read (get nodes/proxy: monitoring service
// accounts commonly are) cannot open them, by any spelling of the path. Reads stay allowed.
// On 2df39b2 and before, a GET with the WebSocket upgrade was authorized as get.
func TestReadOnlyCannotExec(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if tr.Spec.Token == "reader" {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "system:serviceaccount:monitoring:scraper"}}
		}
		return true, tr, nil
	})
	var asked []string
	var mu sync.Mutex
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		ra := sar.Spec.ResourceAttributes
		mu.Lock()
		asked = append(asked, ra.Verb+" "+ra.Subresource)
		mu.Unlock()
		sar.Status.Allowed = ra.Resource == "nodes" && ra.Name == "gw" && ra.Verb == "get"
		return true, sar, nil
	})
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Stdin: true}}}}
	rt := &fakeRuntime{containers: []runtime.Container{{ID: "c1", PodUID: "u1", Name: "app", State: runtime.StateRunning}}}
	s, err := New(Config{NodeName: "gw", PKIDir: t.TempDir(), Client: kubetest.Wrap(cs), Pods: fakePods{pod}, Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(s.Handler())
	defer srv.Close()

	do := func(method, path string, upgrade bool) int {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer reader")
		if upgrade {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
			req.Header.Set("Sec-WebSocket-Protocol", "v5.channel.k8s.io")
		}
		client := srv.Client()
		client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{
		"/exec/default/web/app?command=id&output=1&error=1",
		"/exec/default/web/u1/app?command=id&output=1",
		"/attach/default/web/app?output=1",
		"/portForward/default/web?port=80",
		"/portForward/default/web/u1",
		"//exec/default/web/app?command=id&output=1",
		"/./exec/default/web/app?command=id&output=1",
		"/pods/../exec/default/web/app?command=id&output=1",
		"/%65xec/default/web/app?command=id&output=1",
		"/exec%2Fdefault/web/app?command=id&output=1",
		// Segments the router matches escaped and the authorizer reads decoded.
		"/exec/default/web/..%2F..%2F..%2Fpods/app?command=id&output=1",
		"/exec/default/web/%2E%2E/app?command=id&output=1",
		"/portForward/default/web/..%2f..%2f..",
		"/pods/..%2Fexec/default/web/app?command=id&output=1",
	} {
		for _, method := range []string{"GET", "POST", "HEAD"} {
			for _, upgrade := range []bool{true, false} {
				// The router answers a path that is not clean with a redirect to the clean one,
				// and a path it could read otherwise than the authorizer is refused (400): both
				// serve nothing; what is served must have been refused.
				if code := do(method, path, upgrade); code != http.StatusForbidden && code != http.StatusTemporaryRedirect && code != http.StatusMovedPermanently && code != http.StatusBadRequest {
					t.Errorf("%s %s (upgrade %v) with a read-only token: %d, want 403 (or a redirect or 400 that serves nothing)", method, path, upgrade, code)
				}
			}
		}
	}
	// What a reader is for still works.
	for _, path := range []string{"/pods", "/healthz"} {
		if code := do("GET", path, false); code != http.StatusOK {
			t.Errorf("GET %s with a read-only token: %d, want 200", path, code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range asked {
		if a != "create proxy" && a != "get pods" && a != "get proxy" && a != "get healthz" {
			t.Errorf("asked for %q: exec, attach and port-forward are create on nodes/proxy", a)
		}
	}
}

// TestTokenFlood: every bearer token the node has not seen costs a TokenReview over the uplink
// (which may be metered), and anyone who reaches the port can send tokens. 10,000 distinct
// made-up tokens cost at most the review budget (a burst, then a steady rate; the rest are
// answered 429), never evict a valid token's entry, and a token refused once is not reviewed
// again while its refusal is cached; 50 requests at once with one new token cost one review.
// On 2df39b2 the flood cost 10,000 reviews and emptied the cache of valid tokens on the way.
func TestTokenFlood(t *testing.T) {
	var reviews atomic.Int32
	var down atomic.Bool
	cs := apiReviews(&down, &reviews)
	clock := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	var clockMu sync.Mutex
	now := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return clock }
	advance := func(d time.Duration) { clockMu.Lock(); clock = clock.Add(d); clockMu.Unlock() }
	s, err := New(Config{NodeName: "gw", PKIDir: t.TempDir(), Client: kubetest.Wrap(cs), Pods: fakePods{}, Runtime: &fakeRuntime{}, Now: now,
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	get := func(token string) int {
		req := httptest.NewRequest("GET", "/pods", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	if code := get("good"); code != http.StatusOK {
		t.Fatalf("the valid token: %d", code)
	}
	goodReviews := reviews.Load() // its TokenReview and its SubjectAccessReview

	limited := 0
	for i := range 10000 {
		switch code := get(fmt.Sprintf("made-up-%d", i)); code {
		case http.StatusTooManyRequests:
			limited++
		case http.StatusUnauthorized:
		default:
			t.Fatalf("made-up token %d: %d", i, code)
		}
	}
	flood := reviews.Load() - goodReviews
	if flood > tokenReviewBurst {
		t.Errorf("10,000 made-up tokens in no time cost %d TokenReviews, want at most the burst of %d", flood, tokenReviewBurst)
	}
	if limited != 10000-int(flood) {
		t.Errorf("%d answered 429, want every request not reviewed (%d)", limited, 10000-flood)
	}
	if code := get("good"); code != http.StatusOK || reviews.Load() != goodReviews+flood {
		t.Errorf("the valid token after the flood: %d, %d more reviews; want 200 from the cache", code, reviews.Load()-goodReviews-flood)
	}
	if got := s.TokenReviews(); got != uint64(1+flood) {
		t.Errorf("TokenReviews() = %d, want %d", got, 1+flood)
	}
	if got := s.TokenReviewsLimited(); got != uint64(limited) {
		t.Errorf("TokenReviewsLimited() = %d, want %d", got, limited)
	}

	// A second later the budget has refilled by the rate; a refused token stays refused
	// without another review while its refusal is cached.
	advance(time.Second)
	before := reviews.Load()
	if code := get("made-up-0"); code != http.StatusUnauthorized || reviews.Load() != before {
		t.Errorf("a token refused a moment ago: %d, %d reviews; want 401 from the cache", code, reviews.Load()-before)
	}
	for i := range 100 {
		get(fmt.Sprintf("second-wave-%d", i))
	}
	if n := reviews.Load() - before; n > tokenReviewRate+1 {
		t.Errorf("a second later, 100 new tokens cost %d reviews, want at most the rate of %d", n, tokenReviewRate)
	}

	// A token of a megabyte is not sent over the uplink: refused unread.
	advance(time.Minute)
	before = reviews.Load()
	if code := get(strings.Repeat("x", 1<<20)); code != http.StatusUnauthorized || reviews.Load() != before {
		t.Errorf("a 1 MiB token: %d, %d reviews; want 401 and none", code, reviews.Load()-before)
	}

	// Many requests at once with the same new token: one review.
	advance(time.Minute)
	before = reviews.Load()
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { get("concurrent-made-up") })
	}
	wg.Wait()
	if n := reviews.Load() - before; n != 1 {
		t.Errorf("50 requests with one new token cost %d reviews, want 1", n)
	}
}

// TestLocalSocketPrivateFromItsFirstMoment: bind creates a unix socket with the process's
// umask, and a chmod after it leaves a window in which any local user could connect and keep
// the connection: root's API, exec included. The socket must never be at its path with any
// mode but 0600: it appears there by a rename, made 0600 before. Watched with inotify under
// umask 0: on 2df39b2 the socket was created in place (IN_CREATE), mode 0777 until the chmod.
func TestLocalSocketPrivateFromItsFirstMoment(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	old := unix.Umask(0)
	defer unix.Umask(old)

	s, err := New(Config{NodeName: "gw", PKIDir: t.TempDir(), Pods: fakePods{}, Runtime: &fakeRuntime{}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	serveLocal(t, s, sock)

	buf := make([]byte, 64<<10)
	for deadline := time.Now().Add(30 * time.Second); ; {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			if time.Now().After(deadline) {
				t.Fatal("the socket never appeared at its path")
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if name != "api.sock" {
				continue
			}
			if ev.Mask&unix.IN_CREATE != 0 {
				t.Fatal("the socket was created at its path, with the umask's mode until a chmod")
			}
			fi, err := os.Lstat(sock)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Fatalf("the socket appeared as %v, want a socket of mode 0600", fi.Mode())
			}
			// What it was made in is gone once it is served.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				entries, _ := os.ReadDir(dir)
				if len(entries) == 1 {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("the directory holds %d entries with the socket served, want it alone", len(entries))
				}
			}
		}
	}
}

// TestLocalSocketReplacesOnlyASocket: a previous agent's socket at the path is replaced; a file
// that is not a socket is left as it is, and the local API is not served.
func TestLocalSocketReplacesOnlyASocket(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if l, err := listenPrivate(stale); err != nil {
		t.Errorf("over a previous agent's socket: %v", err)
	} else {
		l.Close()
	}
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listenPrivate(file); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("over a regular file: %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me" {
		t.Errorf("the file now holds %q", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("%d entries left in the directory, want the socket and the file", len(entries))
	}
}

// TestTokenFloodFromOneSourceLeavesOthersTheirReviews: a flood of made-up tokens from one
// address (or one IPv6 /64) spends its own review budget, not the node's: a new token from
// another client is still reviewed while the flood goes on. Before, the flood took the whole
// budget and every new token from anywhere got 429 while it lasted. Many sources at once are
// still held to the node's budget.
func TestTokenFloodFromOneSourceLeavesOthersTheirReviews(t *testing.T) {
	var reviews atomic.Int32
	var down atomic.Bool
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	a := newAuthenticator(kubetest.Wrap(apiReviews(&down, &reviews)), func() time.Time { return now })
	ctx := context.Background()
	flood := func(source string, n int) (limited int) {
		for i := range n {
			_, err := a.fromToken(ctx, fmt.Sprintf("made-up-%s-%d", source, i), source)
			switch {
			case errors.Is(err, errTooManyReviews):
				limited++
			case !errors.Is(err, errUnauthenticated):
				t.Fatalf("made-up token %d from %s: %v", i, source, err)
			}
		}
		return limited
	}
	if limited := flood("198.51.100.7", 1000); limited != 1000-sourceReviewBurst {
		t.Errorf("one source's 1,000 made-up tokens: %d limited, want all but its burst of %d", limited, sourceReviewBurst)
	}
	// The addresses of one IPv6 /64 are one source; an IPv4-mapped address is its IPv4 one.
	reviewSourceIs(t, "[2001:db8:1:2::1]:443", "2001:db8:1:2::/64")
	reviewSourceIs(t, "[2001:db8:1:2:ffff:1:2:3]:50000", "2001:db8:1:2::/64")
	reviewSourceIs(t, "[::ffff:198.51.100.7]:443", "198.51.100.7")
	reviewSourceIs(t, "198.51.100.7:1", "198.51.100.7")
	if u, err := a.fromToken(ctx, "good", "192.0.2.1"); err != nil || u.Name != "alice" {
		t.Errorf("a new valid token from another client during the flood: %v, %v; want it reviewed", u, err)
	}
	// Many sources together get no more than the node's budget.
	before := reviews.Load()
	for i := range 100 {
		flood(fmt.Sprintf("203.0.113.%d", i), 10)
	}
	if n := reviews.Load() - before; n > tokenReviewBurst {
		t.Errorf("100 sources' made-up tokens cost %d reviews, want at most the node's burst of %d", n, tokenReviewBurst)
	}
	// A client whose new tokens the node's spent budget refused has not spent its own: once
	// the node's refills, it gets its whole burst.
	refused := flood("192.0.2.99", 5)
	now = now.Add(time.Duration(tokenReviewBurst/tokenReviewRate) * time.Second)
	if refused != 5 || flood("192.0.2.99", sourceReviewBurst) != 0 {
		t.Errorf("a client refused for the node's budget (%d of 5) lost its own budget", refused)
	}
}

// reviewSourceIs checks the budget a remote address is counted in.
func reviewSourceIs(t *testing.T, remote, want string) {
	t.Helper()
	r := httptest.NewRequest("GET", "/pods", nil)
	r.RemoteAddr = remote
	if got := reviewSource(r); got != want {
		t.Errorf("reviewSource(%q) = %q, want %q", remote, got, want)
	}
}

// TestRefusedTokensEvictNoValidOne: tokens that authenticated and tokens that did not are
// cached apart, so that made-up tokens, more than a cache holds, evict none of the valid ones.
// The review budget alone keeps a flood under the cache's size within a valid entry's lifetime;
// here it is lifted, to attack the caches themselves.
func TestRefusedTokensEvictNoValidOne(t *testing.T) {
	var reviews atomic.Int32
	var down atomic.Bool
	a := newAuthenticator(kubetest.Wrap(apiReviews(&down, &reviews)), time.Now)
	a.limiter = rate.NewLimiter(rate.Inf, 0)
	ctx := context.Background()
	if _, err := a.fromToken(ctx, "good", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	for i := range maxCacheEntries + 100 {
		if _, err := a.fromToken(ctx, fmt.Sprintf("made-up-%d", i), fmt.Sprintf("source-%d", i)); !errors.Is(err, errUnauthenticated) {
			t.Fatalf("made-up token %d: %v", i, err)
		}
	}
	before := reviews.Load()
	if u, err := a.fromToken(ctx, "good", "192.0.2.1"); err != nil || u.Name != "alice" || reviews.Load() != before {
		t.Errorf("the valid token after %d refused ones: %v, %v, %d more reviews; want alice from the cache", maxCacheEntries+100, u, err, reviews.Load()-before)
	}
}
