// Package expansion expands $(VAR) references the way Kubernetes does in a container's
// command, args, env values and subPathExpr: $(VAR) becomes VAR's value when VAR is defined,
// an unknown reference stays as written, and $$ is a literal $.
package expansion

import "strings"

// Expand expands the references in s with vars.
func Expand(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			if v, ok := vars[s[i+2:i+2+end]]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// ExpandAll expands every string of in; nil stays nil.
func ExpandAll(in []string, vars map[string]string) []string {
	if in == nil {
		return nil
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = Expand(s, vars)
	}
	return out
}
