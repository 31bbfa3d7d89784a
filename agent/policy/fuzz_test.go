package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// FuzzParseConfig feeds policies.yaml files to ParseConfig. What it accepts is complete (every
// policy has its failurePolicy, names are unique, the memory limit translates to a page count
// wazero can honour) and means the same once written out: its YAML parses to an equal
// configuration.
func FuzzParseConfig(f *testing.F) {
	example, err := os.ReadFile("../../policies/examples/policies.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	const head = "apiVersion: holdfast.dev/v1alpha1\nkind: PolicyConfig\n"
	f.Add([]byte(head))
	f.Add([]byte(head + `policies:
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
`))
	f.Add([]byte(`{"apiVersion":"holdfast.dev/v1alpha1","kind":"PolicyConfig","policies":[{"name":"a","kind":"probe","module":"a.wasm","settings":[1,{"x":null}],"limits":{"memory":"4Gi"}}]}`))
	f.Add([]byte(head + "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n" +
		"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n" +
		"g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"))
	f.Add([]byte(head + "policies:\n- {name: a, kind: probe, module: a.wasm, limits: {memory: 99999999999999999999999Ei, maxInstances: 99999999999999999999}}\n"))
	f.Add([]byte(head + "policies:\n- {name: a, kind: probe, module: a.wasm, limits: {timeout: 9223372036854775807ns}}\n"))
	f.Add([]byte(head + "policies:\n- {name: \"\xff\", kind: probe, module: \"\xc0\"}\n"))
	f.Add([]byte(head + "policies:\n- {name: a, kind: probe, module: a.wasm, settings: " + strings.Repeat("[", 3000) + strings.Repeat("]", 3000) + "}\n"))
	f.Add(example[:len(example)/2])

	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			if c != nil {
				t.Fatalf("ParseConfig returned a configuration with its error %v", err)
			}
			return
		}
		names := map[string]bool{}
		for _, p := range c.Policies {
			if p.FailurePolicy != Fail && p.FailurePolicy != Ignore {
				t.Fatalf("policy %q: failurePolicy %q after validation", p.Name, p.FailurePolicy)
			}
			if names[p.Name] {
				t.Fatalf("duplicate policy %q accepted", p.Name)
			}
			names[p.Name] = true
			if l := p.wasmLimits(time.Second); p.Limits.Memory != nil && (l.MemoryPages == 0 || l.MemoryPages > 65536) {
				t.Fatalf("policy %q: limits.memory %s translates to %d pages", p.Name, p.Limits.Memory, l.MemoryPages)
			}
		}
		y, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("encode an accepted configuration: %v", err)
		}
		again, err := ParseConfig(y)
		if err != nil {
			t.Fatalf("an accepted configuration written out does not parse: %v\n%s", err, y)
		}
		// Compared as JSON: settings are raw JSON, whose spacing YAML does not keep.
		if a, b := mustJSON(t, c), mustJSON(t, again); a != b {
			t.Fatalf("an accepted configuration written out parses differently:\n%s\nthen\n%s", a, b)
		}
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// FuzzDecodeOutput feeds what a policy module may return (the host passes any JSON object on)
// to the admission and probe output decoders. They agree with a plain reading of the ABI's
// schema (a JSON object whose exact key "allowed"/"success" is a boolean, and whose optional
// fields have their types), round-trip, and what reaches a pod's status is bounded and stays
// valid UTF-8. testdata/fuzz/FuzzDecodeOutput holds the inputs of the two bugs it caught (a
// key in two cases, a message cut inside a rune).
func FuzzDecodeOutput(f *testing.F) {
	for _, s := range []string{
		`{"allowed":true,"warnings":["looks fine"]}`,
		`{"allowed":false,"reason":"not a reason!","message":"nope"}`,
		`{"allowed":false,"reason":"ImageNotAllowed","message":"container \"app\" uses image evil.io/x"}`,
		`{"success":true,"message":"all good"}`,
		`{"verdict":"yes"}`,
		`{"allowed":true,"allowed":false,"success":null}`,
		`{"allowed":1e999}`,
		`{"allowed":true,"warnings":[` + strings.Repeat(`"w",`, 100) + `"\ud800"]}`,
		"{\"allowed\":false,\"message\":\"\xff\xfe\"}",
		`{"allowed":true,"x":` + strings.Repeat("[", 500) + strings.Repeat("]", 500) + `}`,
		`{"allowed":tr`,
		`null`, `[]`, `"allowed"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		var generic any
		genericErr := json.Unmarshal(out, &generic)
		obj, isObject := generic.(map[string]any)
		isObject = isObject && genericErr == nil

		res, err := decodeAdmissionOutput(out)
		want, wantOK := schemaBool(obj, isObject, "allowed", map[string]string{"reason": "string", "message": "string", "warnings": "[]string"})
		if (err == nil) != wantOK {
			t.Fatalf("admission output %q: decoded %v (%v), the schema says valid=%v", out, err == nil, err, wantOK)
		}
		if err == nil {
			if *res.Allowed != want {
				t.Fatalf("admission output %q: allowed=%v, the exact key says %v", out, *res.Allowed, want)
			}
			again, err := decodeAdmissionOutput([]byte(mustJSON(t, res)))
			if err != nil || !reflect.DeepEqual(again, res) {
				t.Fatalf("admission output %q does not round-trip: %+v, then %+v (%v)", out, res, again, err)
			}
			checkClip(t, res.Message)
			for _, w := range res.Warnings {
				checkClip(t, w)
			}
		}

		pres, err := decodeProbeOutput(out)
		want, wantOK = schemaBool(obj, isObject, "success", map[string]string{"message": "string"})
		if (err == nil) != wantOK {
			t.Fatalf("probe output %q: decoded %v (%v), the schema says valid=%v", out, err == nil, err, wantOK)
		}
		if err == nil {
			if *pres.Success != want {
				t.Fatalf("probe output %q: success=%v, the exact key says %v", out, *pres.Success, want)
			}
			checkClip(t, pres.Message)
		}
	})
}

// schemaBool reads a module output as the ABI's JSON schema does, from a generic decode: the
// required boolean key, and the types of the optional ones (null counts as absent).
func schemaBool(obj map[string]any, isObject bool, key string, optional map[string]string) (value, valid bool) {
	if !isObject {
		return false, false
	}
	v, ok := obj[key].(bool)
	if !ok {
		return false, false
	}
	for name, typ := range optional {
		x, present := obj[name]
		if !present || x == nil {
			continue
		}
		switch typ {
		case "string":
			if _, ok := x.(string); !ok {
				return false, false
			}
		case "[]string":
			list, ok := x.([]any)
			if !ok {
				return false, false
			}
			for _, e := range list {
				if _, ok := e.(string); !ok && e != nil {
					return false, false
				}
			}
		}
	}
	return v, true
}

// checkClip: what clip makes of a module's text is bounded and, from valid UTF-8 (which JSON
// decoding guarantees), valid UTF-8.
func checkClip(t *testing.T, s string) {
	t.Helper()
	c := clip(s)
	if len(c) > maxMessage+len("...") {
		t.Fatalf("clip left %d bytes", len(c))
	}
	if utf8.ValidString(s) && !utf8.ValidString(c) {
		t.Fatalf("clip(%q) = %q is not valid UTF-8", s, c)
	}
	if i := strings.IndexFunc(c, unicode.IsControl); i >= 0 {
		t.Fatalf("clip(%q) = %q holds a control character at %d", s, c, i)
	}
}

// FuzzReadOPABundle feeds bundles to ReadOPABundle: a policy file is operator input, and an
// OCI-delivered one comes over the network. It never panics; what it accepts has a module and
// a data document that is a JSON object.
func FuzzReadOPABundle(f *testing.F) {
	wasmMagic := "\x00asm\x01\x00\x00\x00"
	for _, files := range []map[string]string{
		{"/policy.wasm": wasmMagic, "/data.json": `{"a": 1}`, "/.manifest": `{"wasm":[{"entrypoint":"p/deny","module":"/policy.wasm"}]}`},
		{"/policy.wasm": wasmMagic, "/x/y/data.json": `[1, 2]`, "/x/data.json": `{"z": true}`},
		{"/policy.wasm": wasmMagic, "/data.json": `{"a": 1}`, "/a/data.json": `{}`},
		{"/data.json": `{}`},
		{"../../policy.wasm": wasmMagic, "/.manifest": `{"wasm": 1}`},
	} {
		f.Add(tarGz(f, files))
	}
	f.Add([]byte(wasmMagic))
	f.Add([]byte{0x1f, 0x8b, 0x08, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		bundle, err := ReadOPABundle(b)
		if err != nil {
			return
		}
		if len(bundle.Wasm) == 0 {
			t.Fatalf("accepted a bundle without a module")
		}
		if bundle.Data != nil && !isJSONObject(bundle.Data) {
			t.Fatalf("data document %q is not a JSON object", bundle.Data)
		}
	})
}

// FuzzDecodeOPAResult feeds what opa_eval may return to the decoder of OPA decisions: it never
// panics, and a decision it returns has its verdict.
func FuzzDecodeOPAResult(f *testing.F) {
	for _, s := range []string{
		`[{"result":[]}]`, `[{"result":["no", "never"]}]`, `[{"result":[{"msg":"m"},{"x":1}]}]`,
		`[{"result":true}]`, `[{"result":false}]`, `[]`, `[{}]`, `[{"result":"deny"}]`,
		`[{"result":{"allowed":false,"status":{"reason":"NoLatest","message":"m"}}}]`,
		`[{"result":{"response":{"allowed":true,"warnings":["w"]}}}]`,
		`[{"result":{"response":{"response":{"allowed":true}}}}]`,
		`[{"result":{"allowed":"yes"}}]`, `{"result":true}`, `null`, `[{"result":` + strings.Repeat("[", 500) + strings.Repeat("]", 500) + `}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		res, err := decodeOPAResult("p/deny", out)
		if err == nil && res.Allowed == nil {
			t.Fatalf("result set %q: a decision without a verdict", out)
		}
	})
}

// tarGz writes files into a gzipped tar, as opa build does.
func tarGz(tb testing.TB, files map[string]string) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			tb.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}
