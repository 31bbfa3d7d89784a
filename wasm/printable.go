package wasm

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Printable escapes what a terminal or a log reader would interpret in text that comes from
// a guest (a policy's messages, warnings and log lines): control characters (newlines,
// escape sequences, carriage returns), other non-printable runes (bidirectional overrides)
// and invalid UTF-8, in Go's escape notation, so that the text stays on its line and shows
// as written, in `holdfast policy` and in a pod's status and events alike.
func Printable(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == ' ' || unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRuneToASCII(r) // '\n', '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}
