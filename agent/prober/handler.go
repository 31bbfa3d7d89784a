package prober

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/holdfast-dev/holdfast/agent/policy"
	"github.com/holdfast-dev/holdfast/internal/expansion"
)

// Kind is which of a container's probes. Its value is the word kubelet's events use
// ("Liveness probe failed: ...").
type Kind string

const (
	Liveness  Kind = "Liveness"
	Readiness Kind = "Readiness"
	Startup   Kind = "Startup"
)

// kinds lists the probe kinds in the order their workers are made.
var kinds = []Kind{Startup, Liveness, Readiness}

// probeOf returns the container's probe of that kind, nil if it has none.
func probeOf(c *v1.Container, k Kind) *v1.Probe {
	switch k {
	case Liveness:
		return c.LivenessProbe
	case Readiness:
		return c.ReadinessProbe
	case Startup:
		return c.StartupProbe
	}
	return nil
}

func (k Kind) policyKind() policy.ProbeKind {
	return policy.ProbeKind(strings.ToLower(string(k)))
}

// Outcome is the result of one probe attempt.
type Outcome int

const (
	// Success: the container passed.
	Success Outcome = iota + 1
	// Warning: the container passed, with something worth an event (an httpGet redirect to
	// another host, not followed: kubelet counts it as a success).
	Warning
	// Failure: the container failed; the output says why.
	Failure
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Warning:
		return "warning"
	case Failure:
		return "failure"
	}
	return "unknown"
}

// Target is what one probe attempt checks.
type Target struct {
	Pod       *v1.Pod
	Container *v1.Container
	// ContainerID is the containerd ID of the running instance.
	ContainerID string
	Kind        Kind
	Probe       *v1.Probe
	// PodIP is the pod's address (the node's for host-network pods): the default host of
	// httpGet and tcpSocket, the host of grpc.
	PodIP string
	// Pid is the container's init process on the host, 0 if unknown. /proc/<Pid>/root is the
	// container's root filesystem, volumes included.
	Pid uint32
	// Timeout is timeoutSeconds; ctx carries it as a deadline too.
	Timeout time.Duration
}

// Handler runs one probe attempt. The output is the text of the event a failure produces
// ("Liveness probe failed: <output>"). An error means the attempt could not run at all (a
// port name the container does not declare, the runtime unreachable): kubelet's "probe
// errored", which counts neither as a success nor as a failure.
type Handler interface {
	Probe(ctx context.Context, t Target) (Outcome, string, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, t Target) (Outcome, string, error)

// Probe calls f.
func (f HandlerFunc) Probe(ctx context.Context, t Target) (Outcome, string, error) {
	return f(ctx, t)
}

// Handlers picks the handler of a probe: the Wasm policy a pod annotation names, else the
// probe's own handler (exec, httpGet, tcpSocket or grpc). It is the Handler a Manager uses in
// the agent; a nil field makes the probes of that kind error, saying so.
type Handlers struct {
	Exec      Handler
	HTTPGet   Handler
	TCPSocket Handler
	GRPC      Handler
	// Wasm serves the probes a pod hands to a Wasm probe policy with the annotation
	// policy.ProbeAnnotation(container, kind).
	Wasm Handler
}

// ErrNoHandler: the probe's handler is not available on this node.
var ErrNoHandler = errors.New("probe handler not available")

// Probe dispatches to the probe's handler.
func (h *Handlers) Probe(ctx context.Context, t Target) (Outcome, string, error) {
	name, isWasm, err := policy.WasmProbe(t.Pod, t.Container.Name, t.Kind.policyKind())
	if err != nil {
		return 0, "", err
	}
	var handler Handler
	var what string
	switch {
	case isWasm:
		handler, what = h.Wasm, fmt.Sprintf("Wasm probe policy %q: this node has no policy engine configured", name)
	case t.Probe.Exec != nil:
		handler, what = h.Exec, "exec"
	case t.Probe.HTTPGet != nil:
		handler, what = h.HTTPGet, "httpGet"
	case t.Probe.TCPSocket != nil:
		handler, what = h.TCPSocket, "tcpSocket"
	case t.Probe.GRPC != nil:
		handler, what = h.GRPC, "grpc"
	default:
		return 0, "", errors.New("the probe has no handler (exec, httpGet, tcpSocket or grpc)")
	}
	if handler == nil {
		return 0, "", fmt.Errorf("%w: %s", ErrNoHandler, what)
	}
	return handler.Probe(ctx, t)
}

// NewHandlers returns the handlers of the agent: exec through rt, httpGet, tcpSocket and grpc
// from the agent's network namespace, and Wasm probe policies through policies. Pass a nil
// interface (not a nil *policy.Manager) for a node without policies: annotated probes then
// error.
func NewHandlers(rt Execer, policies PolicyProber) *Handlers {
	h := &Handlers{
		Exec:      &ExecHandler{Runtime: rt},
		HTTPGet:   &HTTPGetHandler{},
		TCPSocket: &TCPSocketHandler{},
		GRPC:      &GRPCHandler{},
	}
	if policies != nil {
		h.Wasm = &WasmHandler{Policies: policies}
	}
	return h
}

// resolvePort turns a probe's port (a number, or the name of one of the container's ports)
// into a number, as kubelet does: a name the container does not declare is tried as a
// number before giving up.
func resolvePort(port intstr.IntOrString, c *v1.Container) (int, error) {
	n := -1
	switch port.Type {
	case intstr.Int:
		n = port.IntValue()
	case intstr.String:
		found := false
		for _, p := range c.Ports {
			if p.Name == port.StrVal {
				n, found = int(p.ContainerPort), true
				break
			}
		}
		if !found {
			v, err := strconv.Atoi(port.StrVal)
			if err != nil {
				return -1, fmt.Errorf("port %q not found in container %q's ports", port.StrVal, c.Name)
			}
			n = v
		}
	}
	if n <= 0 || n >= 65536 {
		return n, fmt.Errorf("invalid port number: %d", n)
	}
	return n, nil
}

// expandStatic expands $(VAR) in s with the container's env entries that have a literal
// value, as kubelet does for exec probe commands (valueFrom entries are not expanded), turns
// $$ into $ and leaves unknown references as written.
func expandStatic(in []string, env []v1.EnvVar) []string {
	vars := map[string]string{}
	for _, e := range env {
		if e.ValueFrom == nil {
			vars[e.Name] = e.Value
		}
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = expansion.Expand(s, vars)
	}
	return out
}

// hostOr returns host, or the pod's IP when the probe names none.
func hostOr(host string, t Target) (string, error) {
	if host != "" {
		return host, nil
	}
	if t.PodIP == "" {
		return "", errors.New("the pod has no IP yet")
	}
	return t.PodIP, nil
}
