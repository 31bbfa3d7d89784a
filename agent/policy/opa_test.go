package policy

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/holdfast-dev/holdfast/test/testenv"
)

const registriesRego = `package holdfast.admission

import rego.v1

deny contains msg if {
	some c in input.request.object.spec.containers
	not startswith(c.image, data.allowed_prefix)
	msg := sprintf("image %q of %s/%s is not from %s", [c.image, input.request.namespace, input.request.name, data.allowed_prefix])
}
`

// opaBundle builds Rego with opa build -t wasm and returns the bundle's bytes.
func opaBundle(t *testing.T, rego, data string, entrypoints ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(testenv.OPABundle(t, rego, data, entrypoints...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOPAAdmit loads Rego policies as `opa build -t wasm` writes them and checks each shape of
// decision OPA users write: a set of deny messages, a boolean allow, an AdmissionReview
// response; the input is the AdmissionReview of the pod with the node beside it; settings
// override the bundle's data.
func TestOPAAdmit(t *testing.T) {
	f := newFixture(t)
	f.module("registries.tar.gz", opaBundle(t, registriesRego, `{"allowed_prefix": "registry.local/"}`, "holdfast/admission/deny"))
	f.module("zone.tar.gz", opaBundle(t, `package zone

import rego.v1

default allow := false

allow if input.node.labels.zone == "edge"
`, "", "zone/allow"))
	f.module("review.tar.gz", opaBundle(t, `package review

import rego.v1

main := {"allowed": false, "status": {"reason": "NoLatest", "message": sprintf("%s uses a latest tag", [c.name])}} if {
	some c in input.request.object.spec.containers
	endswith(c.image, ":latest")
} else := {"allowed": true}
`, "", "review/main"))
	f.module("undefined.tar.gz", opaBundle(t, `package undefined

import rego.v1

allow if input.request.object.metadata.labels.trusted == "yes"
`, "", "undefined/allow"))

	node := NodeInfo{Name: "gw-1", Labels: map[string]string{"zone": "edge"}}
	f.config(`- {name: registries, kind: opa, module: registries.tar.gz}
`)
	m := f.open()
	d := m.Admit(context.Background(), pod(), node)
	if d.Allowed || d.Reason != ReasonDenied || d.Policy != "registries" ||
		!strings.Contains(d.Message, `image "nginx:1.27" of edge/web is not from registry.local/`) ||
		!strings.Contains(d.Message, `denied by policy "registries" (module sha256:`) {
		t.Errorf("registries: %+v", d)
	}

	// Settings are merged over the bundle's data: the prefix is now the pod's.
	f.config(`- {name: registries, kind: opa, module: registries.tar.gz, entrypoint: holdfast/admission/deny, settings: {allowed_prefix: "nginx:"}}
- {name: zone, kind: opa, module: zone.tar.gz}
- {name: review, kind: opa, module: review.tar.gz}
`)
	if err := m.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := m.Admit(context.Background(), pod(), node); !d.Allowed {
		t.Errorf("settings over data, zone edge, no latest: %+v", d)
	}
	other := NodeInfo{Name: "gw-2", Labels: map[string]string{"zone": "core"}}
	if d := m.Admit(context.Background(), pod(), other); d.Allowed || d.Policy != "zone" || !strings.Contains(d.Message, "zone/allow is false") {
		t.Errorf("zone core: %+v", d)
	}
	latest := pod()
	latest.Spec.Containers[0].Image = "nginx:latest"
	if d := m.Admit(context.Background(), latest, node); d.Allowed || d.Reason != "NoLatest" || !strings.Contains(d.Message, "app uses a latest tag") {
		t.Errorf("latest: %+v", d)
	}

	// A complete rule without a default is undefined for most pods: a policy error, which
	// failurePolicy decides.
	f.config(`- {name: undefined, kind: opa, module: undefined.tar.gz}
`)
	if err := m.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := m.Admit(context.Background(), pod(), node); d.Allowed || d.Reason != ReasonError || !strings.Contains(d.Message, "undefined/allow is undefined") {
		t.Errorf("undefined under Fail: %+v", d)
	}
	f.config(`- {name: undefined, kind: opa, module: undefined.tar.gz, failurePolicy: Ignore}
`)
	if err := m.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := m.Admit(context.Background(), pod(), node); !d.Allowed || len(d.Warnings) != 1 {
		t.Errorf("undefined under Ignore: %+v", d)
	}
}

// TestOPAConfig: what an OPA policy may not be configured with, refused with the reason.
func TestOPAConfig(t *testing.T) {
	const head = "apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\npolicies:\n"
	for _, tc := range []struct{ name, policies, want string }{
		{"grants", "- {name: a, kind: opa, module: a.tar.gz, grants: {clock: true}}\n", "no grants"},
		{"settings not an object", "- {name: a, kind: opa, module: a.tar.gz, settings: [1]}\n", "must be an object"},
		{"entrypoint on a wasm policy", "- {name: a, kind: admission, module: a.wasm, entrypoint: x/y}\n", "entrypoint is for kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(head + tc.policies))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}

	// A bundle of several entrypoints needs one named.
	f := newFixture(t)
	f.module("two.tar.gz", opaBundle(t, registriesRego+"\nallow := true\n", `{"allowed_prefix": "x"}`, "holdfast/admission/deny", "holdfast/admission/allow"))
	f.config("- {name: two, kind: opa, module: two.tar.gz}\n")
	m := f.open()
	st, _ := m.Status()
	if len(st) != 1 || st[0].Loaded || !strings.Contains(st[0].Error, "the bundle has 2 (holdfast/admission/deny, holdfast/admission/allow): name one in the policy's entrypoint") {
		t.Errorf("status: %+v", st)
	}
}

// TestReadOPABundle: data files at nested paths land at their paths in the data document, as
// OPA puts them; conflicts and what is not a bundle are refused.
func TestReadOPABundle(t *testing.T) {
	bundle := func(files map[string]string) []byte { return tarGz(t, files) }
	wasmMagic := "\x00asm\x01\x00\x00\x00"
	b, err := ReadOPABundle(bundle(map[string]string{
		"/policy.wasm":         wasmMagic,
		"/data.json":           `{"a": 1}`,
		"/limits/data.json":    `{"cpu": "2"}`,
		"/limits/gw/data.json": `{"mem": 64}`,
		"/.manifest":           `{"wasm":[{"entrypoint":"p/deny","module":"/policy.wasm"}]}`,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if string(b.Data) != `{"a":1,"limits":{"cpu":"2","gw":{"mem":64}}}` || len(b.Entrypoints) != 1 || b.Entrypoints[0] != "p/deny" || string(b.Wasm) != wasmMagic {
		t.Errorf("bundle: data %s, entrypoints %v", b.Data, b.Entrypoints)
	}
	for name, files := range map[string]map[string]string{
		"no module":     {"/data.json": `{}`},
		"root not obj":  {"/policy.wasm": wasmMagic, "/data.json": `[1]`},
		"conflict":      {"/policy.wasm": wasmMagic, "/data.json": `{"limits": 1}`, "/limits/data.json": `{"cpu": 1}`},
		"two modules":   {"/policy.wasm": wasmMagic, "/other.wasm": wasmMagic},
		"bad data json": {"/policy.wasm": wasmMagic, "/data.json": `{`},
	} {
		if _, err := ReadOPABundle(bundle(files)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := ReadOPABundle([]byte("package x")); err == nil || !strings.Contains(err.Error(), "neither a bundle") {
		t.Errorf("rego source: %v", err)
	}
}
