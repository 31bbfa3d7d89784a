package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"github.com/holdfast-dev/holdfast/wasm"
)

// Reasons of denials that do not come from the module.
const (
	// ReasonDenied is the pod's status reason when a policy denies without
	// a valid reason of its own.
	ReasonDenied = "PolicyDenied"
	// ReasonError is the reason when a policy with failurePolicy Fail could
	// not decide (it trapped, timed out, or is not loaded).
	ReasonError = "PolicyError"
)

// NodeInfo is what admission policies know of the node.
type NodeInfo struct {
	Name        string              `json:"name"`
	Labels      map[string]string   `json:"labels,omitempty"`
	Allocatable corev1.ResourceList `json:"allocatable,omitempty"`
}

// Decision is the verdict of the admission policies on a pod.
type Decision struct {
	Allowed bool
	// Reason is a CamelCase word for the pod's status.reason when denied.
	Reason string
	// Message explains a denial for the pod's status.message and the Event,
	// naming the policy and its module digest.
	Message string
	// Policy and Digest identify the policy that denied (or failed).
	Policy string
	Digest string
	// Warnings are gathered from all policies, each prefixed by its name.
	Warnings []string
}

// admissionOutput is the ABI's admit output.
type admissionOutput struct {
	Allowed  *bool    `json:"allowed"`
	Reason   string   `json:"reason"`
	Message  string   `json:"message"`
	Warnings []string `json:"warnings"`
}

// decodeAdmissionOutput reads what admit returned: a JSON object with a boolean "allowed".
func decodeAdmissionOutput(out []byte) (admissionOutput, error) {
	var res admissionOutput
	err := decodeOutput(out, map[string]any{
		"allowed": &res.Allowed, "reason": &res.Reason, "message": &res.Message, "warnings": &res.Warnings,
	})
	if err != nil || res.Allowed == nil {
		return admissionOutput{}, fmt.Errorf("output %.100q is not an admission decision ({\"allowed\": true|false, ...})", out)
	}
	return res, nil
}

// decodeOutput decodes a module's JSON object into fields by their exact names. Not
// encoding/json into a struct: it matches names case-insensitively, so the last of
// {"allowed":false,"Allowed":true} would decide, where the ABI's schema (and a policy author
// reading the output) see "allowed": false. Other names, in any case, are ignored.
func decodeOutput(out []byte, fields map[string]any) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(out, &obj); err != nil {
		return err
	}
	if obj == nil {
		return errors.New("not a JSON object")
	}
	for name, dst := range fields {
		raw, ok := obj[name]
		if !ok || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return fmt.Errorf("%q: %w", name, err)
		}
	}
	return nil
}

var reasonRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,63}$`)

// maxMessage caps a policy's message in a pod's status and events.
const maxMessage = 1024

// Admit asks every admission policy, in configuration order, whether pod
// may run on node; the first denial is the decision. A policy that fails
// (trap, timeout, not loaded) denies with ReasonError under failurePolicy
// Fail, and is skipped with a warning under Ignore. With no admission
// policy the pod is allowed.
//
// Admit judges; it does not remember. The agent must call it once per pod,
// before the pod's first start, and record the verdict: a pod already
// admitted (running before an agent restart) must not be judged again.
func (m *Manager) Admit(ctx context.Context, pod *corev1.Pod, node NodeInfo) Decision {
	podJSON, err := json.Marshal(pod)
	if err != nil {
		return Decision{Allowed: false, Reason: ReasonError, Message: "encode pod for admission policies: " + err.Error()}
	}
	nodeJSON, err := json.Marshal(node)
	if err != nil {
		return Decision{Allowed: false, Reason: ReasonError, Message: "encode node for admission policies: " + err.Error()}
	}
	var warnings []string
	var review []byte // the AdmissionReview of OPA policies, made once
	for _, l := range m.current.Load().policies {
		var input []byte
		switch l.cfg.Kind {
		case KindAdmission:
			input = compose(`{"pod":`, podJSON, `,"node":`, nodeJSON, `,"settings":`, settingsOf(l.cfg), `}`)
		case KindOPA:
			if review == nil {
				review = opaInput(podJSON, nodeJSON, pod)
			}
			input = review
		default:
			continue
		}
		began := time.Now()
		out, l, err := m.call(ctx, l, l.entrypoint, input)
		var res admissionOutput
		if err == nil && l.cfg.Kind == KindOPA {
			res, err = decodeOPAResult(l.entrypoint, out)
		} else if err == nil {
			res, err = decodeAdmissionOutput(out)
		}
		m.observe(l, evaluationResult(err, res.Allowed, "allowed", "denied"), began)
		if err != nil {
			if l.cfg.FailurePolicy == Ignore {
				warnings = append(warnings, fmt.Sprintf("policy %q failed and was ignored (failurePolicy Ignore): %s", l.cfg.Name, clip(err.Error())))
				m.logger.Warn("admission policy failed; ignored", "policy", l.cfg.Name, "pod", podName(pod), "err", err)
				continue
			}
			m.logger.Warn("admission policy failed; pod denied", "policy", l.cfg.Name, "pod", podName(pod), "err", err)
			return Decision{
				Allowed:  false,
				Reason:   ReasonError,
				Message:  fmt.Sprintf("policy %q (module %s) failed and its failurePolicy is Fail: %s", l.cfg.Name, digestOrNone(l), clip(err.Error())),
				Policy:   l.cfg.Name,
				Digest:   l.digest,
				Warnings: warnings,
			}
		}
		for _, w := range res.Warnings {
			warnings = append(warnings, fmt.Sprintf("policy %q: %s", l.cfg.Name, clip(w)))
		}
		if !*res.Allowed {
			reason := res.Reason
			if !reasonRE.MatchString(reason) {
				reason = ReasonDenied
			}
			msg := strings.TrimSpace(res.Message)
			if msg == "" {
				msg = "no message"
			}
			return Decision{
				Allowed:  false,
				Reason:   reason,
				Message:  fmt.Sprintf("denied by policy %q (module %s): %s", l.cfg.Name, l.digest, clip(msg)),
				Policy:   l.cfg.Name,
				Digest:   l.digest,
				Warnings: warnings,
			}
		}
	}
	return Decision{Allowed: true, Warnings: warnings}
}

// observe records one evaluation of the policy begun at began.
func (m *Manager) observe(l *loaded, result string, began time.Time) {
	m.opts.Metrics.ObservePolicy(l.cfg.Name, string(l.cfg.Kind), result, time.Since(began))
}

// evaluationResult names a policy's answer for holdfast_policy_evaluations_total: the call
// failed (error), or its verdict, yes or no.
func evaluationResult(err error, verdict *bool, yes, no string) string {
	switch {
	case err != nil:
		return "error"
	case *verdict:
		return yes
	default:
		return no
	}
}

// call runs export on the policy's module. If the module was retired by a
// reload between taking the snapshot and the call, it retries on the
// current one. It returns the policy the call actually ran on.
func (m *Manager) call(ctx context.Context, l *loaded, export string, input []byte, opts ...wasm.CallOption) ([]byte, *loaded, error) {
	for attempt := 0; ; attempt++ {
		if l.module == nil {
			return nil, l, fmt.Errorf("not loaded: %w", l.err)
		}
		out, err := l.module.Call(ctx, export, input, opts...)
		if errors.Is(err, wasm.ErrClosed) && attempt < 3 {
			if fresh, ok := m.current.Load().byName[l.cfg.Name]; ok && fresh != l {
				l = fresh
				continue
			}
		}
		return out, l, err
	}
}

func compose(parts ...any) []byte {
	n := 0
	for _, p := range parts {
		switch v := p.(type) {
		case string:
			n += len(v)
		case []byte:
			n += len(v)
		}
	}
	b := make([]byte, 0, n)
	for _, p := range parts {
		switch v := p.(type) {
		case string:
			b = append(b, v...)
		case []byte:
			b = append(b, v...)
		}
	}
	return b
}

func settingsOf(pc PolicyConfig) []byte {
	if len(pc.Settings) == 0 {
		return []byte("{}")
	}
	return pc.Settings
}

// clip makes a guest's text fit for a pod's status and events: trimmed, escaped
// (wasm.Printable: no escape sequence reaches an operator's terminal through kubectl, no
// newline fakes another line) and cut to maxMessage bytes on a rune boundary, since a message
// cut inside a UTF-8 sequence would reach them as invalid UTF-8.
func clip(s string) string {
	s = wasm.Printable(strings.TrimSpace(s))
	if len(s) <= maxMessage {
		return s
	}
	cut := maxMessage
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

func digestOrNone(l *loaded) string {
	if l.digest == "" {
		return "not loaded"
	}
	return l.digest
}

func podName(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	return p.Namespace + "/" + p.Name
}
