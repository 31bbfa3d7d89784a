package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/holdfast-dev/holdfast/agent/policy"
	"github.com/holdfast-dev/holdfast/wasm"
)

// Exit codes of `holdfast policy test`: the decision, or a failure to
// decide.
const (
	exitAllowed = 0
	exitDenied  = 1
	exitError   = 2
)

// policyExit carries an exit code to doMain (which prints nothing more for
// it: the command has already printed what there is to say).
type policyExit struct{ code int }

func (e *policyExit) Error() string { return fmt.Sprintf("exit status %d", e.code) }
func (e *policyExit) ExitCode() int { return e.code }

// newPolicyCmd is `holdfast policy`: tools for policy authors.
func newPolicyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Test and inspect WebAssembly admission and probe policies",
		Long: `Tools for policy authors. A policy is a WebAssembly module following
policies/ABI.md; see policies/examples and the Go SDK in policies/sdk/go.`,
	}
	cmd.AddCommand(newPolicyTestCmd(), newPolicyInspectCmd())
	return cmd
}

type policyTestFlags struct {
	module, podFile, settingsFile, kind string
	entrypoint                          string
	nodeName                            string
	nodeLabels, allocatable             map[string]string
	container, podIP                    string
	ports                               []int32
	rootfs                              string
	grants, files                       []string
	timeout                             time.Duration
	memory                              string
	cacheDir                            string
	output                              string
}

