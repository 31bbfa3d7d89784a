package wasm

import (
	"context"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// overBudgetError is a builtin's refusal to produce more than its budget: the
// call fails with ErrOutputTooLarge, whereas any other error of a builtin
// makes its expression undefined, as in OPA.
type overBudgetError struct{ msg string }

func (e *overBudgetError) Error() string { return e.msg }

// sprintfVerbsPerCheck is how many verbs the formatter formats between two
// looks at the call's context.
const sprintfVerbsPerCheck = 256

// boundedSprintf is OPA's sprintf (Go's fmt.Sprintf over the converted
// arguments, see opaSprintf) formatted one verb at a time, so that its
// output never grows much past limit bytes on the host: fmt.Sprintf builds
// the whole output in memory before anyone could look at its size, and a
// verb's width or precision alone may ask for up to ten million bytes (see
// RATIONALE.md, "Why is sprintf formatted one verb at a time?").
//
// The control flow is fmt's doPrintf (Go 1.26), argument indexes, `*` widths
// and precisions, and the %!(...) notes included. Each verb is then
// formatted by fmt itself, from a format of that verb alone with its width
// and precision written out, so honest formats print exactly as in OPA.
// Before a verb is formatted, a width (or a number's precision) larger than
// what remains of the budget is refused: the verb would print at least that
// much. A string's precision is first cut to the string's length, which
// prints the same. What a verb prints beyond its width and precision is at
// most a few times the size of its argument, which OutputBytes bounds.
type boundedSprintf struct {
	ctx   context.Context
	limit int
	args  jsonArray
	out   []byte
	// converted counts the bytes of arguments converted for the verbs that
	// used them (strings, Rego text, numbers); it is held to limit too, so
	// that a format using large arguments in turn ("%.0[1]s%.0[2]s...")
	// cannot make the host convert them without end while printing nothing.
	converted int
	recent    [4]conversion // the last conversions, next the oldest
	next      int
	verbs     int
}

// verbSpec is one verb's flags, width and precision, as fmt parses them.
type verbSpec struct {
	sharp, zero, plus, minus, space bool
	wid, prec                       int
	widPresent, precPresent         bool
}

// The notes fmt writes into its output, in print.go.
const (
	badWidthString = "%!(BADWIDTH)"
	badPrecString  = "%!(BADPREC)"
	noVerbString   = "%!(NOVERB)"
	extraString    = "%!(EXTRA "
)

// over refuses: what, completed by "over N bytes", says why.
func (p *boundedSprintf) over(what string) error {
	return &overBudgetError{fmt.Sprintf("sprintf: %s over %d bytes, the most a builtin may hand back (the policy's host answer limit)", what, p.limit)}
}

func (p *boundedSprintf) remaining() int { return p.limit - len(p.out) }

func (p *boundedSprintf) write(s string) error {
	if len(s) > p.remaining() {
		return p.over("its result would be")
	}
	p.out = append(p.out, s...)
	return nil
}

// printf follows fmt's doPrintf; see there for the meaning of each step.
func (p *boundedSprintf) printf(format string) error {
	end := len(format)
	numArgs := p.args.len()
	argNum := 0
	afterIndex := false
	reordered := false
	for i := 0; i < end; {
		goodArgNum := true
		lasti := i
		for i < end && format[i] != '%' {
			i++
		}
		if i > lasti {
			if err := p.write(format[lasti:i]); err != nil {
				return err
			}
		}
		if i >= end {
			break
		}
		i++

		var f verbSpec
	flags:
		for ; i < end; i++ {
			switch format[i] {
			case '#':
				f.sharp = true
			case '0':
				f.zero = true
			case '+':
				f.plus = true
			case '-':
				f.minus = true
			case ' ':
				f.space = true
			default:
				break flags
			}
		}

		var isIndex, good bool
		argNum, i, afterIndex, isIndex, good = argNumberAt(argNum, format, i, numArgs)
		if isIndex {
			reordered = true
			goodArgNum = goodArgNum && good
		}

		if i < end && format[i] == '*' {
			i++
			var err error
			f.wid, f.widPresent, argNum, err = p.intFromArg(argNum)
			if err != nil {
				return err
			}
			if !f.widPresent {
				if err := p.write(badWidthString); err != nil {
					return err
				}
			}
			if f.wid < 0 {
				f.wid = -f.wid
				f.minus = true
				f.zero = false
			}
			afterIndex = false
		} else {
			f.wid, f.widPresent, i = parsenum(format, i, end)
			if afterIndex && f.widPresent {
				goodArgNum = false
			}
		}

		if i+1 < end && format[i] == '.' {
			i++
			if afterIndex {
				goodArgNum = false
			}
			argNum, i, afterIndex, isIndex, good = argNumberAt(argNum, format, i, numArgs)
			if isIndex {
				reordered = true
				goodArgNum = goodArgNum && good
			}
			if i < end && format[i] == '*' {
				i++
				var err error
				f.prec, f.precPresent, argNum, err = p.intFromArg(argNum)
				if err != nil {
					return err
				}
				if f.prec < 0 {
					f.prec = 0
					f.precPresent = false
				}
				if !f.precPresent {
					if err := p.write(badPrecString); err != nil {
						return err
					}
				}
				afterIndex = false
			} else {
				f.prec, f.precPresent, i = parsenum(format, i, end)
				if !f.precPresent {
					f.prec = 0
					f.precPresent = true
				}
			}
		}

		if !afterIndex {
			argNum, i, afterIndex, isIndex, good = argNumberAt(argNum, format, i, numArgs)
			if isIndex {
				reordered = true
				goodArgNum = goodArgNum && good
			}
		}

		if i >= end {
			if err := p.write(noVerbString); err != nil {
				return err
			}
			break
		}

		verb, size := utf8.DecodeRuneInString(format[i:])
		i += size

		var err error
		switch {
		case verb == '%': // ignores the width and precision, takes no argument
			err = p.write("%")
		case !goodArgNum:
			err = p.write("%!" + string(verb) + "(BADINDEX)")
		case argNum >= numArgs:
			err = p.write("%!" + string(verb) + "(MISSING)")
		default:
			err = p.printArg(argNum, verb, f)
			argNum++
		}
		if err != nil {
			return err
		}
		if err := p.checkContext(); err != nil {
			return err
		}
	}

	if !reordered && argNum < numArgs {
		if err := p.write(extraString); err != nil {
			return err
		}
		for n := argNum; n < numArgs; n++ {
			if n > argNum {
				if err := p.write(", "); err != nil {
					return err
				}
			}
			v, err := p.arg(n)
			if err != nil {
				return err
			}
			if err := p.appendVerb(v, "%T=%v", verbSize(v, verbSpec{})+16); err != nil {
				return err
			}
			if err := p.checkContext(); err != nil {
				return err
			}
		}
		return p.write(")")
	}
	return nil
}

func (p *boundedSprintf) checkContext() error {
	p.verbs++
	if p.verbs%sprintfVerbsPerCheck == 0 {
		return p.ctx.Err()
	}
	return nil
}

// printArg formats argument n with one verb, as fmt's printArg would.
func (p *boundedSprintf) printArg(n int, verb rune, f verbSpec) error {
	v, err := p.arg(n)
	if err != nil {
		return err
	}
	if s, ok := v.(string); ok && f.precPresent && f.prec > len(s) && verb != 'T' {
		// A string's precision counts runes (bytes for %x): beyond its
		// length it cuts nothing.
		f.prec = len(s)
	}
	if verb == 'T' && f.prec > 64 {
		f.prec = 64 // cuts the type's name, which is shorter
	}
	rem := p.remaining()
	if f.widPresent && f.wid > rem {
		return p.over(fmt.Sprintf("a verb of width %d would take its result", f.wid))
	}
	if f.precPresent && f.prec > rem {
		return p.over(fmt.Sprintf("a verb of precision %d would take its result", f.prec))
	}

	spec := make([]byte, 0, 32)
	spec = append(spec, '%')
	for _, fl := range []struct {
		on bool
		c  byte
	}{{f.sharp, '#'}, {f.zero, '0'}, {f.plus, '+'}, {f.minus, '-'}, {f.space, ' '}} {
		if fl.on {
			spec = append(spec, fl.c)
		}
	}
	if f.widPresent {
		spec = strconv.AppendInt(spec, int64(f.wid), 10)
	}
	if f.precPresent {
		spec = append(spec, '.')
		spec = strconv.AppendInt(spec, int64(f.prec), 10)
	}
	// A verb that is not a letter (say '*', '[' or '-') would be read by fmt
	// as part of the spec written out here. None is a verb of any argument
	// type, so fmt prints "%!" verb "(" type "=" value ")" whichever it
	// is: format with 'k', equally unknown, and put the verb back after.
	substituted := verb < utf8.RuneSelf && !('a' <= verb && verb <= 'z' || 'A' <= verb && verb <= 'Z')
	original := byte(verb)
	if substituted {
		verb = 'k'
	}
	spec = utf8.AppendRune(spec, verb)
	start := len(p.out)
	if err := p.appendVerb(v, string(spec), verbSize(v, f)); err != nil {
		return err
	}
	if substituted && len(p.out) >= start+4 && string(p.out[start:start+4]) == "%!k(" {
		p.out[start+2] = original
	}
	return nil
}

// appendVerb formats v with format (one verb, or "%T=%v"), which prints
// about size bytes, onto the output and checks the output's size
// afterwards.
func (p *boundedSprintf) appendVerb(v any, format string, size int) error {
	args := []any{v}
	if format == "%T=%v" {
		args = append(args, v)
	}
	if len(p.out)+size <= p.limit {
		p.reserve(size)
		p.out = fmt.Appendf(p.out, format, args...)
	} else {
		// Likely over: formatted apart, so as not to grow the output for
		// a verb that will not fit.
		verb := fmt.Appendf(nil, format, args...)
		if len(p.out)+len(verb) > p.limit {
			return p.over("its result would be")
		}
		p.reserve(len(verb))
		p.out = append(p.out, verb...)
	}
	if len(p.out) > p.limit {
		return p.over("its result would be")
	}
	return nil
}

// reserve makes room for about n more bytes of output, doubling the
// output's capacity rather than letting append grow it by a quarter at a
// time (which allocates five times the final size as the output grows by
// verbs of tens of KiB), and never reserving much past the limit.
func (p *boundedSprintf) reserve(n int) {
	need := len(p.out) + n
	if need <= cap(p.out) {
		return
	}
	grown := min(max(2*cap(p.out), need), max(p.limit, need))
	p.out = append(make([]byte, 0, grown), p.out...)
}

// verbSize estimates what a verb prints of v: its width, or its argument's
// size with the precision (upper bounds for most verbs; a wrong guess only
// costs append a growth of its own).
func verbSize(v any, f verbSpec) int {
	n := 24
	switch v := v.(type) {
	case string:
		n = len(v) + 2
	case *big.Int:
		n = v.BitLen() + 2 // digits in base 2, the most of any base
	}
	if f.precPresent {
		n += f.prec
	}
	if f.widPresent {
		n = max(n, f.wid)
	}
	return n
}

// intFromArg is fmt's intFromArg for a `*` width or precision: only an
// integer argument of at most a million in size will do.
func (p *boundedSprintf) intFromArg(argNum int) (num int, isInt bool, newArgNum int, err error) {
	newArgNum = argNum
	if argNum < p.args.len() {
		v, err := p.arg(argNum)
		if err != nil {
			return 0, false, argNum, err
		}
		if n, ok := v.(int64); ok && int64(int(n)) == n {
			num, isInt = int(n), true
		}
		newArgNum = argNum + 1
		if tooLarge(num) {
			num, isInt = 0, false
		}
	}
	return num, isInt, newArgNum, nil
}

// arg converts argument n as OPA's sprintf does: an integer to int64 (or a
// big.Int), another number to float64, a string to itself and anything
// else to its Rego text. The last few conversions are kept, so that a
// format using one argument again ("%[1]s ... %[1]s") converts it once.
func (p *boundedSprintf) arg(n int) (any, error) {
	for _, c := range p.recent {
		if c.v != nil && c.n == n {
			return c.v, nil
		}
	}
	raw := p.args.elem(n)
	var v any
	switch raw[0] {
	case '"':
		s := jsonString(raw)
		v, p.converted = s, p.converted+len(s)
	case '[', '{', 't', 'f', 'n':
		text := appendRegoText(make([]byte, 0, len(raw)+len(raw)/2), raw)
		v, p.converted = string(text), p.converted+len(text)
	default:
		v, p.converted = opaNumber(string(raw)), p.converted+len(raw)
	}
	if p.converted > p.limit {
		return nil, p.over("its arguments, converted for the verbs that use them, would come to")
	}
	p.recent[p.next] = conversion{n, v}
	p.next = (p.next + 1) % len(p.recent)
	return v, nil
}

// conversion is an argument converted for fmt.
type conversion struct {
	n int
	v any
}

// opaNumber converts a JSON number as OPA's sprintf does.
func opaNumber(s string) any {
	if strings.ContainsAny(s, ".eE") {
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return f
		}
		return s
	}
	if x, err := strconv.ParseInt(s, 10, 64); err == nil {
		return x
	}
	if b, ok := new(big.Int).SetString(s, 10); ok {
		return b
	}
	return s
}

