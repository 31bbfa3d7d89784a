package wasm

import "testing"

func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain text, ünïcode", "plain text, ünïcode"},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"one\nINFO a fake line\r", `one\nINFO a fake line\r`},
		{"left\u202eright", `left\u202eright`},
		{"bad \xff byte", `bad \xff byte`},
		{"tab\there", `tab\there`},
	} {
		if got := Printable(tc.in); got != tc.want {
			t.Errorf("Printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