func newPolicyTestCmd() *cobra.Command {
	var f policyTestFlags
	cmd := &cobra.Command{
		Use:   "test --policy FILE.wasm --pod POD.yaml",
		Short: "Run a policy on a pod, as the agent would, and print its decision",
		Long: `Run an admission policy (export admit), a probe policy (export probe) or an OPA
policy (the bundle opa build -t wasm wrote, or its policy.wasm; kind opa) on a pod,
through the same code path as the agent, and print the decision, the message,
the policy's own log lines (marked "guest log") and the timing. Text from the
policy is printed with control characters escaped (\n, \x1b ...). With -o json
the verdict is "allowed" for an admission policy, "success" for a probe.

The exit code is the decision: 0 allowed (or probe success), 1 denied (or
probe failure), 2 the policy could not decide (it failed to load, trapped,
timed out ...).

A probe policy reaches only --pod-ip on --ports (by default the pod's declared
container ports), and reads files only under --files inside --rootfs. Grants
are off unless given with --grant (http, tcp, file, clock); --files implies
file.`,
		Example: `  holdfast policy test --policy allowed-registries.wasm --pod pod.yaml --settings settings.yaml
  holdfast policy test --policy http-json.wasm --kind probe --pod pod.yaml --pod-ip 10.88.0.7 --grant http \
      --settings '{"port": 8080, "field": "status", "equals": "ok"}'
  opa build -t wasm -e kubernetes/admission/deny policy.rego
  holdfast policy test --policy bundle.tar.gz --pod pod.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			code, err := runPolicyTest(cmd.Context(), cmd.OutOrStdout(), f)
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "holdfast policy test:", wasm.Printable(err.Error()))
			}
			if code != exitAllowed {
				return &policyExit{code: code}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.module, "policy", "", "the policy module (.wasm) (required)")
	fl.StringVar(&f.podFile, "pod", "", "the pod, YAML or JSON of a v1.Pod (required)")
	fl.StringVar(&f.settingsFile, "settings", "", "the policy's settings: a YAML/JSON file, or inline JSON starting with {")
	fl.StringVar(&f.kind, "kind", "", "admission, probe or opa (default: from the module's exports)")
	fl.StringVar(&f.entrypoint, "entrypoint", "", "opa: the entrypoint to evaluate (default: the bundle's only one)")
	fl.StringVar(&f.nodeName, "node-name", "holdfast-test", "admission: the node's name")
	fl.StringToStringVar(&f.nodeLabels, "node-labels", nil, "admission: the node's labels (k=v,...)")
	fl.StringToStringVar(&f.allocatable, "allocatable", map[string]string{"cpu": "4", "memory": "8Gi", "pods": "110"}, "admission: the node's allocatable resources")
	fl.StringVar(&f.container, "container", "", "probe: the container (default: the pod's first)")
	fl.StringVar(&f.podIP, "pod-ip", "127.0.0.1", "probe: the pod's IP, the only address the policy may reach")
	fl.Int32SliceVar(&f.ports, "ports", nil, "probe: ports the policy may reach (default: the pod's declared container ports)")
	fl.StringVar(&f.rootfs, "rootfs", "", "probe: directory standing for the container's root filesystem")
	fl.StringSliceVar(&f.grants, "grant", nil, "grants: http, tcp, file, clock")
	fl.StringSliceVar(&f.files, "files", nil, "probe: path prefixes inside the container the policy may read (implies --grant file)")
	fl.DurationVar(&f.timeout, "timeout", 2*time.Second, "call deadline (a probe's timeoutSeconds)")
	fl.StringVar(&f.memory, "memory", "", "memory limit per instance, e.g. 64Mi (default: the engine's, 64Mi)")
	fl.StringVar(&f.cacheDir, "cache-dir", defaultPolicyCacheDir(), `compilation cache directory ("" to compile every time)`)
	fl.StringVarP(&f.output, "output", "o", "text", "text or json")
	_ = cmd.MarkFlagRequired("policy")
	_ = cmd.MarkFlagRequired("pod")
	return cmd
}

func defaultPolicyCacheDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "holdfast", "wasm")
}

// policyTestResult is what `policy test -o json` prints. The verdict is
// in the words of the policy's kind (ABI.md): "allowed" for admission,
// "success" for a probe.
type policyTestResult struct {
	Policy    string        `json:"policy"`
	Digest    string        `json:"digest"`
	Kind      policy.Kind   `json:"kind"`
	Allowed   *bool         `json:"allowed,omitempty"`
	Success   *bool         `json:"success,omitempty"`
	Reason    string        `json:"reason,omitempty"`
	Message   string        `json:"message,omitempty"`
	Warnings  []string      `json:"warnings,omitempty"`
	Error     string        `json:"error,omitempty"`
	GuestLogs []guestLog    `json:"guestLogs,omitempty"`
	Load      time.Duration `json:"loadNanoseconds"`
	Call      time.Duration `json:"callNanoseconds"`
}

// verdict is the decision, whichever the kind.
func (r policyTestResult) verdict() bool {
	if r.Success != nil {
		return *r.Success
	}
	return r.Allowed != nil && *r.Allowed
}

// runPolicyTest writes a one-policy configuration in a temporary directory
// and runs it through policy.Manager, the agent's own adapter.
func runPolicyTest(ctx context.Context, out io.Writer, f policyTestFlags) (int, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if f.output != "text" && f.output != "json" {
		return exitError, fmt.Errorf("--output %q: want text or json", f.output)
	}
	modulePath, err := filepath.Abs(f.module)
	if err != nil {
		return exitError, err
	}
	moduleBytes, err := os.ReadFile(modulePath)
	if err != nil {
		return exitError, err
	}
	pod, err := readPod(f.podFile)
	if err != nil {
		return exitError, err
	}
	settings, err := readSettings(f.settingsFile)
	if err != nil {
		return exitError, err
	}
	kind, err := policyKind(ctx, f.kind, f.module, moduleBytes)
	if err != nil {
		return exitError, err
	}
	pc, err := testPolicyConfig(modulePath, kind, settings, f)
	if err != nil {
		return exitError, err
	}
	dir, err := os.MkdirTemp("", "holdfast-policy-test-")
	if err != nil {
		return exitError, err
	}
	defer os.RemoveAll(dir)
	cfgBytes, err := yaml.Marshal(policy.Config{APIVersion: policy.ConfigAPIVersion, Kind: policy.ConfigKind, Policies: []policy.PolicyConfig{pc}})
	if err != nil {
		return exitError, err
	}
	if err := os.WriteFile(filepath.Join(dir, policy.ConfigFileName), cfgBytes, 0o600); err != nil {
		return exitError, err
	}

	res := policyTestResult{Policy: f.module, Digest: wasm.Digest(moduleBytes), Kind: kind}
	logs := &guestLogs{}
	start := time.Now()
	m, err := policy.Open(ctx, policy.Options{Dir: dir, CacheDir: f.cacheDir, AdmissionTimeout: f.timeout, Logger: slog.New(logs)})
	if err != nil {
		return exitError, err
	}
	defer m.Close(context.Background())
	res.Load = time.Since(start)
	if st, _ := m.Status(); len(st) == 1 && st[0].Error != "" {
		res.Error, res.GuestLogs = st[0].Error, logs.lines()
		return exitError, printPolicyTest(out, f.output, res)
	}

	code := exitAllowed
	callCtx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	start = time.Now()
	switch kind {
	case policy.KindAdmission, policy.KindOPA:
		d := m.Admit(callCtx, pod, policy.NodeInfo{Name: f.nodeName, Labels: f.nodeLabels, Allocatable: resourceList(f.allocatable)})
		res.Call = time.Since(start)
		res.Allowed, res.Reason, res.Message, res.Warnings = &d.Allowed, d.Reason, d.Message, d.Warnings
		if d.Reason == policy.ReasonError {
			res.Error, code = d.Message, exitError
		} else if !d.Allowed {
			code = exitDenied
		}
	case policy.KindProbe:
		target, terr := probeTarget(pod, f)
		if terr != nil {
			return exitError, terr
		}
		ok, msg, perr := m.Probe(callCtx, pc.Name, target)
		res.Call = time.Since(start)
		res.Success, res.Message = &ok, msg
		if perr != nil {
			res.Error, code = perr.Error(), exitError
		} else if !ok {
			code = exitDenied
		}
	}
	res.GuestLogs = logs.lines()
	return code, printPolicyTest(out, f.output, res)
}

func printPolicyTest(out io.Writer, format string, r policyTestResult) error {
	if format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	decision := map[bool]string{true: "allowed", false: "denied"}[r.verdict()]
	if r.Kind == policy.KindProbe {
		decision = map[bool]string{true: "success", false: "failure"}[r.verdict()]
	}
	if r.Error != "" {
		decision = "error"
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "policy:\t%s (%s)\n", r.Policy, r.Digest)
	fmt.Fprintf(tw, "kind:\t%s\n", r.Kind)
	fmt.Fprintf(tw, "decision:\t%s\n", decision)
	// What comes from the guest is escaped: it must not forge a line of
	// this output or reach the terminal as control sequences.
	for _, l := range r.GuestLogs {
		fmt.Fprintf(tw, "guest log:\t%s: %s\n", l.Level, wasm.Printable(l.Message))
	}
	if r.Reason != "" {
		fmt.Fprintf(tw, "reason:\t%s\n", wasm.Printable(r.Reason))
	}
	if r.Message != "" {
		fmt.Fprintf(tw, "message:\t%s\n", wasm.Printable(r.Message))
	}
	if r.Error != "" && r.Error != r.Message {
		fmt.Fprintf(tw, "error:\t%s\n", wasm.Printable(r.Error))
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(tw, "warning:\t%s\n", wasm.Printable(w))
	}
	fmt.Fprintf(tw, "load:\t%s\n", r.Load.Round(time.Microsecond))
	if r.Call > 0 {
		fmt.Fprintf(tw, "call:\t%s\n", r.Call.Round(time.Microsecond))
	}
	return tw.Flush()
}

func readPod(path string) (*corev1.Pod, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(b, &pod); err != nil {
		return nil, fmt.Errorf("--pod %s: %w", path, err)
	}
	if pod.Kind != "" && pod.Kind != "Pod" {
		return nil, fmt.Errorf("--pod %s: kind is %q, want Pod", path, pod.Kind)
	}
	return &pod, nil
}

func readSettings(arg string) (json.RawMessage, error) {
	if arg == "" {
		return nil, nil
	}
	b := []byte(arg)
	if !strings.HasPrefix(strings.TrimSpace(arg), "{") {
		var err error
		if b, err = os.ReadFile(arg); err != nil {
			return nil, err
		}
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("--settings: %w", err)
	}
	return j, nil
}

// policyKind takes --kind, or reads the module's entry points.
func policyKind(ctx context.Context, kind, file string, module []byte) (policy.Kind, error) {
	switch policy.Kind(kind) {
	case policy.KindAdmission, policy.KindProbe, policy.KindOPA:
		return policy.Kind(kind), nil
	case "":
	default:
		return "", fmt.Errorf("--kind %q: want admission, probe or opa", kind)
	}
	if isOPAPolicy(module) {
		return policy.KindOPA, nil
	}
	e, err := wasm.NewEngine(ctx, wasm.NewConfig())
	if err != nil {
		return "", err
	}
	defer e.Close(ctx)
	info, err := e.Inspect(ctx, file, module)
	if err != nil && len(info.Exports) == 0 {
		return "", err
	}
	has := func(name string) bool {
		for _, ep := range info.Entrypoints {
			if ep == name {
				return true
			}
		}
		return false
	}
	switch {
	case has("admit") && has("probe"):
		return "", errors.New("the module exports both admit and probe; say which with --kind")
	case has("admit"):
		return policy.KindAdmission, nil
	case has("probe"):
		return policy.KindProbe, nil
	}
	return "", fmt.Errorf("the module exports neither admit nor probe (exports: %s)", strings.Join(info.Exports, ", "))
}

// isOPAPolicy reports whether b is what opa build -t wasm writes: a bundle
// (gzip), or a module importing its memory from env as OPA's ABI has it.
func isOPAPolicy(b []byte) bool {
	if bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		return true
	}
	bundle, err := policy.ReadOPABundle(b)
	return err == nil && bytes.Contains(bundle.Wasm, []byte("opa_eval")) && bytes.Contains(bundle.Wasm, []byte("opa_wasm_abi_version"))
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

func testPolicyConfig(modulePath string, kind policy.Kind, settings json.RawMessage, f policyTestFlags) (policy.PolicyConfig, error) {
	base := filepath.Base(modulePath)
	for _, ext := range []string{".wasm", ".tar.gz", ".tgz"} {
		base = strings.TrimSuffix(base, ext)
	}
	name := strings.Trim(nonName.ReplaceAllString(strings.ToLower(base), "-"), "-")
	if len(name) > 63 {
		name = strings.Trim(name[:63], "-")
	}
	if name == "" {
		name = "policy"
	}
	pc := policy.PolicyConfig{Name: name, Kind: kind, Module: modulePath, FailurePolicy: policy.Fail, Settings: settings}
	if f.entrypoint != "" && kind != policy.KindOPA {
		return pc, fmt.Errorf("--entrypoint is for OPA policies; a %s module exports its entry point", kind)
	}
	pc.Entrypoint = f.entrypoint
	for _, g := range f.grants {
		grant, err := wasm.ParseGrant(g)
		if err != nil {
			return pc, fmt.Errorf("--grant: %w", err)
		}
		switch grant {
		case wasm.GrantHTTP:
			pc.Grants.HTTP = true
		case wasm.GrantTCP:
			pc.Grants.TCP = true
		case wasm.GrantClock:
			pc.Grants.Clock = true
		case wasm.GrantFile:
			if len(f.files) == 0 {
				return pc, errors.New("--grant file needs --files with the path prefixes the policy may read")
			}
		}
	}
	pc.Grants.Files = f.files
	if kind == policy.KindAdmission && (pc.Grants.HTTP || pc.Grants.TCP || len(pc.Grants.Files) > 0) {
		return pc, policy.ErrAdmissionGrants
	}
	pc.Limits.Timeout.Duration = f.timeout
	if f.memory != "" {
		q, err := resource.ParseQuantity(f.memory)
		if err != nil {
			return pc, fmt.Errorf("--memory: %w", err)
		}
		pc.Limits.Memory = &q
	}
	return pc, nil
}

func resourceList(m map[string]string) corev1.ResourceList {
	rl := corev1.ResourceList{}
	for k, v := range m {
		if q, err := resource.ParseQuantity(v); err == nil {
			rl[corev1.ResourceName(k)] = q
		}
	}
	return rl
}

func probeTarget(pod *corev1.Pod, f policyTestFlags) (policy.ProbeTarget, error) {
	t := policy.ProbeTarget{Pod: pod, Container: f.container, PodIP: f.podIP, Ports: f.ports, RootFS: f.rootfs}
	if t.Container == "" {
		if len(pod.Spec.Containers) == 0 {
			return t, errors.New("the pod has no container")
		}
		t.Container = pod.Spec.Containers[0].Name
	}
	if len(t.Ports) == 0 {
		for _, c := range pod.Spec.Containers {
			for _, p := range c.Ports {
				t.Ports = append(t.Ports, p.ContainerPort)
			}
		}
	}
	if len(f.files) > 0 && f.rootfs == "" {
		return t, errors.New("--files needs --rootfs, the directory standing for the container's root filesystem")
	}
	return t, nil
}

func newPolicyInspectCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "inspect FILE.wasm",
		Short: "Show a module's ABI version, entry points, exports, imports and the grants it needs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := runPolicyInspect(cmd.Context(), cmd.OutOrStdout(), args[0], output)
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "holdfast policy inspect:", wasm.Printable(err.Error()))
			}
			if code != 0 {
				return &policyExit{code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

// inspectResult is what `policy inspect -o json` prints.
type inspectResult struct {
	wasm.ModuleInfo
	File   string   `json:"file"`
	Grants []string `json:"grants"`
	Error  string   `json:"error,omitempty"`
}

func runPolicyInspect(ctx context.Context, out io.Writer, path, format string) (int, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return exitDenied, err
	}
	e, err := wasm.NewEngine(ctx, wasm.NewConfig().WithCacheDir(defaultPolicyCacheDir()))
	if err != nil {
		return exitDenied, err
	}
	defer e.Close(ctx)
	info, ierr := e.Inspect(ctx, path, b)
	if info.Digest == "" {
		return exitDenied, ierr
	}
	r := inspectResult{ModuleInfo: info, File: path, Grants: grantsNeeded(info.Imports)}
	if ierr == nil {
		ierr = admissionGrantsError(info, r.Grants)
	}
	if ierr != nil {
		r.Error = ierr.Error()
	}
	if format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return exitDenied, err
		}
	} else {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "file:\t%s\n", path)
		fmt.Fprintf(tw, "size:\t%d bytes\n", info.Size)
		fmt.Fprintf(tw, "digest:\t%s\n", info.Digest)
		abi := fmt.Sprint(info.ABIVersion)
		if info.ABIVersion == 0 {
			abi = "unknown (not instantiated)"
		} else if info.ABIVersion != wasm.ABIVersion {
			abi += fmt.Sprintf(" (this host supports %d)", wasm.ABIVersion)
		}
		fmt.Fprintf(tw, "abi version:\t%s\n", abi)
		fmt.Fprintf(tw, "entry points:\t%s\n", orNone(strings.Join(info.Entrypoints, ", ")))
		fmt.Fprintf(tw, "grants needed:\t%s\n", orNone(strings.Join(r.Grants, ", ")))
		fmt.Fprintf(tw, "initial memory:\t%d pages (%d KiB)\n", info.MemoryMinPages, info.MemoryMinPages*64)
		// Names and errors come from the module: escaped.
		for _, x := range info.Exports {
			fmt.Fprintf(tw, "export:\t%s\n", wasm.Printable(x))
		}
		for _, x := range dedupe(info.Imports) {
			fmt.Fprintf(tw, "import:\t%s\n", wasm.Printable(x))
		}
		if r.Error != "" {
			fmt.Fprintf(tw, "error:\t%s\n", wasm.Printable(r.Error))
		}
		if err := tw.Flush(); err != nil {
			return exitDenied, err
		}
	}
	if ierr != nil {
		return exitDenied, nil
	}
	return 0, nil
}

// admissionGrantsError refuses a module that can only be an admission
// policy (it exports admit, not probe) and imports host functions whose
// grants no admission policy may have: no node would load it.
func admissionGrantsError(info wasm.ModuleInfo, grants []string) error {
	if !slices.Contains(info.Entrypoints, "admit") || slices.Contains(info.Entrypoints, "probe") || len(grants) == 0 {
		return nil
	}
	var imports []string
	for _, imp := range dedupe(info.Imports) {
		if len(grantsNeeded([]string{imp})) > 0 {
			imports = append(imports, imp)
		}
	}
	return fmt.Errorf("it exports admit only but imports %s (grant %s): %w", strings.Join(imports, ", "), strings.Join(grants, ", "), policy.ErrAdmissionGrants)
}

// grantsNeeded lists the grants a module's imports need beyond log.
func grantsNeeded(imports []string) []string {
	need := map[string]bool{}
	for _, imp := range imports {
		switch imp {
		case "holdfast.http_request":
			need["http"] = true
		case "holdfast.tcp_dial":
			need["tcp"] = true
		case "holdfast.read_file", "holdfast.stat_file":
			need["file"] = true
		}
	}
	out := make([]string, 0, len(need))
	for g := range need {
		out = append(out, g)
	}
	sort.Strings(out)
	return out
}

func dedupe(s []string) []string {
	var out []string
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// guestLog is one log line a guest wrote with holdfast.log.
type guestLog struct {
	Level   string `json:"level"`
	Message string `json:"message"`
}

// guestLogs is a slog.Handler that keeps the guests' own log lines (the
// records the engine marks with wasm.GuestLogKey) and drops the rest.
type guestLogs struct {
	mu    sync.Mutex // protects saved
	saved []guestLog
}

func (h *guestLogs) Enabled(context.Context, slog.Level) bool { return true }

func (h *guestLogs) Handle(_ context.Context, r slog.Record) error {
	guest := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == wasm.GuestLogKey && a.Value.Kind() == slog.KindBool && a.Value.Bool() {
			guest = true
			return false
		}
		return true
	})
	if guest {
		h.mu.Lock()
		h.saved = append(h.saved, guestLog{Level: strings.ToLower(r.Level.String()), Message: r.Message})
		h.mu.Unlock()
	}
	return nil
}

// The engine's attributes (component, module) say nothing the command does
// not: one handler serves every logger derived from it.
func (h *guestLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *guestLogs) WithGroup(string) slog.Handler      { return h }

func (h *guestLogs) lines() []guestLog {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.saved)
}
