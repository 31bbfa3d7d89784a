package wasm

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/holdfast-dev/holdfast/wasm/wasmtest"
	"github.com/tetratelabs/wazero"
)

// The rewritten module is cached next to wazero's compilation cache, and a
// damaged entry is rewritten rather than failing the load.
func TestRewriteCache(t *testing.T) {
	ctx := context.Background()
	module := wasmtest.BuildWAT(t, "wasm/testdata/exits.wat")
	e, err := NewEngine(ctx, NewConfig().WithCacheDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	call := func() {
		t.Helper()
		m, err := e.Load(ctx, Spec{Name: "exits", Wasm: module, Entrypoints: []string{"admit"}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close(ctx)
		if out, err := m.Call(ctx, "admit", []byte(`{}`)); err != nil || string(out) != `{"ok":true}` {
			t.Fatalf("call: %s, %v", out, err)
		}
	}
	call()
	path := e.rewritePath(Digest(module))
	cached, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the rewrite was not cached: %v", err)
	}
	want, err := instrumentCheckpoints(module)
	if err != nil || !bytes.Equal(cached, want) {
		t.Fatalf("the cached rewrite differs from the rewrite (%v)", err)
	}
	call()
	if err := os.WriteFile(path, []byte("\x00asm\x01\x00\x00\x00damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	call()
}

// A module may have a function section without a code section, or the
// reverse, when it has no functions (binary.wast); the rewrite gives it the
// other, with the helpers alone.
func TestRewriteFunctionOrCodeSectionAlone(t *testing.T) {
	ctx := context.Background()
	e, err := NewEngine(ctx, NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	for name, module := range map[string]string{
		"function section, no code":                 "\x00asm\x01\x00\x00\x00\x03\x01\x00",
		"code section, no function section":         "\x00asm\x01\x00\x00\x00\x0a\x01\x00",
		"neither":                                   "\x00asm\x01\x00\x00\x00",
		"function and data count sections, no code": "\x00asm\x01\x00\x00\x00\x03\x01\x00\x0c\x01\x00",
	} {
		compiled, _, err := e.compile(ctx, name, []byte(module), ABIHoldfast)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		_ = compiled.Close(ctx)
	}
}

// A name section is for debuggers: the spec (5.5.3) does not let errors in
// a custom section's data make a module invalid, so the engine drops a name
// section wazero could not read instead of refusing the module, and never
// hands wazero one it would refuse (wazero reads a known subsection past
// its declared size, refuses a second name section, names that are not
// UTF-8, a subsection running past the section). Each module below computes
// 42 and carries a malformed name section; each loads and answers 42. The last four were
// refused on 771f95a: a number whose fifth byte set bits past the 32nd was read truncated.
func TestMalformedNameSectionsDropped(t *testing.T) {
	const code = "\x01\x05\x01\x60\x00\x01\x7f" + // type () -> i32
		"\x03\x02\x01\x00" + // one function
		"\x07\x05\x01\x01f\x00\x00" + // exported as f
		"\x0a\x06\x01\x04\x00\x41\x2a\x0b" // i32.const 42
	names := func(body string) string {
		return string(appendU32([]byte{0}, uint32(len(body)+5))) + "\x04name" + body
	}
	sub := func(id byte, body string) string { return string(appendU32([]byte{id}, uint32(len(body)))) + body }
	cases := []struct{ name, section string }{
		{"local names claiming more than the section", names("\x02\x1a\x00")},
		{"an unknown subsection past the end", names("\x09\x1a\x00")},
		{"function names by the billion", names(sub(1, "\xff\xff\xff\xff\x0f"))},
		{"local names cut short", names(sub(2, "\x01\x00\x02\x00\x01a"))},
		{"a function name not UTF-8", names(sub(1, "\x01\x00\x02\xc3\x28"))},
		{"a module name not UTF-8", names(sub(0, "\x01\xff"))},
		{"a module name shorter than its subsection", names(sub(0, "\x01a\x01\x01\x00"))},
		{"function names longer than their subsection", names("\x01\x01\x01\x00\x01f")},
		{"two name sections", names(sub(1, "\x01\x00\x01f")) + names(sub(1, "\x01\x00\x01g"))},
		// A 32-bit number whose fifth byte sets bits past the 32nd: a function index, a
		// local index, a name's length, a subsection's size.
		{"a function index past 32 bits", names(sub(1, "\x01\x80\x80\x80\x80\x10\x01f"))},
		{"a local index past 32 bits", names(sub(2, "\x01\x00\x01\x80\x80\x80\x80\x10\x01a"))},
		{"a name length past 32 bits", names(sub(0, "\x81\x80\x80\x80\x10a"))},
		{"a subsection size past 32 bits", names("\x07\x80\x80\x80\x80\x10")},
	}
	ctx := context.Background()
	e, err := NewEngine(ctx, NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			module := "\x00asm\x01\x00\x00\x00" + code + tc.section
			if _, err := instrumentCheckpoints([]byte(module)); err != nil {
				t.Fatalf("the rewrite refuses the module: %v", err)
			}
			compiled, _, err := e.compile(ctx, "names", []byte(module), ABIHoldfast)
			if err != nil {
				t.Fatalf("the engine refuses a module whose only fault is its name section: %v", err)
			}
			defer compiled.Close(ctx)
			mod, err := e.runtime.InstantiateModule(ctx, compiled, wazero.NewModuleConfig().WithName(""))
			if err != nil {
				t.Fatal(err)
			}
			defer mod.Close(ctx)
			res, err := mod.ExportedFunction("f").Call(ctx)
			if err != nil || len(res) != 1 || res[0] != 42 {
				t.Fatalf("f() = %v, %v; want 42", res, err)
			}
		})
	}
}
