package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// referenceSprintf is OPA's sprintf as the engine had it before it was
// bounded, and as OPA's topdown has it: the arguments decoded into a tree,
// converted, and handed to fmt.Sprintf whole. It is the oracle for honest
// formats.
func referenceSprintf(t testing.TB, format string, argsJSON string) string {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(argsJSON))
	d.UseNumber()
	var list []any
	if err := d.Decode(&list); err != nil {
		t.Fatalf("args %s: %v", argsJSON, err)
	}
	values := make([]any, len(list))
	for i, v := range list {
		switch v := v.(type) {
		case json.Number:
			s := string(v)
			if strings.ContainsAny(s, ".eE") {
				if f, err := v.Float64(); err == nil {
					values[i] = f
				} else {
					values[i] = s
				}
			} else if x, err := strconv.ParseInt(s, 10, 64); err == nil {
				values[i] = x
			} else if b, ok := new(big.Int).SetString(s, 10); ok {
				values[i] = b
			} else {
				values[i] = s
			}
		case string:
			values[i] = v
		default:
			values[i] = referenceRegoText(v)
		}
	}
	return fmt.Sprintf(format, values...)
}

func referenceRegoText(v any) string {
	var b strings.Builder
	var write func(v any)
	write = func(v any) {
		switch v := v.(type) {
		case nil:
			b.WriteString("null")
		case bool:
			b.WriteString(strconv.FormatBool(v))
		case json.Number:
			b.WriteString(string(v))
		case string:
			b.WriteString(strconv.Quote(v))
		case []any:
			b.WriteByte('[')
			for i, e := range v {
				if i > 0 {
					b.WriteString(", ")
				}
				write(e)
			}
			b.WriteByte(']')
		case map[string]any:
			b.WriteByte('{')
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for i, k := range keys {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(strconv.Quote(k))
				b.WriteString(": ")
				write(v[k])
			}
			b.WriteByte('}')
		}
	}
	write(v)
	return b.String()
}

// boundedResult runs the host's sprintf and decodes its JSON result.
func boundedResult(format, argsJSON string, limit int) (string, error) {
	f, _ := json.Marshal(format)
	out, err := opaSprintf(context.Background(), [][]byte{f, []byte(argsJSON)}, limit)
	if err != nil {
		return "", err
	}
	var s string
	if err := json.Unmarshal(out, &s); err != nil {
		return "", fmt.Errorf("result %q is not a JSON string: %v", out, err)
	}
	return s, nil
}

