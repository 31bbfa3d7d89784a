package wasm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"
)

// A guest must stop when its call's deadline passes, even in a loop that
// never calls the host. wazero's own way (RuntimeConfig
// WithCloseOnContextDone) makes compiled code exit to Go at every iteration
// of every loop to look at a flag (wazero issue #2466): about 40 ns per
// iteration, 90% of a small C policy's call and most of a Go policy's.
//
// Instead the engine rewrites each module before compiling it. A counter
// global is decremented at every function entry and every loop iteration;
// when it reaches zero the guest resets it and calls the host's checkpoint,
// which stops the guest if the call's context is done. Every path that runs
// long either loops or calls, so a guest reaches a checkpoint at least every
// checkpointInterval entries or iterations: a few microseconds of work
// between two exits to Go. The exits also keep the goroutine preemptible
// (compiled code is not), so a garbage collection never waits long for a
// running guest.
//
// The same rewrite bounds the guest's call stack. wazero's compiler keeps
// it on the host heap, doubling it as it grows, and traps only past 50 MB,
// after allocating about 160 MB per call: far more than the guest's memory
// limit, and not the guest's to spend. A second global holds the stack
// budget: each function subtracts its estimated frame size on entry and
// gives it back on every way out (its body is wrapped in a block, and
// return becomes a branch to that block's end); a call that would go below
// zero stops the guest with a trap.
//
// The rewrite adds one function import (checkpointModule.checkpointName,
// appended after the guest's imports, so later function indices shift by
// one), types and two mutable i32 globals (appended: no other index moves).
// Guests cannot import checkpointModule themselves.
const (
	checkpointModule   = "holdfast:runtime"
	checkpointName     = "checkpoint"
	checkpointInterval = 1 << 12
	// StackBudgetBytes bounds the estimated size of a guest's call stack.
	// A frame is estimated at frameBaseBytes plus frameValueBytes per
	// parameter, local and instruction of the function that pushes a value
	// (a bound on its operand stack's height, whose values the compiler may
	// spill to the frame). wazero's compiler uses less: the real stack stays
	// under the budget. TestStackOverflowHostMemory measures what the host
	// allocates for it (wazero doubles the stack as it grows, copying it).
	StackBudgetBytes = 8 << 20
	frameBaseBytes   = 64
	frameValueBytes  = 16
)

// What the guest tells checkpoint.
const (
	checkpointPeriodic       = 0
	checkpointStackExhausted = 1
)

// instantiateCheckpointModule defines the host side of the checkpoints.
func (e *Engine) instantiateCheckpointModule(ctx context.Context) error {
	_, err := e.runtime.NewHostModuleBuilder(checkpointModule).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(checkpoint), []api.ValueType{api.ValueTypeI32}, nil).
		Export(checkpointName).
		Instantiate(ctx)
	return err
}

// checkpoint stops the guest with the exit code wazero itself would use if
// the context of the call (or of the instantiation) is done. classify turns
// it into ErrTimeout or ErrCanceled. A guest out of stack gets a trap.
func checkpoint(ctx context.Context, _ api.Module, stack []uint64) {
	if uint32(stack[0]) == checkpointStackExhausted {
		panic(newError(ErrTrap, "", "", fmt.Sprintf("stack overflow: the guest's call stack is over its budget of %d MiB", StackBudgetBytes>>20), nil))
	}
	err := ctx.Err()
	if err == nil {
		return
	}
	if errors.Is(err, context.Canceled) {
		panic(sys.NewExitError(sys.ExitCodeContextCanceled))
	}
	panic(sys.NewExitError(sys.ExitCodeDeadlineExceeded))
}

// errReservedImport refuses a guest that imports checkpointModule itself.
var errReservedImport = errors.New("that import module is reserved for the host's own use")

// Section ids of the binary format.
const (
	secCustom   = 0
	secType     = 1
	secImport   = 2
	secFunction = 3
	secGlobal   = 6
	secExport   = 7
	secStart    = 8
	secElem     = 9
	secCode     = 10
)

