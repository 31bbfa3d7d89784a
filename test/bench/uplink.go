package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

// Uplink is what an agent exchanged with the apiserver in a window: the bytes on the wire
// (TLS records, headers and handshakes included) counted by a relay between the agent and the
// apiserver, and the requests the apiserver's audit log recorded for the node's user.
type Uplink struct {
	WindowS   float64 `json:"windowSeconds"`
	UpBytes   int64   `json:"upBytes"`   // agent -> apiserver
	DownBytes int64   `json:"downBytes"` // apiserver -> agent
	// ConnectionsOpened counts the TCP connections the agent opened in the window;
	// ConnectionsOpen those open at its end.
	ConnectionsOpened int `json:"connectionsOpened"`
	ConnectionsOpen   int `json:"connectionsOpen"`
	// Requests counts the requests received in the window by "verb resource[/subresource]"
	// ("update leases", "watch pods", "patch pods/status"); a watch counts when it opens.
	Requests map[string]int `json:"requests"`
}

// PerDay extrapolates bytes of the window to a day.
func (u *Uplink) PerDay(bytes int64) float64 {
	if u.WindowS <= 0 {
		return 0
	}
	return float64(bytes) * 86400 / u.WindowS
}

// PerMinute is the rate of the requests whose key match selects.
func (u *Uplink) PerMinute(match func(verb, resource string) bool) float64 {
	if u.WindowS <= 0 {
		return 0
	}
	n := 0
	for k, c := range u.Requests {
		verb, resource, _ := strings.Cut(k, " ")
		if match(verb, resource) {
			n += c
		}
	}
	return float64(n) * 60 / u.WindowS
}

// requestKinds are the rows of the table, in its order: each names a kind of request by the
// verbs and resources it matches. A request may match several (a watch of ConfigMaps is a
// watch and a ConfigMap request).
var requestKinds = []struct {
	name  string
	match func(verb, resource string) bool
}{
	{"all", func(string, string) bool { return true }},
	{"Lease", func(_, r string) bool { return r == "leases" }},
	{"Node (nodes, nodes/status)", func(_, r string) bool { return r == "nodes" || r == "nodes/status" }},
	{"pod status (pods/status)", func(_, r string) bool { return r == "pods/status" }},
	{"watches opened", func(v, _ string) bool { return v == "watch" }},
	{"lists", func(v, _ string) bool { return v == "list" }},
	{"events", func(_, r string) bool { return r == "events" }},
	{"tokens (serviceaccounts/token)", func(_, r string) bool { return r == "serviceaccounts/token" }},
	{"ConfigMap and Secret", func(_, r string) bool { return r == "configmaps" || r == "secrets" }},
}

// relay forwards TCP connections to the apiserver and counts the bytes each way: the agent's
// kubeconfig points at it, so everything the agent sends and receives, TLS included, passes
// through. The apiserver's serving certificate names 127.0.0.1, where the relay listens too.
type relay struct {
	ln     net.Listener
	target string // host:port of the apiserver

	up, down atomic.Int64
	opened   atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // the accept loop and every connection's copiers
}

// startRelay listens on a free loopback port and relays to the apiserver at host (a URL);
// it is closed, and its goroutines waited for, when t ends.
func startRelay(t testing.TB, host string) *relay {
	t.Helper()
	u, err := url.Parse(host)
	if err != nil {
		t.Fatalf("relay: apiserver URL %q: %v", host, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("relay: %v", err)
	}
	r := &relay{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	r.wg.Go(r.accept)
	t.Cleanup(r.close)
	return r
}

// URL is the relay's address as an apiserver URL.
func (r *relay) URL() string { return "https://" + r.ln.Addr().String() }

func (r *relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		r.opened.Add(1)
		r.wg.Go(func() { r.serve(c) })
	}
}

// serve relays one connection until either side closes it. The apiserver being down (the
// offline boot stops it) closes the agent's connection at once, as a refused dial would.
func (r *relay) serve(c net.Conn) {
	s, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !r.track(c, s) {
		return
	}
	defer r.untrack(c, s)
	var wg sync.WaitGroup
	wg.Go(func() { copyCounting(s, c, &r.up) })
	copyCounting(c, s, &r.down)
	wg.Wait()
}

// copyCounting copies until src ends, then closes both ends so the other direction ends too.
func copyCounting(dst, src net.Conn, n *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			n.Add(int64(k))
			if _, werr := dst.Write(buf[:k]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}

// track records a connection pair, or closes it if the relay is closing.
func (r *relay) track(c, s net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		c.Close()
		s.Close()
		return false
	}
	r.conns[c], r.conns[s] = struct{}{}, struct{}{}
	return true
}

func (r *relay) untrack(c, s net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns != nil {
		delete(r.conns, c)
		delete(r.conns, s)
	}
}

// open counts the agent's connections open now.
func (r *relay) open() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns) / 2
}

