package wasm

import (
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// opaBuiltin is a host implementation of one of OPA's built-in functions
// that its Wasm compiler does not compile into the module (OPA's docs call
// them "SDK-dependent"). Arguments and result are JSON values as
// encoding/json decodes them with UseNumber.
type opaBuiltin struct {
	name  string // set from the module's declaration
	arity int
	fn    func(args []any) (any, error)
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
func opaSprintf(args []any) (any, error) {
	format, ok := args[0].(string)
	if !ok {
		return nil, fmt.Errorf("operand 1 must be string but got %s", opaTypeName(args[0]))
	}
	list, ok := args[1].([]any)
	if !ok {
		return nil, fmt.Errorf("operand 2 must be array but got %s", opaTypeName(args[1]))
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
			values[i] = regoText(v)
		}
	}
	return fmt.Sprintf(format, values...), nil
}

// regoText writes a JSON value as Rego prints it: strings quoted, ", "
// between elements and ": " between key and value, object keys sorted.
func regoText(v any) string {
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
			for i, k := range slices.Sorted(mapKeys(v)) {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(strconv.Quote(k))
				b.WriteString(": ")
				write(v[k])
			}
			b.WriteByte('}')
		default:
			b.WriteString(fmt.Sprint(v))
		}
	}
	write(v)
	return b.String()
}

// opaTypeName names a JSON value's type as OPA's errors do.
func opaTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}
