package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/holdfast-dev/holdfast/test/testenv"
	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
)

// runPolicyCmd runs `holdfast policy ARGS...` and returns its exit code and
// output.
func runPolicyCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := newPolicyCmd()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(context.Background())
	code := 0
	var pe *policyExit
	if errors.As(err, &pe) {
		code = pe.ExitCode()
	} else if err != nil {
		t.Fatalf("policy %v: %v", args, err)
	}
	return code, stdout.String(), stderr.String()
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const testPodYAML = `apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: edge
spec:
  containers:
  - name: app
    image: %s
    ports:
    - containerPort: 8080
`

func TestPolicyTestAdmission(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go policy")
	}
	dir := t.TempDir()
	module := writeFile(t, dir, "allowed-registries.wasm", wasmtest.BuildGo(t, "policies/examples/admission/allowed-registries"))
	settings := writeFile(t, dir, "settings.yaml", []byte("registries: [docker.io/library]\n"))
	good := writeFile(t, dir, "good.yaml", []byte(strings.Replace(testPodYAML, "%s", "nginx:1.27", 1)))
	bad := writeFile(t, dir, "bad.yaml", []byte(strings.Replace(testPodYAML, "%s", "evil.example.com/miner:1", 1)))
	cache := wasmtest.CacheDir(t, "wazero")

	code, out, errOut := runPolicyCmd(t, "test", "--policy", module, "--pod", good, "--settings", settings, "--cache-dir", cache)
	if code != 0 || !strings.Contains(out, "decision:  allowed") || !strings.Contains(out, "call:") || !strings.Contains(out, "sha256:") {
		t.Fatalf("good pod: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runPolicyCmd(t, "test", "--policy", module, "--pod", bad, "--settings", settings, "--cache-dir", cache)
	if code != 1 || !strings.Contains(out, "decision:  denied") || !strings.Contains(out, "RegistryNotAllowed") || !strings.Contains(out, "evil.example.com") {
		t.Fatalf("bad pod: exit %d\n%s", code, out)
	}
	// Inline settings, JSON output.
	code, out, _ = runPolicyCmd(t, "test", "--policy", module, "--pod", bad, "--settings", `{"registries":["evil.example.com"]}`, "--cache-dir", cache, "-o", "json")
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 || res["allowed"] != true || res["kind"] != "admission" {
		t.Fatalf("json: exit %d %v\n%s", code, err, out)
	}
	// Unusable settings are the policy's business: it denies with InvalidSettings.
	code, out, _ = runPolicyCmd(t, "test", "--policy", module, "--pod", good, "--settings", `{"registry":"x"}`, "--cache-dir", cache)
	if code != 1 || !strings.Contains(out, "InvalidSettings") {
		t.Fatalf("bad settings: exit %d\n%s", code, out)
	}
}

func TestPolicyTestErrors(t *testing.T) {
	dir := t.TempDir()
	pod := writeFile(t, dir, "pod.yaml", []byte(strings.Replace(testPodYAML, "%s", "nginx", 1)))
	trap := writeFile(t, dir, "trap.wasm", wasmtest.BuildWAT(t, "agent/policy/testdata/trap.wat"))
	garbage := writeFile(t, dir, "garbage.wasm", []byte("not wasm"))
	ungranted := writeFile(t, dir, "ungranted.wasm", wasmtest.BuildWAT(t, "wasm/testdata/ungranted.wat"))
	cases := []struct {
		name    string
		args    []string
		mention string
	}{
		{"trap", []string{"--policy", trap, "--kind", "admission"}, "unreachable"},
		{"garbage", []string{"--policy", garbage, "--kind", "admission"}, "invalid module"},
		{"ungranted import", []string{"--policy", ungranted}, "holdfast.http_request"},
		{"both entry points", []string{"--policy", trap}, "--kind"},
		{"missing file", []string{"--policy", filepath.Join(dir, "nope.wasm")}, "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runPolicyCmd(t, append([]string{"test", "--pod", pod, "--cache-dir", ""}, tc.args...)...)
			if code != 2 || !strings.Contains(out+errOut, tc.mention) {
				t.Fatalf("exit %d, want 2 mentioning %q\n%s%s", code, tc.mention, out, errOut)
			}
		})
	}
}