// sectionRank orders the known sections as the binary format requires
// (the tag section, 13, sits between memory and global).
var sectionRank = map[byte]int{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13}

// instrumentCheckpoints returns b with checkpoints inserted (see above). It
// refuses what it cannot rewrite exactly: a malformed module, or an
// instruction outside the features the engine enables.
func instrumentCheckpoints(b []byte) ([]byte, error) {
	secs, err := splitSections(b)
	if err != nil {
		return nil, err
	}

	var nFuncImports, nGlobalImports, nGlobals uint32
	var types []funcType
	var funcTypes []uint32   // type index of each defined function
	var importTypes []uint32 // type index of each imported function
	for _, s := range secs {
		sr := &reader{b: s.body}
		switch s.id {
		case secType:
			for n := sr.u32(); n > 0 && sr.err == nil; n-- {
				if form := sr.byte(); form != 0x60 {
					return nil, fmt.Errorf("type of form %#x", form)
				}
				params := sr.bytes(sr.u32())
				types = append(types, funcType{params: uint32(len(params)), results: sr.bytes(sr.u32())})
			}
		case secFunction:
			for n := sr.u32(); n > 0 && sr.err == nil; n-- {
				funcTypes = append(funcTypes, sr.u32())
			}
		case secImport:
			for n := sr.u32(); n > 0 && sr.err == nil; n-- {
				mod, name := sr.name(), sr.name()
				if mod == checkpointModule {
					return nil, fmt.Errorf("imports %s.%s: %w", mod, name, errReservedImport)
				}
				switch kind := sr.byte(); kind {
				case 0: // func
					importTypes = append(importTypes, sr.u32())
					nFuncImports++
				case 1: // table
					sr.byte()
					sr.limits()
				case 2: // memory
					sr.limits()
				case 3: // global
					sr.byte()
					sr.byte()
					nGlobalImports++
				default:
					return nil, fmt.Errorf("import of unknown kind %#x", kind)
				}
			}
		case secGlobal:
			nGlobals = sr.u32()
		}
		if sr.err != nil {
			return nil, fmt.Errorf("section %d: %w", s.id, sr.err)
		}
	}
	rw := &rewriter{
		yieldFunc: nFuncImports,
		counter:   nGlobalImports + nGlobals,
		stack:     nGlobalImports + nGlobals + 1,
		types:     types,
		funcTypes: funcTypes,
		allTypes:  append(importTypes, funcTypes...),
		// The helpers come after the guest's functions and the import.
		enterFunc: nFuncImports + 1 + uint32(len(funcTypes)),
		leaveFunc: nFuncImports + 2 + uint32(len(funcTypes)),
	}
	yieldType := uint32(len(types))
	rw.helperType = yieldType
	newTypes := []byte{0x60, 0x01, 0x7f, 0x00} // (i32) -> (): the import and the helpers
	// Bodies are wrapped in a block typed () -> results; a function with
	// several results needs a type for that.
	rw.wrapTypes = map[string]uint32{}
	for i, t := range types {
		if t.params == 0 && len(t.results) > 1 {
			rw.wrapTypes[string(t.results)] = uint32(i)
		}
	}
	next := yieldType + 1
	for _, ti := range funcTypes {
		if int(ti) >= len(types) {
			return nil, fmt.Errorf("function of type %d, out of range", ti)
		}
		res := types[ti].results
		if _, ok := rw.wrapTypes[string(res)]; ok || len(res) < 2 {
			continue
		}
		rw.wrapTypes[string(res)] = next
		next++
		newTypes = append(newTypes, 0x60, 0x00)
		newTypes = appendU32(newTypes, uint32(len(res)))
		newTypes = append(newTypes, res...)
	}
	nNewTypes := next - yieldType

	newImport := appendImport(nil, yieldType)
	var newGlobals []byte
	for _, init := range []int32{checkpointInterval, StackBudgetBytes} {
		newGlobals = append(newGlobals, 0x7f, 0x01, 0x41) // mutable i32, i32.const
		newGlobals = append(appendS32(newGlobals, init), 0x0b)
	}
	// added holds the sections to create if the module has none.
	added := map[byte][]byte{
		secType:   append(appendU32(nil, nNewTypes), newTypes...),
		secImport: append(appendU32(nil, 1), newImport...),
		secGlobal: append(appendU32(nil, 2), newGlobals...),
	}

	// The rewrite adds a few percent to the code; growing by doubling would
	// copy it several times over.
	out := append(make([]byte, 0, len(b)+len(b)/8), b[:8]...)
	emit := func(id byte, body []byte) {
		out = append(out, id)
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
	}
	emitMissingBefore := func(rank int) {
		for _, id := range []byte{secType, secImport, secGlobal} {
			if body, ok := added[id]; ok && sectionRank[id] < rank {
				emit(id, body)
				delete(added, id)
			}
		}
	}
	for _, s := range secs {
		if s.id != secCustom {
			rank, ok := sectionRank[s.id]
			if !ok {
				return nil, fmt.Errorf("unknown section %d", s.id)
			}
			emitMissingBefore(rank)
		}
		var body []byte
		var err error
		switch s.id {
		case secType:
			body, err = appendToVector(s.body, nNewTypes, newTypes)
			delete(added, secType)
		case secImport:
			body, err = appendToVector(s.body, 1, newImport)
			delete(added, secImport)
		case secGlobal:
			body, err = rw.globals(s.body, 2, newGlobals)
			delete(added, secGlobal)
		case secFunction:
			helpers := appendU32(appendU32(nil, yieldType), yieldType)
			body, err = appendToVector(s.body, 2, helpers)
		case secExport:
			body, err = rw.exports(s.body)
		case secStart:
			sr := &reader{b: s.body}
			body, err = appendU32(nil, rw.fn(sr.u32())), sr.err
		case secElem:
			body, err = rw.elems(s.body)
		case secCode:
			body, err = rw.code(s.body)
		case secCustom:
			body, err = rw.custom(s.body)
		default:
			body = s.body
		}
		if err != nil {
			return nil, fmt.Errorf("section %d: %w", s.id, err)
		}
		if body != nil {
			emit(s.id, body)
		}
	}
	emitMissingBefore(len(sectionRank) + 1)
	return out, nil
}

