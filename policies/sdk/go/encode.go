package sdk

import (
	"strconv"
	"unicode/utf8"
)

// The responses are encoded by hand, byte for byte as json.Marshal encodes
// them (checked by TestEncodeMatchesEncodingJSON): under wazero,
// encoding/json's reflection cost a Go policy about 20 us per call.

// AppendJSON appends r as JSON to b.
func (r AdmissionResponse) AppendJSON(b []byte) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, r.Allowed)
	if r.Reason != "" {
		b = appendJSONString(append(b, `,"reason":`...), r.Reason)
	}
	if r.Message != "" {
		b = appendJSONString(append(b, `,"message":`...), r.Message)
	}
	if len(r.Warnings) > 0 {
		b = append(b, `,"warnings":[`...)
		for i, w := range r.Warnings {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, w)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// AppendJSON appends r as JSON to b.
func (r ProbeResponse) AppendJSON(b []byte) []byte {
	b = append(b, `{"success":`...)
	b = strconv.AppendBool(b, r.Success)
	if r.Message != "" {
		b = appendJSONString(append(b, `,"message":`...), r.Message)
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString quotes s as encoding/json does: HTML-safe, invalid UTF-8
// replaced by U+FFFD, U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
