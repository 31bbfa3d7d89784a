package policy

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/holdfast-dev/holdfast/test/hostile"
)

func TestParseConfig(t *testing.T) {
	const head = "apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\n"
	cases := []struct {
		name string
		yaml string
		err  string // "" = valid
	}{
		{"empty", head, ""},
		{"full", head + `policies:
- name: allowed-registries
  kind: admission
  module: allowed-registries.wasm
  failurePolicy: Ignore
  settings: {registries: [docker.io/library]}
  grants: {clock: true}
  limits: {timeout: 500ms, memory: 32Mi, maxInstances: 1}
- name: web
  kind: probe
  module: /opt/policies/http-json.wasm
  grants: {http: true, tcp: true, files: [/run/app]}
`, ""},
		{"wrong apiVersion", "apiVersion: v1\nkind: PolicyConfig\n", "apiVersion"},
		{"unknown field", head + "policies:\n- name: a\n  kind: admission\n  module: a.wasm\n  grant: {http: true}\n", "unknown field"},
		{"misspelt grant", head + "policies:\n- name: a\n  kind: probe\n  module: a.wasm\n  grants: {htttp: true}\n", "unknown field"},
		{"bad name", head + "policies:\n- name: Bad_Name\n  kind: admission\n  module: a.wasm\n", "name must be"},
		{"bad kind", head + "policies:\n- name: a\n  kind: mutation\n  module: a.wasm\n", `kind "mutation"`},
		{"no module", head + "policies:\n- name: a\n  kind: admission\n", "module is empty"},
		{"bad failurePolicy", head + "policies:\n- name: a\n  kind: admission\n  module: a.wasm\n  failurePolicy: Maybe\n", "failurePolicy"},
		{"duplicate", head + "policies:\n- {name: a, kind: admission, module: a.wasm}\n- {name: a, kind: probe, module: b.wasm}\n", "duplicate"},
		{"network grant on admission", head + "policies:\n- {name: a, kind: admission, module: a.wasm, grants: {http: true}}\n", "probes only"},
		{"relative file prefix", head + "policies:\n- {name: a, kind: probe, module: a.wasm, grants: {files: [run/app]}}\n", "absolute"},
		{"tiny memory", head + "policies:\n- {name: a, kind: probe, module: a.wasm, limits: {memory: 1Ki}}\n", "limits.memory"},
		{"bad duration", head + "policies:\n- {name: a, kind: probe, module: a.wasm, limits: {timeout: soon}}\n", "invalid duration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.yaml))
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range c.Policies {
					if p.FailurePolicy == "" {
						t.Errorf("%s: failurePolicy not defaulted", p.Name)
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.err)
			}
		})
	}
}

func TestConfigTranslation(t *testing.T) {
	c, err := ParseConfig([]byte(`apiVersion: holdfast.dev/v1alpha1
kind: PolicyConfig
policies:
- name: p
  kind: probe
  module: p.wasm
  grants: {http: true, files: [/run/app], clock: true}
  limits: {timeout: 1500ms, memory: 100Mi}
- name: a
  kind: admission
  module: a.wasm
`))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Policies[0]
	if g := p.wasmGrants(); len(g) != 3 {
		t.Fatalf("grants = %v", g)
	}
	l := p.wasmLimits(2 * time.Second)
	if l.CallTimeout != 1500*time.Millisecond || l.MemoryPages != 1600 {
		t.Fatalf("limits = %+v", l)
	}
	if l := c.Policies[1].wasmLimits(3 * time.Second); l.CallTimeout != 3*time.Second {
		t.Fatalf("admission default timeout = %s", l.CallTimeout)
	}
	if c.Policies[1].FailurePolicy != Fail {
		t.Fatalf("default failurePolicy = %q", c.Policies[1].FailurePolicy)
	}
}

// A YAML alias bomb (CVE-2019-11253) is refused: the decoder bounds alias expansion (without
// the bound this test would not end). So is a file over the size limit.
func TestConfigYAMLBomb(t *testing.T) {
	bomb := hostile.YAMLAliasBomb("apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\n")
	if _, err := ParseConfig([]byte(bomb)); err == nil {
		t.Fatal("the bomb parsed")
	}
	if _, err := ParseConfig(make([]byte, maxConfigBytes+1)); err == nil {
		t.Fatal("an oversized file parsed")
	}
}

// The example configuration shipped with the policies stays valid.
func TestExampleConfig(t *testing.T) {
	b, err := os.ReadFile("../../policies/examples/policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Policies) != 6 {
		t.Fatalf("%d policies", len(c.Policies))
	}
}
