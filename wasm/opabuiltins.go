package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// opaBuiltin is a host implementation of one of OPA's built-in functions
// that its Wasm compiler does not compile into the module (OPA's docs call
// them "SDK-dependent").
type opaBuiltin struct {
	name  string // set from the module's declaration
	arity int
	// fn computes the builtin from its arguments, each the JSON that OPA's
	// opa_json_dump wrote (valid, at most Limits.OutputBytes), and returns
	// its result as JSON of at most limit bytes (Limits.HostResponseBytes).
	// It works from the JSON text rather than a decoded tree: a tree of
	// interface values costs 30 to 60 times the JSON's size on the host.
	// An *overBudgetError or the context's error fails the call; any other
	// error makes the expression undefined, as in OPA.
	fn func(ctx context.Context, args [][]byte, limit int) ([]byte, error)
}

// opaBuiltins are the builtins the host provides. A module that declares
// another one is refused at load, with this list in the error: a policy
// that cannot run as written is not loaded, rather than misjudging pods.
var opaBuiltins = map[string]opaBuiltin{
	"sprintf": {arity: 2, fn: opaSprintf},
}

// opaSprintf is OPA's sprintf (topdown's builtinSprintf): Go's fmt verbs,
// with integers as int64 (or big.Int), other numbers as float64, strings as
// strings and anything else as its Rego text. One difference: the module
// hands sets over as JSON arrays, so a set prints as [a, b], not {a, b}.
// Its result is bounded by limit (boundedSprintf).
func opaSprintf(ctx context.Context, args [][]byte, limit int) ([]byte, error) {
	if t := jsonTypeName(args[0]); t != "string" {
		return nil, fmt.Errorf("operand 1 must be string but got %s", t)
	}
	if t := jsonTypeName(args[1]); t != "array" {
		return nil, fmt.Errorf("operand 2 must be array but got %s", t)
	}
	p := &boundedSprintf{ctx: ctx, limit: limit, args: splitJSONArray(args[1])}
	if err := p.printf(jsonString(bytes.TrimSpace(args[0]))); err != nil {
		return nil, err
	}
	n := jsonQuotedLen(p.out)
	if n > limit {
		return nil, p.over(fmt.Sprintf("its result of %d bytes would be %d bytes as JSON,", len(p.out), n))
	}
	return appendJSONString(make([]byte, 0, n), p.out), nil
}

// jsonTypeName names the type of a JSON value as OPA's errors do.
func jsonTypeName(raw []byte) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "unknown"
	}
	switch raw[0] {
	case 'n':
		return "null"
	case 't', 'f':
		return "boolean"
	case '"':
		return "string"
	case '[':
		return "array"
	case '{':
		return "object"
	}
	return "number"
}

// jsonArray is a JSON array's text and where each element starts.
type jsonArray struct {
	raw    []byte
	starts []int32
}

// splitJSONArray finds the elements of the valid JSON array raw, keeping
// 4 bytes per element.
func splitJSONArray(raw []byte) jsonArray {
	a := jsonArray{raw: raw}
	i := skipSpace(raw, 0) + 1 // past '['
	for {
		i = skipSpace(raw, i)
		if i >= len(raw) || raw[i] == ']' {
			return a
		}
		a.starts = append(a.starts, int32(i))
		i = skipSpace(raw, skipValue(raw, i))
		if i < len(raw) && raw[i] == ',' {
			i++
		}
	}
}

func (a jsonArray) len() int { return len(a.starts) }

func (a jsonArray) elem(n int) []byte {
	start := int(a.starts[n])
	return a.raw[start:skipValue(a.raw, start)]
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// skipValue returns the end of the JSON value starting at b[i]; b is valid
// JSON.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		for i++; i < len(b); i++ {
			switch b[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return len(b)
	case '[', '{':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipValue(b, i) - 1
			case '[', '{':
				depth++
			case ']', '}':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', ']', '}', ' ', '\t', '\r', '\n':
			return i
		}
	}
	return i
}

// jsonString decodes the JSON string raw, copying it as it is when it has
// no escapes.
func jsonString(raw []byte) string {
	body := raw[1 : len(raw)-1]
	if bytes.IndexByte(body, '\\') < 0 && utf8.Valid(body) {
		return string(body)
	}
	var s string
	_ = json.Unmarshal(raw, &s) // valid JSON; invalid UTF-8 becomes U+FFFD, as encoding/json does
	return s
}

// appendRegoText writes the valid JSON value raw as Rego prints it: strings
// quoted by strconv.Quote, ", " between elements and ": " between key and
// value, object keys sorted. It reads the JSON text as it goes; an object's
// members are sorted through their offsets (16 bytes for each).
func appendRegoText(dst, raw []byte) []byte {
	i := skipSpace(raw, 0)
	switch raw[i] {
	case '"':
		return strconv.AppendQuote(dst, jsonString(raw[i:skipValue(raw, i)]))
	case '[':
		dst = append(dst, '[')
		first := true
		for i = skipSpace(raw, i+1); i < len(raw) && raw[i] != ']'; {
			end := skipValue(raw, i)
			if !first {
				dst = append(dst, ", "...)
			}
			first = false
			dst = appendRegoText(dst, raw[i:end])
			i = skipSpace(raw, end)
			if i < len(raw) && raw[i] == ',' {
				i = skipSpace(raw, i+1)
			}
		}
		return append(dst, ']')
	case '{':
		// An object's members, each with its key decoded: 24 bytes for
		// each plus the key, freed when the object is written.
		type member struct {
			key         string
			val, valEnd int32
		}
		var members []member
		for i = skipSpace(raw, i+1); i < len(raw) && raw[i] != '}'; {
			keyEnd := skipValue(raw, i)
			v := skipSpace(raw, skipSpace(raw, keyEnd)+1) // past ':'
			valEnd := skipValue(raw, v)
			members = append(members, member{jsonString(raw[i:keyEnd]), int32(v), int32(valEnd)})
			i = skipSpace(raw, valEnd)
			if i < len(raw) && raw[i] == ',' {
				i = skipSpace(raw, i+1)
			}
		}
		// Stable, so that of equal keys the last is kept, as decoding into
		// a map would.
		slices.SortStableFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
		dst = append(dst, '{')
		first := true
		for n, m := range members {
			if n+1 < len(members) && members[n+1].key == m.key {
				continue
			}
			if !first {
				dst = append(dst, ", "...)
			}
			first = false
			dst = strconv.AppendQuote(dst, m.key)
			dst = append(dst, ": "...)
			dst = appendRegoText(dst, raw[m.val:m.valEnd])
		}
		return append(dst, '}')
	}
	// true, false, null and numbers print as they are written.
	return append(dst, bytes.TrimRight(raw[i:], " \t\r\n")...)
}

// jsonQuotedLen is the length of s written as a JSON string by
// appendJSONString.
func jsonQuotedLen(s []byte) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c < 0x20:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			n += 6 // \ufffd
		} else {
			n += size
		}
		i += size
	}
	return n
}

// appendJSONString writes s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 replaced by U+FFFD as
// encoding/json does.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
