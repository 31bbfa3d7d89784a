package wasm

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tetratelabs/wazero/api"
)

// The scripts of the spec test suite as wast2json writes them
// (https://github.com/WebAssembly/wabt/blob/main/docs/wast2json.md), and
// their values. wazero's own harness (internal/integration_test/spectest,
// internal to wazero) reads the same files; this one follows its
// conventions: an externref n is passed to wazero as n+1 (wazero's null
// externref is 0), a v128 as two words, low half first.

// specScript is the .json of one .wast file.
type specScript struct {
	SourceFile string        `json:"source_filename"`
	Commands   []specCommand `json:"commands"`
}

type specCommand struct {
	Type string `json:"type"`
	Line int    `json:"line"`
	// Name is the script's name of a module ("$M"), for module and
	// register commands.
	Name string `json:"name"`
	// Filename is the module's .wasm (or, in text, .wat) beside the script.
	Filename string `json:"filename"`
	// As is the name a register command makes a module importable by.
	As       string      `json:"as"`
	Action   specAction  `json:"action"`
	Expected []specValue `json:"expected"`
	// ModuleType is "binary" or "text" for the assert_* commands on modules.
	ModuleType string `json:"module_type"`
	// Text is the failure the script expects (a trap's message, a reason
	// to refuse a module).
	Text string `json:"text"`
}

type specAction struct {
	Type   string      `json:"type"` // invoke or get
	Module string      `json:"module"`
	Field  string      `json:"field"`
	Args   []specValue `json:"args"`
}

type specValue struct {
	Type     string `json:"type"`
	LaneType string `json:"lane_type"`
	// Value is a string (decimal bits, "null", "nan:canonical",
	// "nan:arithmetic"), a list of them for a v128, or absent where a
	// result may be any reference.
	Value any `json:"value"`
}

func (v specValue) String() string { return fmt.Sprintf("%s:%v", v.Type, v.Value) }

// words encodes an argument as wazero takes it.
func (v specValue) words() ([]uint64, error) {
	if v.Type == "v128" {
		lanes, width, err := v.lanes()
		if err != nil {
			return nil, err
		}
		var w [2]uint64
		for i, lane := range lanes {
			bits, err := parseBits(lane, width)
			if err != nil {
				return nil, err
			}
			pos := i * width
			w[pos/64] |= bits << (pos % 64)
		}
		return w[:], nil
	}
	s, _ := v.Value.(string)
	switch v.Type {
	case "externref", "funcref":
		if v.Value == nil || s == "null" {
			return []uint64{0}, nil
		}
		if v.Type == "funcref" {
			return nil, fmt.Errorf("a non-null funcref argument (%q) cannot be written in a script", s)
		}
		n, err := strconv.ParseUint(s, 10, 64)
		return []uint64{n + 1}, err
	case "i32", "f32":
		b, err := parseBits(s, 32)
		return []uint64{b}, err
	case "i64", "f64":
		b, err := parseBits(s, 64)
		return []uint64{b}, err
	}
	return nil, fmt.Errorf("value of type %q", v.Type)
}

// size is how many words the value takes.
func (v specValue) size() int {
	if v.Type == "v128" {
		return 2
	}
	return 1
}

// lanes returns a v128's lanes and their width in bits.
func (v specValue) lanes() ([]string, int, error) {
	raw, ok := v.Value.([]any)
	if !ok {
		return nil, 0, fmt.Errorf("v128 value %v is not a list", v.Value)
	}
	width := map[string]int{"i8": 8, "i16": 16, "i32": 32, "i64": 64, "f32": 32, "f64": 64}[v.LaneType]
	if width == 0 || len(raw)*width != 128 {
		return nil, 0, fmt.Errorf("v128 of %d lanes of type %q", len(raw), v.LaneType)
	}
	lanes := make([]string, len(raw))
	for i, l := range raw {
		if lanes[i], ok = l.(string); !ok {
			return nil, 0, fmt.Errorf("v128 lane %v is not a string", l)
		}
	}
	return lanes, width, nil
}

// matches says whether got (the value's words of a result) is what the
// script expects: the same bits, except that a NaN matches a NaN (wazero's
// harness compares so too: the spec leaves most NaN payloads to the
// implementation) and "nan:canonical" and "nan:arithmetic" stand for the
// classes of NaN the spec names so.
func (v specValue) matches(got []uint64) (bool, error) {
	if v.Type == "v128" {
		lanes, width, err := v.lanes()
		if err != nil {
			return false, err
		}
		float := v.LaneType[0] == 'f'
		for i, lane := range lanes {
			pos := i * width
			bits := got[pos/64] >> (pos % 64) & laneMask(width)
			if ok, err := matchScalar(lane, width, float, bits); !ok || err != nil {
				return false, err
			}
		}
		return true, nil
	}
	if v.Value == nil { // any reference
		return true, nil
	}
	s, _ := v.Value.(string)
	switch v.Type {
	case "externref", "funcref":
		want, err := v.words()
		if err != nil {
			return false, err
		}
		return got[0] == want[0], nil
	case "i32", "f32":
		return matchScalar(s, 32, v.Type == "f32", got[0]&laneMask(32))
	case "i64", "f64":
		return matchScalar(s, 64, v.Type == "f64", got[0])
	}
	return false, fmt.Errorf("value of type %q", v.Type)
}