// tooLarge, parsenum and parseArgNumber are fmt's (print.go).
func tooLarge(x int) bool {
	const max int = 1e6
	return x > max || x < -max
}

func parsenum(s string, start, end int) (num int, isnum bool, newi int) {
	if start >= end {
		return 0, false, end
	}
	for newi = start; newi < end && '0' <= s[newi] && s[newi] <= '9'; newi++ {
		if tooLarge(num) {
			return 0, false, end // Overflow; crazy long number most likely.
		}
		num = num*10 + int(s[newi]-'0')
		isnum = true
	}
	return
}

func parseArgNumber(format string) (index int, wid int, ok bool) {
	if len(format) < 3 {
		return 0, 1, false
	}
	for i := 1; i < len(format); i++ {
		if format[i] == ']' {
			width, ok, newi := parsenum(format, 1, i)
			if !ok || newi != i {
				return 0, i + 1, false
			}
			return width - 1, i + 1, true
		}
	}
	return 0, 1, false
}

// argNumberAt is fmt's (*pp).argNumber: isIndex says that an index was
// there (fmt's p.reordered), good that it was valid (fmt's p.goodArgNum).
func argNumberAt(argNum int, format string, i, numArgs int) (newArgNum, newi int, found, isIndex, good bool) {
	if len(format) <= i || format[i] != '[' {
		return argNum, i, false, false, true
	}
	index, wid, ok := parseArgNumber(format[i:])
	if ok && 0 <= index && index < numArgs {
		return index, i + wid, true, true, true
	}
	return argNum, i + wid, ok, true, false
}