func TestPolicyTestProbe(t *testing.T) {
	dir := t.TempDir()
	pod := writeFile(t, dir, "pod.yaml", []byte(strings.Replace(testPodYAML, "%s", "nginx", 1)))
	ok := writeFile(t, dir, "ok.wasm", wasmtest.BuildWAT(t, "agent/policy/testdata/probe-ok.wat"))
	fail := writeFile(t, dir, "fail.wasm", wasmtest.BuildWAT(t, "agent/policy/testdata/probe-fail.wat"))
	if code, out, errOut := runPolicyCmd(t, "test", "--policy", ok, "--pod", pod, "--cache-dir", ""); code != 0 || !strings.Contains(out, "decision:  success") || !strings.Contains(out, "all good") {
		t.Fatalf("ok: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := runPolicyCmd(t, "test", "--policy", fail, "--pod", pod, "--cache-dir", ""); code != 1 || !strings.Contains(out, "db down") {
		t.Fatalf("fail: exit %d\n%s", code, out)
	}
}

func TestPolicyInspect(t *testing.T) {
	dir := t.TempDir()
	hostcall := writeFile(t, dir, "hostcall.wasm", wasmtest.BuildWAT(t, "wasm/testdata/hostcall.wat"))
	code, out, errOut := runPolicyCmd(t, "inspect", hostcall)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, s := range []string{"abi version:     1", "grants needed:   file, http, tcp", "import:          holdfast.http_request", "export:          http(i32, i32) -> (i64)"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	foreign := writeFile(t, dir, "foreign.wasm", wasmtest.BuildWAT(t, "wasm/testdata/foreignimport.wat"))
	code, out, _ = runPolicyCmd(t, "inspect", foreign)
	if code != 1 || !strings.Contains(out, "env.system") {
		t.Fatalf("foreign import: exit %d\n%s", code, out)
	}
	code, out, _ = runPolicyCmd(t, "inspect", "-o", "json", hostcall)
	var info map[string]any
	if err := json.Unmarshal([]byte(out), &info); err != nil || code != 0 || info["ABIVersion"] != float64(1) {
		t.Fatalf("json: %d %v\n%s", code, err, out)
	}
}

// Guest text (log lines, reason, message) is shown escaped: a guest cannot
// clear the terminal or forge a line of the command's own output. Its log
// lines are shown, marked as the guest's.
func TestPolicyTestShowsGuestTextEscaped(t *testing.T) {
	dir := t.TempDir()
	pod := writeFile(t, dir, "pod.yaml", []byte(strings.Replace(testPodYAML, "%s", "nginx", 1)))
	forger := writeFile(t, dir, "forger.wasm", wasmtest.BuildWAT(t, "cmd/holdfast/testdata/forger.wat"))
	code, out, errOut := runPolicyCmd(t, "test", "--policy", forger, "--pod", pod, "--cache-dir", "")
	if code != 1 {
		t.Fatalf("exit %d, want 1 (denied)\n%s%s", code, out, errOut)
	}
	if strings.ContainsRune(out+errOut, '\x1b') {
		t.Errorf("an escape code reached the terminal:\n%q", out+errOut)
	}
	var decisions []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "decision:") {
			decisions = append(decisions, strings.Join(strings.Fields(l), " "))
		}
	}
	if len(decisions) != 1 || decisions[0] != "decision: denied" {
		t.Errorf("decision lines %q, want one saying denied:\n%s", decisions, out)
	}
	for _, s := range []string{
		`guest log:  warn: \x1b[31mred\ndecision:  allowed` + "\n",
		`): line one\ndecision:  allowed\x1b[2K` + "\n",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	// JSON output carries the guest's log lines too, JSON-escaped.
	code, out, _ = runPolicyCmd(t, "test", "--policy", forger, "--pod", pod, "--cache-dir", "", "-o", "json")
	var res struct {
		GuestLogs []struct{ Level, Message string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 1 || len(res.GuestLogs) != 1 ||
		res.GuestLogs[0].Level != "warn" || res.GuestLogs[0].Message != "\x1b[31mred\ndecision:  allowed" {
		t.Fatalf("json: exit %d %v %+v\n%s", code, err, res, out)
	}
}

// A probe's JSON result uses the probe's vocabulary (ABI.md: success), not
// admission's.
func TestPolicyTestProbeJSON(t *testing.T) {
	dir := t.TempDir()
	pod := writeFile(t, dir, "pod.yaml", []byte(strings.Replace(testPodYAML, "%s", "nginx", 1)))
	for _, tc := range []struct {
		wat     string
		code    int
		success bool
	}{{"probe-ok", 0, true}, {"probe-fail", 1, false}} {
		module := writeFile(t, dir, tc.wat+".wasm", wasmtest.BuildWAT(t, "agent/policy/testdata/"+tc.wat+".wat"))
		code, out, errOut := runPolicyCmd(t, "test", "--policy", module, "--pod", pod, "--cache-dir", "", "-o", "json")
		var res map[string]any
		if err := json.Unmarshal([]byte(out), &res); err != nil || code != tc.code {
			t.Fatalf("%s: exit %d %v\n%s%s", tc.wat, code, err, out, errOut)
		}
		if _, ok := res["allowed"]; ok || res["success"] != tc.success || res["kind"] != "probe" {
			t.Errorf("%s: want success %v and no allowed:\n%s", tc.wat, tc.success, out)
		}
	}
}

// Load errors a policy author meets first, reported as what they are.
func TestPolicyLoadErrorsSayWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	pod := writeFile(t, dir, "pod.yaml", []byte(strings.Replace(testPodYAML, "%s", "nginx", 1)))
	empty := writeFile(t, dir, "empty.wasm", nil)
	text := writeFile(t, dir, "abi2.wat", []byte(";; a policy\n(module)\n"))
	badsegment := writeFile(t, dir, "badsegment.wasm", wasmtest.BuildWAT(t, "wasm/testdata/badsegment.wat"))
	garbage := writeFile(t, dir, "garbage.wasm", []byte("\x00asm garbage"))
	for _, tc := range []struct {
		name, module string
		mention      []string
	}{
		{"empty file", empty, []string{"empty file"}},
		{"text format", text, []string{"wat2wasm"}},
		{"no _initialize", badsegment, []string{"data[0]"}},
		{"named by its file", garbage, []string{garbage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range [][]string{
				{"test", "--policy", tc.module, "--pod", pod, "--kind", "admission", "--cache-dir", ""},
				{"test", "--policy", tc.module, "--pod", pod, "--cache-dir", ""},
				{"inspect", tc.module},
			} {
				code, out, errOut := runPolicyCmd(t, args...)
				if code == 0 {
					t.Errorf("%v: exit 0\n%s%s", args, out, errOut)
				}
				for _, s := range tc.mention {
					if !strings.Contains(out+errOut, s) {
						t.Errorf("%v: output does not mention %q:\n%s%s", args, s, out, errOut)
					}
				}
				for _, s := range []string{"magic number", `"inspect"`, "_initialize"} {
					if strings.Contains(out+errOut, s) {
						t.Errorf("%v: output mentions %q:\n%s%s", args, s, out, errOut)
					}
				}
			}
		})
	}
}

// inspect fails a module that no node would load: another ABI version, or an
// admission policy that imports what only a probe may be granted.
func TestPolicyInspectRefusals(t *testing.T) {
	dir := t.TempDir()
	abi2 := writeFile(t, dir, "abi2.wasm", wasmtest.BuildWAT(t, "wasm/testdata/abi2.wat"))
	code, out, errOut := runPolicyCmd(t, "inspect", abi2)
	if code == 0 || !strings.Contains(out, "ABI version 2 is not supported") {
		t.Errorf("abi2: exit %d\n%s%s", code, out, errOut)
	}
	admitHTTP := writeFile(t, dir, "admit-http.wasm", wasmtest.BuildWAT(t, "wasm/testdata/ungranted.wat"))
	code, out, errOut = runPolicyCmd(t, "inspect", admitHTTP)
	if code == 0 || !strings.Contains(out, "grants http, tcp and files are for probes only") || !strings.Contains(out, "holdfast.http_request") {
		t.Errorf("admission policy importing http_request: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runPolicyCmd(t, "inspect", "-o", "json", admitHTTP)
	var info map[string]any
	if err := json.Unmarshal([]byte(out), &info); err != nil || code == 0 || !strings.Contains(fmt.Sprint(info["error"]), "probes only") {
		t.Errorf("json: exit %d %v\n%s", code, err, out)
	}
}

// TestPolicyTestOPA: a Rego policy is tried as its author built it (the bundle of opa build -t
// wasm, or its policy.wasm), recognised as kind opa without --kind, and judged as the agent
// judges it: the Rego message in the decision, settings over the bundle's data.
func TestPolicyTestOPA(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Rego policy with opa")
	}
	dir := t.TempDir()
	const rego = `package kubernetes.admission

import rego.v1

deny contains msg if {
	some c in input.request.object.spec.containers
	not startswith(c.image, data.prefix)
	msg := sprintf("%s: image %s is not under %s", [c.name, c.image, data.prefix])
}
`
	bundle := testenv.OPABundle(t, rego, `{"prefix": "docker.io/"}`, "kubernetes/admission/deny")
	good := writeFile(t, dir, "good.yaml", []byte(strings.Replace(testPodYAML, "%s", "docker.io/library/nginx:1.27", 1)))
	bad := writeFile(t, dir, "bad.yaml", []byte(strings.Replace(testPodYAML, "%s", "evil.example.com/miner:1", 1)))
	cache := wasmtest.CacheDir(t, "wazero")

	code, out, errOut := runPolicyCmd(t, "test", "--policy", bundle, "--pod", good, "--cache-dir", cache)
	if code != 0 || !strings.Contains(out, "kind:      opa") || !strings.Contains(out, "decision:  allowed") {
		t.Fatalf("good pod: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runPolicyCmd(t, "test", "--policy", bundle, "--pod", bad, "--cache-dir", cache)
	if code != 1 || !strings.Contains(out, "app: image evil.example.com/miner:1 is not under docker.io/") {
		t.Fatalf("bad pod: exit %d\n%s", code, out)
	}
	code, out, _ = runPolicyCmd(t, "test", "--policy", bundle, "--pod", bad, "--settings", `{"prefix": "evil.example.com/"}`, "--entrypoint", "kubernetes/admission/deny", "--cache-dir", cache)
	if code != 0 {
		t.Fatalf("settings over data: exit %d\n%s", code, out)
	}
	// The module alone has no manifest to name its entrypoint, nor the bundle's data:
	// data.prefix is undefined, so no rule fires.
	module := writeFile(t, dir, "policy.wasm", testenv.OPAModule(t, bundle))
	code, out, _ = runPolicyCmd(t, "test", "--policy", module, "--pod", bad, "--cache-dir", cache)
	if code != 2 || !strings.Contains(out, "no bundle manifest names one") {
		t.Fatalf("bare module without --entrypoint: exit %d\n%s", code, out)
	}
	code, out, errOut = runPolicyCmd(t, "test", "--policy", module, "--pod", bad, "--entrypoint", "kubernetes/admission/deny", "--cache-dir", cache)
	if code != 0 || !strings.Contains(out, "kind:      opa") {
		t.Fatalf("bare module: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = runPolicyCmd(t, "test", "--policy", bundle, "--pod", bad, "--entrypoint", "kubernetes/admission/allow", "--cache-dir", cache)
	if code != 2 {
		t.Fatalf("unknown entrypoint: exit %d\n%s", code, errOut)
	}
}