func matchScalar(want string, width int, float bool, got uint64) (bool, error) {
	if float {
		exponent, quiet := uint64(0x7f80_0000), uint64(0x0040_0000)
		if width == 64 {
			exponent, quiet = 0x7ff0_0000_0000_0000, 0x0008_0000_0000_0000
		}
		isNaN := got&exponent == exponent && got&(exponent-1) != 0
		switch want {
		case "nan:canonical": // the quiet bit alone, either sign
			return got&^(1<<(width-1)) == exponent|quiet, nil
		case "nan:arithmetic": // the quiet bit and any payload
			return got&(exponent|quiet) == exponent|quiet, nil
		}
		bits, err := parseBits(want, width)
		if err != nil {
			return false, err
		}
		if bits&exponent == exponent && bits&(exponent-1) != 0 {
			return isNaN, nil
		}
		return got == bits, nil
	}
	bits, err := parseBits(want, width)
	return got == bits, err
}

// parseBits reads a lane or scalar written in decimal, as unsigned bits
// or (wasm-tools writes them so) as a signed integer.
func parseBits(s string, width int) (uint64, error) {
	if strings.HasPrefix(s, "-") {
		n, err := strconv.ParseInt(s, 10, width)
		return uint64(n) & laneMask(width), err
	}
	return strconv.ParseUint(s, 10, width)
}

func laneMask(width int) uint64 {
	if width == 64 {
		return math.MaxUint64
	}
	return 1<<width - 1
}

// specArgs encodes an action's arguments.
func specArgs(vals []specValue) ([]uint64, error) {
	var args []uint64
	for _, v := range vals {
		w, err := v.words()
		if err != nil {
			return nil, err
		}
		args = append(args, w...)
	}
	return args, nil
}

// matchResults says how results differ from what the script expects, or
// returns "".
func matchResults(expected []specValue, got []uint64) (string, error) {
	n := 0
	for _, v := range expected {
		n += v.size()
	}
	if n != len(got) {
		return fmt.Sprintf("%d result words, want %d (%v)", len(got), n, expected), nil
	}
	off := 0
	for i, v := range expected {
		ok, err := v.matches(got[off : off+v.size()])
		if err != nil {
			return "", err
		}
		if !ok {
			return fmt.Sprintf("result %d is %#x, want %v", i, got[off:off+v.size()], v), nil
		}
		off += v.size()
	}
	return "", nil
}

// sameResults compares the results of a call on both sides, word by word,
// a NaN matching a NaN of any payload where the result is a float, a
// funcref (the address of a function in its runtime) only null or not.
func sameResults(types []api.ValueType, ref, ins []uint64) bool {
	if len(ref) != len(ins) {
		return false
	}
	off := 0
	for _, t := range types {
		n := 1
		if t == valueTypeV128 {
			n = 2
		}
		if off+n > len(ref) {
			return false
		}
		for i := off; i < off+n; i++ {
			if ref[i] == ins[i] {
				continue
			}
			switch t {
			case valueTypeFuncref: // a pointer into its runtime: null or not
				if (ref[i] == 0) != (ins[i] == 0) {
					return false
				}
			case valueTypeV128: // a NaN in both, as f32x4 or f64x2 lanes
				lo, hi := uint32(ref[i]) != uint32(ins[i]), ref[i]>>32 != ins[i]>>32
				if !(bothNaN64(ref[i], ins[i]) || (!lo || bothNaN32(ref[i], ins[i])) && (!hi || bothNaN32(ref[i]>>32, ins[i]>>32))) {
					return false
				}
			case api.ValueTypeF32:
				if !bothNaN32(ref[i], ins[i]) {
					return false
				}
			case api.ValueTypeF64:
				if !bothNaN64(ref[i], ins[i]) {
					return false
				}
			default:
				return false
			}
		}
		off += n
	}
	return off == len(ref)
}

func bothNaN32(a, b uint64) bool {
	return math.IsNaN(float64(math.Float32frombits(uint32(a)))) && math.IsNaN(float64(math.Float32frombits(uint32(b))))
}

func bothNaN64(a, b uint64) bool {
	return math.IsNaN(math.Float64frombits(a)) && math.IsNaN(math.Float64frombits(b))
}

// valueTypeV128 is the binary format's v128, which wazero's api package
// does not name (its functions take and return one as two words).
const valueTypeV128 api.ValueType = 0x7b

// valueTypeFuncref is the binary format's funcref.
const valueTypeFuncref api.ValueType = 0x70