// section is one section of a binary module, its body a slice of the module.
type section struct {
	id   byte
	body []byte
}

// splitSections checks a binary module's header and cuts it into sections.
func splitSections(b []byte) ([]section, error) {
	if len(b) < 8 || !bytes.Equal(b[:4], []byte("\x00asm")) || binary.LittleEndian.Uint32(b[4:8]) != 1 {
		return nil, errors.New("not a WebAssembly binary module (version 1)")
	}
	var secs []section
	r := &reader{b: b, off: 8}
	for r.more() {
		id := r.byte()
		body := r.bytes(r.u32())
		if r.err != nil {
			return nil, fmt.Errorf("section %d: %w", id, r.err)
		}
		secs = append(secs, section{id, body})
	}
	return secs, nil
}

func appendImport(out []byte, typeIdx uint32) []byte {
	out = appendName(out, checkpointModule)
	out = appendName(out, checkpointName)
	out = append(out, 0x00)
	return appendU32(out, typeIdx)
}

// appendToVector adds n encoded elements at the end of a vector.
func appendToVector(vec []byte, n uint32, elems []byte) ([]byte, error) {
	r := &reader{b: vec}
	count := r.u32()
	if r.err != nil {
		return nil, r.err
	}
	out := appendU32(nil, count+n)
	out = append(out, vec[r.off:]...)
	return append(out, elems...), nil
}

type funcType struct {
	params  uint32
	results []byte // value types, one byte each
}