// sprintfCases are formats an honest policy writes, and the corners of
// fmt's grammar: flags, widths, precisions, `*`, argument indexes, the
// %!(...) notes, and every argument type OPA's sprintf hands fmt.
var sprintfCases = []struct{ format, args string }{
	{"image %q of container %s is not from %s", `["docker.io/evil:1", "app", "registry.local/"]`},
	{"%d containers, over %v; limits %v, ratio %v, ports %v", `[3, 1, {"cpu": "1", "memory": 64}, 2.5, [80, 443]]`},
	{"%s and %d", `["a", 7]`},
	{"%5d|%-5d|%05d|%+d|% d|%x|%X|%o|%O|%b|%c|%q|%U|%#U|%#x", `[42, 42, 42, 42, 42, 255, 255, 8, 8, 5, 65, 66, 9731, 9731, 255]`},
	{"%.3f|%8.2f|%-8.2f|%e|%E|%g|%G|%.0f|%#g|%x|%b|%v", `[3.14159, 2.5, 2.5, 1234.5678, 0.000012, 1e21, 1e-7, 2.5, 1.0, 1.5, 1.5, 1e100]`},
	{"%s|%10s|%-10s|%.2s|%q|%x|% x|%X|%.1q|%.100s|%.99999999s", `["héllo", "ab", "ab", "héllo", "tab\there", "hi", "hi", "hi", "héllo", "short", "short"]`},
	{"%v|%s|%d|%x|%b|%o|%.40d|%50d|%+d|%c", `[123456789012345678901234567890, 123456789012345678901234567890, -123456789012345678901234567890, 123456789012345678901234567890, 12345678901234567890123, 123456789012345678901234567890, 123456789012345678901234567890, 123456789012345678901234567890, 123456789012345678901234567890, 123456789012345678901234567890]`},
	{"%[2]d %[1]d", `[1, 2]`},
	{"%[3]*.[2]*[1]f", `[12.0, 2, 6]`},
	{"%*d|%-*d|%*d|%.*f|%.*d", `[5, 1, 5, 1, -5, 1, 2, 3.14159, -1, 7]`},
	{"%*d", `["x", 1]`},
	{"%.*d", `[2.5, 1]`},
	{"%*d", `[10000000, 1]`},
	{"%d %d", `[1]`},
	{"%d", `[1, "extra", 2.5, [1], {"a": true}, 123456789012345678901234567890]`},
	{"%[5]d", `[1]`},
	{"%[0]d|%[x]d|%[1d|%[]d", `[1, 2]`},
	{"%[1]2d", `[1]`},
	{"%[1].2d", `[1]`},
	{"%d%", `[1]`},
	{"%5%|%-+#0 5.3%|%%", `[]`},
	{"%", `[]`},
	{"%!|%*|%[|%.|%5*|%5.3*|%-|%é|%\xff", `[1, 2, 3, 4, 5, 6, 7, 8, 9]`},
	{"%#!|%+!|%#.2!|%5[", `[2.5, 2.5, 2.5, 123456789012345678901234567890]`},
	{"%0999999999d", `[1]`},
	{"%.9999999999f", `[1]`},
	{"%T %T %T %T %.3T %10T", `[1, 2.5, "s", 123456789012345678901234567890, "", 1]`},
	{"%t|%p|%w|%s|%d|%e", `[true, "x", "y", 1, "s", "s"]`},
	{"%v|%v|%v|%v|%s|%d", `[null, true, false, {"b": [1, {"c": null}], "a": "x\"y\u0001é"}, [], {}]`},
	{"%v", `[{"k": 1, "k": 2}]`},
	{"%v %s", `["\u00e9\ud83d\ude00 \u2028 \\ \"", "line\nbreak"]`},
	{"%s", `["<script>&amp;</script>"]`},
	{"%d|%v|%s", `[1e3, -0, 1.0]`},
	{"%v", `[99999999999999999999999999999999999999999999e2]`},
}

// TestBoundedSprintfAsFmt: for honest formats within the budget, the host's
// sprintf prints what fmt.Sprintf does over the same converted arguments.
func TestBoundedSprintfAsFmt(t *testing.T) {
	for _, tc := range sprintfCases {
		want := referenceSprintf(t, tc.format, tc.args)
		got, err := boundedResult(tc.format, tc.args, DefaultHostResponseBytes)
		if err != nil {
			t.Errorf("sprintf(%q, %s): %v; fmt gives %q", tc.format, tc.args, err, want)
			continue
		}
		if got != want {
			t.Errorf("sprintf(%q, %s)\n got %q\nwant %q", tc.format, tc.args, got, want)
		}
	}
}

// TestBoundedSprintfRefuses: what would print more than the budget is
// refused, whichever way it asks, without the host formatting it.
func TestBoundedSprintfRefuses(t *testing.T) {
	const limit = 1 << 20
	big := `"` + strings.Repeat("x", 60000) + `"`
	cases := []struct{ name, format, args string }{
		{"one wide verb", "%2000000d", `[1]`},
		{"wide verbs", strings.Repeat("%09999999d", 300), "[" + strings.Repeat("1,", 299) + "1]"},
		{"precise floats", strings.Repeat("%.9999999f", 300), "[" + strings.Repeat("1.5,", 299) + "1.5]"},
		{"precise integers", strings.Repeat("%.9999999d", 3), `[1, 2, 3]`},
		{"star widths", strings.Repeat("%*d", 3000), "[" + strings.Repeat("1000000,1,", 2999) + "1000000,1]"},
		{"reused argument", strings.Repeat("%[1]s", 10000), "[" + big + "]"},
		{"arguments in turn, printing nothing", strings.Repeat("%.0[1]s%.0[2]s%.0[3]s%.0[4]s%.0[5]s", 2000), "[" + strings.Repeat(big+",", 4) + big + "]"},
		{"many small verbs", strings.Repeat("%v", 30000), "[" + strings.Repeat(big+",", 29) + big + "]"},
		{"escapes", "%s", `["` + strings.Repeat(`\u0001`, 200000) + `"]`},
		{"extra arguments", "", "[" + strings.Repeat(big+",", 29) + big + "]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := boundedResult(tc.format, tc.args, limit)
			var over *overBudgetError
			if !errors.As(err, &over) {
				t.Fatalf("got %v, want a refusal", err)
			}
		})
	}
	// One large argument used many times is converted once: printed.
	if got, err := boundedResult(strings.Repeat("%.0[1]s", 10000)+"%.3[1]s", "["+big+"]", limit); err != nil || got != "xxx" {
		t.Fatalf("one argument used 10001 times, printing 3 bytes: %q, %v", got, err)
	}
	// Merely large, within the budget: printed.
	got, err := boundedResult("%900000d|%s", `[7, "end"]`, limit)
	if err != nil || len(got) != 900004 || !strings.HasSuffix(got, "7|end") {
		t.Fatalf("a result of 900004 bytes within the budget of %d: %d bytes, %v", limit, len(got), err)
	}
}