func (r *relay) close() {
	r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}

// uplinkMark is the relay's counters at one moment.
type uplinkMark struct {
	at             time.Time
	up, down, conn int64
}

func (r *relay) mark() uplinkMark {
	return uplinkMark{at: time.Now(), up: r.up.Load(), down: r.down.Load(), conn: r.opened.Load()}
}

// since is the relay's share of an Uplink: from m until now. Requests are filled from the
// audit log.
func (r *relay) since(m uplinkMark) *Uplink {
	now := r.mark()
	return &Uplink{
		WindowS:           now.at.Sub(m.at).Seconds(),
		UpBytes:           now.up - m.up,
		DownBytes:         now.down - m.down,
		ConnectionsOpened: int(now.conn - m.conn),
		ConnectionsOpen:   r.open(),
	}
}

// writeRelayKubeconfig writes a copy of the node's kubeconfig whose server is the relay.
func writeRelayKubeconfig(t testing.TB, cp *testenv.ControlPlane, node string, r *relay) string {
	t.Helper()
	path := cp.WriteNodeKubeconfig(node)
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatalf("load the kubeconfig of %s: %v", node, err)
	}
	for _, c := range cfg.Clusters {
		c.Server = r.URL()
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("write the kubeconfig of %s: %v", node, err)
	}
	return path
}

// auditPolicy records every request of a node (group system:nodes) at the Metadata level
// (who, verb, object; no bodies), once when its response completes and, for a watch, once
// when it opens; nothing of anyone else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:nodes"]
- level: None
`

// auditArgs writes the audit policy into dir and returns the apiserver flags that log with it
// to dir/audit.log, and that path.
func auditArgs(dir string) ([]string, string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return nil, "", fmt.Errorf("write the audit policy: %w", err)
	}
	log := filepath.Join(dir, "audit.log")
	return []string{"--audit-policy-file=" + policy, "--audit-log-path=" + log, "--audit-log-mode=blocking"}, log, nil
}

// auditEvent is the part of an audit.k8s.io/v1 Event the count needs.
type auditEvent struct {
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	RequestReceivedTimestamp metav1.MicroTime `json:"requestReceivedTimestamp"`
}

// key is "verb resource[/subresource]", or "verb /path" for a request of no resource
// (discovery, /version).
func (e *auditEvent) key() string {
	if e.ObjectRef == nil {
		path, _, _ := strings.Cut(e.RequestURI, "?")
		return e.Verb + " " + path
	}
	r := e.ObjectRef.Resource
	if e.ObjectRef.Subresource != "" {
		r += "/" + e.ObjectRef.Subresource
	}
	return e.Verb + " " + r
}

// countRequests reads the audit log and counts user's requests received in [from, to) by
// key: each request once, at its ResponseComplete, or at its ResponseStarted for a watch
// (whose ResponseComplete comes when it ends, maybe after the window).
func countRequests(path, user string, from, to time.Time) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open the audit log: %w", err)
	}
	defer f.Close()
	counts := map[string]int{}
	rd := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := rd.ReadBytes('\n')
		if len(line) > 0 && strings.Contains(string(line), user) {
			var e auditEvent
			if jerr := json.Unmarshal(line, &e); jerr == nil && e.User.Username == user {
				at := e.RequestReceivedTimestamp.Time
				started := e.Verb == "watch" && e.Stage == "ResponseStarted"
				done := e.Verb != "watch" && e.Stage == "ResponseComplete"
				if (started || done) && !at.Before(from) && at.Before(to) {
					counts[e.key()]++
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return counts, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read the audit log: %w", err)
		}
	}
}

// sortedRequests lists the counts, most frequent first.
func sortedRequests(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return out
}