// rewriter rewrites function indices (shifted by the added import) and
// inserts the checkpoints into code.
type rewriter struct {
	yieldFunc uint32 // index of the added import
	counter   uint32 // index of the checkpoint counter global
	stack     uint32 // index of the stack budget global
	// enterFunc and leaveFunc are the added helpers that take a frame's
	// cost from the stack budget (and pass a checkpoint) and give it back:
	// a call is a few bytes where the sequences inline made a Go module a
	// third larger, and a cold start longer with it.
	enterFunc, leaveFunc uint32
	helperType           uint32
	types                []funcType
	funcTypes            []uint32
	allTypes             []uint32 // type index of every function, imports first (before the rewrite)
	// pushes counts, in the body being rewritten, the instructions that
	// push values (and the results of calls): no point of the body can have
	// more values on its operand stack.
	pushes uint64
	// wrapTypes maps a result list of two or more types to the index of
	// the type () -> results.
	wrapTypes map[string]uint32
}

func (w *rewriter) fn(i uint32) uint32 {
	if i >= w.yieldFunc {
		return i + 1
	}
	return i
}

// checkpointCode decrements the counter and, at zero, resets it and calls
// the host. It leaves the operand stack as it found it and encloses no
// branch target, so the code around it is unaffected.
func (w *rewriter) checkpointCode(out []byte) []byte {
	out = append(out, 0x23) // global.get
	out = appendU32(out, w.counter)
	out = append(out, 0x41, 0x01, 0x6b, 0x24) // i32.const 1, i32.sub, global.set
	out = appendU32(out, w.counter)
	out = append(out, 0x23) // global.get
	out = appendU32(out, w.counter)
	out = append(out, 0x45, 0x04, 0x40, 0x41) // i32.eqz, if (no result), i32.const
	out = appendS32(out, checkpointInterval)
	out = append(out, 0x24) // global.set
	out = appendU32(out, w.counter)
	out = append(out, 0x41, checkpointPeriodic, 0x10) // i32.const, call
	out = appendU32(out, w.yieldFunc)
	return append(out, 0x0b) // end
}

// blockType is the type of a block with no parameters and the results of
// function type ti.
func (w *rewriter) blockType(out []byte, ti uint32) []byte {
	res := w.types[ti].results
	switch len(res) {
	case 0:
		return append(out, 0x40)
	case 1:
		return append(out, res[0])
	}
	return appendU32(out, w.wrapTypes[string(res)]) // a positive s33 below 2^31 encodes as a u32
}