// FuzzBoundedSprintf: whatever the format and arguments, the host's sprintf
// prints what fmt.Sprintf prints when that is well within the budget, and
// refuses when it is over.
func FuzzBoundedSprintf(f *testing.F) {
	for _, tc := range sprintfCases {
		if !strings.Contains(tc.format, "99999") {
			f.Add(tc.format, tc.args)
		}
	}
	f.Fuzz(func(t *testing.T, format, args string) {
		if len(format) > 200 || len(args) > 2000 || !json.Valid([]byte(args)) || jsonTypeName([]byte(args)) != "array" {
			return
		}
		// Keep fmt's own output small enough to compute: no number of more
		// than four digits in the format.
		digits := 0
		for i := 0; i < len(format); i++ {
			if '0' <= format[i] && format[i] <= '9' {
				if digits++; digits > 4 {
					return
				}
			} else {
				digits = 0
			}
		}
		var list []json.RawMessage
		if json.Unmarshal([]byte(args), &list) != nil {
			return
		}
		for _, e := range list {
			if n := jsonTypeName(e); n == "number" && len(e) > 30 {
				return // fmt's %b of a huge big.Int
			}
		}
		// The format reaches the host, and the result the guest, as JSON,
		// where invalid UTF-8 is U+FFFD.
		roundTrip := func(s string) string {
			b, _ := json.Marshal(s)
			_ = json.Unmarshal(b, &s)
			return s
		}
		format = roundTrip(format)
		const limit = 1 << 16
		want := roundTrip(referenceSprintf(t, format, args))
		got, err := boundedResult(format, args, limit)
		var over *overBudgetError
		switch {
		case err != nil && !errors.As(err, &over):
			t.Fatalf("sprintf(%q, %s): %v", format, args, err)
		case len(want) < limit/4 && err != nil:
			t.Fatalf("sprintf(%q, %s) refused %d bytes: %v", format, args, len(want), err)
		case err == nil && got != want:
			t.Fatalf("sprintf(%q, %s)\n got %q\nwant %q", format, args, got, want)
		case jsonQuotedLen([]byte(want)) > limit && err == nil:
			t.Fatalf("sprintf(%q, %s) printed %d bytes, over the limit of %d", format, args, len(got), limit)
		}
	})
}

func TestRegoTextOfJSON(t *testing.T) {
	for _, raw := range []string{
		`null`, `true`, `1.50`, `"a\"b\u00e9\n"`, `[]`, `{}`, `[1, [2, [3]], {"z": 1, "a": [true, null]}]`,
		` { "b" : 1 , "a" : { "\u0041" : "x" , "A" : "y" } } `, `{"k":1,"k":2}`,
	} {
		d := json.NewDecoder(bytes.NewReader([]byte(raw)))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		if got, want := string(appendRegoText(nil, []byte(raw))), referenceRegoText(v); got != want {
			t.Errorf("%s: got %s, want %s", raw, got, want)
		}
	}
}

// BenchmarkSprintf compares the host's sprintf with fmt.Sprintf over a tree
// decoded from the same JSON (the engine's sprintf before it was bounded),
// on the messages of wasm/testdata/opa/registries.rego.
func BenchmarkSprintf(b *testing.B) {
	format, args := "image %q of container %s is not from %s", `["docker.io/library/nginx:1.27", "app", "registry.local/"]`
	f, _ := json.Marshal(format)
	b.Run("bounded", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := opaSprintf(context.Background(), [][]byte{f, []byte(args)}, DefaultHostResponseBytes); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fmt.Sprintf", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var s string
			_ = json.Unmarshal(f, &s)
			out, _ := json.Marshal(referenceSprintf(b, s, args))
			_ = out
		}
	})
}