func (w *rewriter) globals(body []byte, nAdded uint32, added []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(nil, n+nAdded)
	for ; n > 0 && r.err == nil; n-- {
		out = append(out, r.byte(), r.byte()) // valtype, mutability
		var err error
		if out, err = w.instructions(r, out, false); err != nil {
			return nil, err
		}
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return append(out, added...), nil
}

func (w *rewriter) exports(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(nil, n)
	for ; n > 0 && r.err == nil; n-- {
		out = appendName(out, r.name())
		kind, idx := r.byte(), r.u32()
		if kind == 0 {
			idx = w.fn(idx)
		}
		out = appendU32(append(out, kind), idx)
	}
	return out, r.done()
}

func (w *rewriter) elems(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(nil, n)
	for ; n > 0 && r.err == nil; n-- {
		flags := r.u32()
		out = appendU32(out, flags)
		if flags > 7 {
			return nil, fmt.Errorf("element segment with flags %d", flags)
		}
		var err error
		if flags&2 != 0 && flags&1 == 0 { // explicit table index
			out = appendU32(out, r.u32())
		}
		if flags&1 == 0 { // active: offset expression
			if out, err = w.instructions(r, out, false); err != nil {
				return nil, err
			}
		}
		if flags&3 != 0 { // elemkind or reftype
			out = append(out, r.byte())
		}
		count := r.u32()
		out = appendU32(out, count)
		for ; count > 0 && r.err == nil; count-- {
			if flags&4 == 0 {
				out = appendU32(out, w.fn(r.u32()))
			} else if out, err = w.instructions(r, out, false); err != nil {
				return nil, err
			}
		}
	}
	return out, r.done()
}

func (w *rewriter) code(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(make([]byte, 0, len(body)+len(body)/8), n)
	var fb, inner []byte
	for i := uint32(0); i < n && r.err == nil; i++ {
		fr := &reader{b: r.bytes(r.u32())}
		if int(i) >= len(w.funcTypes) {
			return nil, errors.New("more bodies than functions")
		}
		ti := w.funcTypes[i]
		values := uint64(w.types[ti].params)
		groups := fr.u32()
		fb = appendU32(fb[:0], groups)
		for ; groups > 0 && fr.err == nil; groups-- {
			n := fr.u32()
			values += uint64(n)
			fb = appendU32(fb, n)
			fb = append(fb, fr.byte())
		}
		w.pushes = 0
		var err error
		if inner, err = w.instructions(fr, inner[:0], true); err != nil {
			return nil, fmt.Errorf("function %d: %w", i, err)
		}
		cost := int32(min(frameBaseBytes+frameValueBytes*(values+w.pushes), StackBudgetBytes+1))
		fb = w.callHelper(fb, w.enterFunc, cost)
		fb = w.blockType(append(fb, 0x02), ti) // block: the body's own end closes it
		fb = append(fb, inner...)
		fb = append(w.callHelper(fb, w.leaveFunc, cost), 0x0b)
		if err := fr.done(); err != nil {
			return nil, fmt.Errorf("function %d: %w", i, err)
		}
		out = appendU32(out, uint32(len(fb)))
		out = append(out, fb...)
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	for _, helper := range [][]byte{w.enterBody(), w.leaveBody()} {
		out = appendU32(out, uint32(len(helper)))
		out = append(out, helper...)
	}
	// The count of bodies, two more, may take more bytes than before.
	return append(appendU32(nil, n+2), out[len(appendU32(nil, n)):]...), nil
}

func (w *rewriter) callHelper(out []byte, fn uint32, cost int32) []byte {
	out = append(out, 0x41) // i32.const
	out = appendS32(out, cost)
	out = append(out, 0x10) // call
	return appendU32(out, fn)
}

// enterBody is the helper that takes its argument from the stack budget,
// stops the guest if the budget is exhausted, and passes a checkpoint.
func (w *rewriter) enterBody() []byte {
	out := []byte{0x00}     // no locals
	out = append(out, 0x23) // global.get
	out = appendU32(out, w.stack)
	out = append(out, 0x20, 0x00, 0x6b, 0x24) // local.get 0, i32.sub, global.set
	out = appendU32(out, w.stack)
	out = append(out, 0x23) // global.get
	out = appendU32(out, w.stack)
	out = append(out, 0x41, 0x00, 0x48, 0x04, 0x40)         // i32.const 0, i32.lt_s, if (no result)
	out = append(out, 0x41, checkpointStackExhausted, 0x10) // i32.const, call
	out = appendU32(out, w.yieldFunc)
	out = append(out, 0x00, 0x0b) // unreachable, end
	out = w.checkpointCode(out)
	return append(out, 0x0b)
}

// leaveBody is the helper that gives its argument back to the stack budget.
func (w *rewriter) leaveBody() []byte {
	out := []byte{0x00, 0x23} // no locals, global.get
	out = appendU32(out, w.stack)
	out = append(out, 0x20, 0x00, 0x6a, 0x24) // local.get 0, i32.add, global.set
	out = appendU32(out, w.stack)
	return append(out, 0x0b)
}

// custom keeps custom sections, remapping the function indices of the name
// section (function, local and label names) so that traps still name the
// right functions.
func (w *rewriter) custom(body []byte) ([]byte, error) {
	r := &reader{b: body}
	if r.name() != "name" || r.err != nil {
		return body, nil
	}
	out := append([]byte(nil), body[:r.off]...)
	for r.more() {
		id := r.byte()
		sub := r.bytes(r.u32())
		if r.err != nil {
			return nil, r.err
		}
		if id >= 1 && id <= 3 {
			sr := &reader{b: sub}
			n := sr.u32()
			nb := appendU32(nil, n)
			for ; n > 0 && sr.err == nil; n-- {
				nb = appendU32(nb, w.fn(sr.u32()))
				if id == 1 {
					nb = appendName(nb, sr.name())
					continue
				}
				m := sr.u32()
				nb = appendU32(nb, m)
				for ; m > 0 && sr.err == nil; m-- {
					nb = appendU32(nb, sr.u32())
					nb = appendName(nb, sr.name())
				}
			}
			if err := sr.done(); err != nil {
				return nil, fmt.Errorf("name subsection %d: %w", id, err)
			}
			sub = nb
		}
		out = append(out, id)
		out = appendU32(out, uint32(len(sub)))
		out = append(out, sub...)
	}
	return out, nil
}

// instructions copies instructions up to and including the end that closes
// the expression, remapping function indices and, in function bodies,
// putting a checkpoint at the top of every loop and turning return into a
// branch to the end of the block that wraps the body (depth counts the
// blocks open inside it).
func (w *rewriter) instructions(r *reader, out []byte, body bool) ([]byte, error) {
	depth := 0
	for r.err == nil {
		if !r.more() {
			return nil, errors.New("code ends inside an expression")
		}
		op := r.byte()
		out = append(out, op)
		switch {
		case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if
			out = r.copyBlockType(out)
			depth++
			if op == 0x03 && body {
				out = w.checkpointCode(out)
			}
		case op == 0x0b: // end
			if depth == 0 {
				return out, r.err
			}
			depth--
		case op == 0x0c || op == 0x0d: // br, br_if
			out = appendU32(out, r.u32())
		case op == 0x0e: // br_table
			n := r.u32()
			out = appendU32(out, n)
			for ; n > 0 && r.err == nil; n-- {
				out = appendU32(out, r.u32())
			}
			out = appendU32(out, r.u32())
		case op == 0x10: // call
			f := r.u32()
			if int(f) >= len(w.allTypes) {
				return nil, fmt.Errorf("call of function %d, out of range", f)
			}
			w.pushes += uint64(len(w.types[w.allTypes[f]].results))
			out = appendU32(out, w.fn(f))
		case op == 0xd2: // ref.func
			w.pushes++
			out = appendU32(out, w.fn(r.u32()))
		case op == 0x11: // call_indirect
			ti := r.u32()
			if int(ti) >= len(w.types) {
				return nil, fmt.Errorf("call_indirect of type %d, out of range", ti)
			}
			w.pushes += uint64(len(w.types[ti].results))
			out = appendU32(out, ti)
			out = appendU32(out, r.u32())
		case op == 0x1c: // select with types
			n := r.u32()
			out = appendU32(out, n)
			for ; n > 0 && r.err == nil; n-- {
				out = append(out, r.byte())
			}
		case op >= 0x20 && op <= 0x26: // local, global, table get/set
			if op == 0x20 || op == 0x23 {
				w.pushes++
			}
			out = appendU32(out, r.u32())
		case op >= 0x28 && op <= 0x3e: // loads and stores
			out = r.copyMemarg(out)
		case op == 0x3f || op == 0x40: // memory.size, memory.grow
			if op == 0x3f {
				w.pushes++
			}
			out = appendU32(out, r.u32())
		case op == 0x41, op == 0x42: // i32.const, i64.const
			w.pushes++
			out = r.copyLEB(out)
		case op == 0x43:
			w.pushes++
			out = append(out, r.bytes(4)...)
		case op == 0x44:
			w.pushes++
			out = append(out, r.bytes(8)...)
		case op == 0xd0: // ref.null
			w.pushes++
			out = append(out, r.byte())
		case op == 0x0f && body: // return: leave through the end of the wrapping block
			out[len(out)-1] = 0x0c // br
			out = appendU32(out, uint32(depth))
		case op == 0x00 || op == 0x01 || op == 0x05 || op == 0x0f || op == 0x1a || op == 0x1b ||
			(op >= 0x45 && op <= 0xc4) || op == 0xd1:
			// no immediates
		case op == 0xfc:
			sub := r.u32()
			out = appendU32(out, sub)
			switch {
			case sub <= 7: // saturating truncations
			case sub == 8 || sub == 10 || sub == 12 || sub == 14: // memory.init, memory.copy, table.init, table.copy
				out = appendU32(out, r.u32())
				out = appendU32(out, r.u32())
			case sub == 9 || sub == 11 || sub == 13 || (sub >= 15 && sub <= 17): // data.drop, memory.fill, elem.drop, table.grow/size/fill
				if sub == 16 {
					w.pushes++
				}
				out = appendU32(out, r.u32())
			default:
				return nil, fmt.Errorf("unsupported instruction 0xfc %d", sub)
			}
		case op == 0xfd:
			sub := r.u32()
			out = appendU32(out, sub)
			switch {
			case sub <= 11 || sub == 92 || sub == 93: // loads and stores
				out = r.copyMemarg(out)
			case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
				if sub == 12 {
					w.pushes++
				}
				out = append(out, r.bytes(16)...)
			case sub >= 21 && sub <= 34: // extract and replace lane
				out = append(out, r.byte())
			case sub >= 84 && sub <= 91: // load and store lane
				out = r.copyMemarg(out)
				out = append(out, r.byte())
			case sub > 275:
				return nil, fmt.Errorf("unsupported instruction 0xfd %d", sub)
			}
		default:
			return nil, fmt.Errorf("unsupported instruction %#x", op)
		}
	}
	return nil, r.err
}

// reader decodes the binary format; the first error sticks.
type reader struct {
	b   []byte
	off int
	err error
}

var errTruncated = errors.New("truncated")

func (r *reader) more() bool { return r.err == nil && r.off < len(r.b) }

func (r *reader) done() error {
	if r.err == nil && r.off != len(r.b) {
		r.err = fmt.Errorf("%d unexpected bytes", len(r.b)-r.off)
	}
	return r.err
}

func (r *reader) byte() byte {
	if r.err != nil || r.off >= len(r.b) {
		r.fail(errTruncated)
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *reader) bytes(n uint32) []byte {
	if r.err != nil || uint64(n) > uint64(len(r.b)-r.off) {
		r.fail(errTruncated)
		return nil
	}
	b := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return b
}

func (r *reader) u32() uint32 {
	var v uint32
	for shift := 0; shift < 35; shift += 7 {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v
		}
	}
	r.fail(errors.New("integer too long"))
	return 0
}

// copyLEB copies a signed LEB128 integer of up to 64 bits.
func (r *reader) copyLEB(out []byte) []byte {
	for i := 0; i < 10; i++ {
		c := r.byte()
		if r.err != nil {
			return out
		}
		out = append(out, c)
		if c&0x80 == 0 {
			return out
		}
	}
	r.fail(errors.New("integer too long"))
	return out
}

func (r *reader) name() string { return string(r.bytes(r.u32())) }

func (r *reader) limits() {
	flags := r.byte()
	r.u32()
	if flags&1 != 0 {
		r.u32()
	}
}

// copyBlockType copies a block type: empty (0x40), a value type (one byte)
// or a type index (a positive s33).
func (r *reader) copyBlockType(out []byte) []byte {
	if r.off < len(r.b) && r.b[r.off]&0xc0 == 0x40 { // one-byte negative: 0x40 or a value type
		return append(out, r.byte())
	}
	return r.copyLEB(out)
}

// copyMemarg copies alignment and offset (and a memory index if the
// alignment's bit 6 says there is one).
func (r *reader) copyMemarg(out []byte) []byte {
	align := r.u32()
	out = appendU32(out, align)
	if align&0x40 != 0 {
		out = appendU32(out, r.u32())
	}
	return appendU32(out, r.u32())
}

func appendU32(out []byte, v uint32) []byte {
	for v >= 0x80 {
		out = append(out, byte(v)|0x80)
		v >>= 7
	}
	return append(out, byte(v))
}

func appendS32(out []byte, v int32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(out, c)
		}
		out = append(out, c|0x80)
	}
}

func appendName(out []byte, s string) []byte {
	out = appendU32(out, uint32(len(s)))
	return append(out, s...)
}
