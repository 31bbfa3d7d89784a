package wasm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

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
// global holds the work left before the next checkpoint, in instructions:
// every function entry takes the instruction count of the function's body,
// every loop iteration that of the loop's body, and every bulk operation
// (memory.fill, memory.copy, memory.init and the table ones) its length, read
// from its operand, at one instruction per 8 bytes (memory.grow takes the
// whole budget). When the counter reaches zero the guest resets it and calls
// the host's checkpoint, which stops the guest if the call's context is done.
//
// Why work and not iterations: an iteration does not run any instruction of
// its body twice, and neither does a function's activation outside its
// loops, so between two checkpoints a guest runs at most checkpointBudget
// instructions, plus one body (charged at once on entry) and one bulk
// operation (charged before it runs). Counting iterations instead let a loop
// of 30,000 loads and stores, or of one fill of the whole memory, run 4096
// iterations past its deadline: minutes (TestDeadlineHoldsAgainstHeavyIterations).
// The exits also keep the goroutine preemptible (compiled code is not), so a
// garbage collection, which stops every goroutine, never waits long for a
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
// one), types, two mutable i32 globals (appended: no other index moves),
// two helper functions (after the guest's) and, to functions with bulk
// operations, one i32 local (after their own). Everything it appends sits
// past the module's own index spaces, so it rewrites only modules that
// wazero validated as written, and checks every index it copies besides.
// Guests cannot import checkpointModule themselves.
const (
	checkpointModule = "holdfast:runtime"
	checkpointName   = "checkpoint"
	// checkpointBudget is the work, in instructions, between two
	// checkpoints: at most about a millisecond of the slowest instructions
	// (divisions), tens of microseconds of common ones.
	checkpointBudget = 1 << 16
	// maxWeight bounds one charge, so that the counter cannot wrap.
	maxWeight = 1<<31 - 1
	// bulkBytesShift and bulkElementsShift weigh a bulk operation's length:
	// one instruction per 8 bytes of memory filled or copied, per 2 table
	// elements (8 bytes each) — conservative for memset and memmove.
	bulkBytesShift    = 3
	bulkElementsShift = 1
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
	secCustom    = 0
	secType      = 1
	secImport    = 2
	secFunction  = 3
	secTable     = 4
	secMemory    = 5
	secGlobal    = 6
	secExport    = 7
	secStart     = 8
	secElem      = 9
	secCode      = 10
	secData      = 11
	secDataCount = 12
)

// sectionRank orders the known sections as the binary format requires
// (the tag section, 13, sits between memory and global).
var sectionRank = map[byte]int{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13}

// instrumentCheckpoints returns b with checkpoints inserted (see above). It
// refuses what it cannot rewrite exactly: a malformed module, or an
// instruction outside the features the engine enables.
func instrumentCheckpoints(b []byte) ([]byte, error) {
	l, err := checkStructure(b)
	if err != nil {
		return nil, err
	}
	secs, err := splitSections(b)
	if err != nil {
		return nil, err
	}
	nFuncImports := uint32(len(l.importTypes))
	types, funcTypes, importTypes := l.types, l.funcTypes, l.importTypes
	rw := &rewriter{
		yieldFunc: nFuncImports,
		counter:   l.globals,
		stack:     l.globals + 1,
		types:     types,
		funcTypes: funcTypes,
		allTypes:  slices.Concat(importTypes, funcTypes),
		layout:    l,
		// The helpers come after the guest's functions and the import.
		enterFunc: nFuncImports + 1 + uint32(len(funcTypes)),
		leaveFunc: nFuncImports + 2 + uint32(len(funcTypes)),
	}
	yieldType := uint32(len(types))
	enterType := yieldType + 1
	newTypes := []byte{
		0x60, 0x01, 0x7f, 0x00, // (i32) -> (): the import and the leave helper
		0x60, 0x02, 0x7f, 0x7f, 0x00, // (i32, i32) -> (): the enter helper
	}
	// Bodies are wrapped in a block typed () -> results; a function with
	// several results needs a type for that.
	rw.wrapTypes = map[string]uint32{}
	for i, t := range types {
		if t.params == 0 && len(t.results) > 1 {
			rw.wrapTypes[string(t.results)] = uint32(i)
		}
	}
	next := enterType + 1
	for _, ti := range funcTypes {
		if err := checkIndex("type", ti, uint32(len(types))); err != nil {
			return nil, fmt.Errorf("function section: %w", err)
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
	for _, init := range []int32{checkpointBudget, StackBudgetBytes} {
		newGlobals = append(newGlobals, 0x7f, 0x01, 0x41) // mutable i32, i32.const
		newGlobals = append(appendS32(newGlobals, init), 0x0b)
	}
	// added holds the sections to create if the module has none.
	added := map[byte][]byte{
		secType:   append(appendU32(nil, nNewTypes), newTypes...),
		secImport: append(appendU32(nil, 1), newImport...),
		secGlobal: append(appendU32(nil, 2), newGlobals...),
	}
	// The helpers are declared in the function section and defined in the
	// code section. A module may have one of the two without the other (with
	// no functions: an empty vector stands for an absent section); it then
	// gets the other, with the helpers alone. A module with neither has no
	// code to call them.
	var hasFunctions, hasCode bool
	for _, s := range secs {
		hasFunctions = hasFunctions || s.id == secFunction
		hasCode = hasCode || s.id == secCode
	}
	switch {
	case hasCode && !hasFunctions:
		added[secFunction] = appendU32(appendU32(appendU32(nil, 2), enterType), yieldType)
	case hasFunctions && !hasCode:
		if added[secCode], err = rw.code(appendU32(nil, 0)); err != nil {
			return nil, err
		}
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
		for _, id := range []byte{secType, secImport, secFunction, secGlobal, secCode} {
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
			helpers := appendU32(appendU32(nil, enterType), yieldType)
			body, err = appendToVector(s.body, 2, helpers)
		case secExport:
			body, err = rw.exports(s.body)
		case secStart:
			sr := &reader{b: s.body}
			var start uint32
			if start, err = rw.checkedFn(sr.u32()); err == nil {
				body, err = appendU32(nil, start), sr.done()
			}
		case secTable:
			body, err = boundTables(s.body)
		case secElem:
			body, err = rw.elems(s.body)
		case secCode:
			body, err = rw.code(s.body)
		case secCustom:
			body = rw.custom(s.body)
		default:
			body = s.body
		}
		if err != nil {
			return nil, fmt.Errorf("%s section: %w", sectionName(s.id), err)
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
	types                []funcType
	funcTypes            []uint32
	allTypes             []uint32 // type index of every function, imports first (before the rewrite)
	// layout holds the module's index spaces as written. Every index the
	// rewrite copies is checked against them, whatever validated the module
	// before: an index past the module's own would name what the rewrite
	// adds (a global.set of the counter, a call of a helper).
	layout *moduleLayout
	// pushes counts, in the body being rewritten, the instructions that
	// push values (and the results of calls): no point of the body can have
	// more values on its operand stack.
	pushes uint64
	// work counts the instructions of the body being rewritten so far: the
	// weight of a loop is what its body adds to it.
	work uint64
	// scratch is the index of the i32 local that the body's bulk
	// operations use to read their length, added to the body if used.
	scratch     uint32
	usedScratch bool
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

// indexError says which index is past the module's own.
func indexError(what string, i, n uint32) error {
	return fmt.Errorf("%s index %d out of range: the module has %d", what, i, n)
}

// checkedFn maps a function index, refusing one past the module's own.
func (w *rewriter) checkedFn(i uint32) (uint32, error) {
	if int(i) >= len(w.allTypes) {
		return 0, indexError("function", i, uint32(len(w.allTypes)))
	}
	return w.fn(i), nil
}

// checkIndex refuses an index of an index space past the module's own.
func checkIndex(what string, i, n uint32) error {
	if i >= n {
		return indexError(what, i, n)
	}
	return nil
}

// charge subtracts a weight from the counter and, at or below zero, resets
// it and calls the host. weight appends the instructions that push the
// weight, an i32 that is never negative. charge leaves the operand stack as
// it found it and encloses no branch target, so the code around it is
// unaffected. The counter cannot wrap: it is above zero before a charge, and
// no weight is above 2^31-1.
func (w *rewriter) charge(out []byte, weight func([]byte) []byte) []byte {
	out = append(out, 0x23) // global.get
	out = appendU32(out, w.counter)
	out = weight(out)
	out = append(out, 0x6b, 0x24) // i32.sub, global.set
	out = appendU32(out, w.counter)
	out = append(out, 0x23) // global.get
	out = appendU32(out, w.counter)
	out = append(out, 0x41, 0x00, 0x4c, 0x04, 0x40, 0x41) // i32.const 0, i32.le_s, if (no result), i32.const
	out = appendS32(out, checkpointBudget)
	out = append(out, 0x24) // global.set
	out = appendU32(out, w.counter)
	out = append(out, 0x41, checkpointPeriodic, 0x10) // i32.const, call
	out = appendU32(out, w.yieldFunc)
	return append(out, 0x0b) // end
}

// constWeight pushes a weight known when the code is written.
func constWeight(n int32) func([]byte) []byte {
	return func(out []byte) []byte { return appendS32(append(out, 0x41), n) }
}

// loopWeight pushes a weight of five bytes, written when the loop's end is
// reached (patchWeight), and returns where they are.
func (w *rewriter) loopCharge(out []byte) ([]byte, int) {
	at := 0
	out = w.charge(out, func(out []byte) []byte {
		out = append(out, 0x41) // i32.const
		at = len(out)
		return append(out, 0x80, 0x80, 0x80, 0x80, 0x00)
	})
	return out, at
}

// patchWeight writes n as the five-byte signed LEB128 that loopCharge
// reserved (a padded encoding is valid in the binary format).
func patchWeight(b []byte, n uint64) {
	v := uint32(min(n, maxWeight))
	for i := range 4 {
		b[i] = byte(v>>(7*i))&0x7f | 0x80
	}
	b[4] = byte(v >> 28) // below 8: the sign bit stays clear
}

// lengthWeight pushes the weight of a bulk operation whose length (an i32,
// bytes or elements) is on top of the operand stack, shifted right by
// shift: the length is kept in the scratch local (local.tee leaves it for
// the operation) and read again for the charge. The unsigned shift keeps
// the weight from being negative.
func (w *rewriter) lengthCharge(out []byte, shift byte) []byte {
	w.usedScratch = true
	out = appendU32(append(out, 0x22), w.scratch) // local.tee
	return w.charge(out, func(out []byte) []byte {
		out = appendU32(append(out, 0x20), w.scratch) // local.get
		return append(out, 0x41, shift, 0x76)         // i32.const shift, i32.shr_u
	})
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
	for i := uint32(0); i < n && r.err == nil; i++ {
		out = appendName(out, r.name())
		kind, idx := r.byte(), r.u32()
		var err error
		switch kind {
		case 0:
			idx, err = w.checkedFn(idx)
		case 1:
			err = checkIndex("table", idx, w.layout.tables)
		case 2:
			err = checkIndex("memory", idx, w.layout.memories)
		case 3:
			err = checkIndex("global", idx, w.layout.globals)
		default:
			err = fmt.Errorf("export of unknown kind %#x", kind)
		}
		if err != nil {
			return nil, fmt.Errorf("export %d: %w", i, err)
		}
		out = appendU32(append(out, kind), idx)
	}
	return out, r.done()
}

func (w *rewriter) elems(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(nil, n)
	for seg := uint32(0); seg < n && r.err == nil; seg++ {
		flags := r.u32()
		out = appendU32(out, flags)
		if flags > 7 {
			return nil, fmt.Errorf("element segment %d: flags %d", seg, flags)
		}
		var err error
		if flags&2 != 0 && flags&1 == 0 { // explicit table index
			table := r.u32()
			if err := checkIndex("table", table, w.layout.tables); err != nil {
				return nil, fmt.Errorf("element segment %d: %w", seg, err)
			}
			out = appendU32(out, table)
		} else if flags&1 == 0 && w.layout.tables == 0 { // active, table 0
			return nil, fmt.Errorf("element segment %d: %w", seg, indexError("table", 0, 0))
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
				var f uint32
				if f, err = w.checkedFn(r.u32()); err != nil {
					return nil, fmt.Errorf("element segment %d: %w", seg, err)
				}
				out = appendU32(out, f)
			} else if out, err = w.instructions(r, out, false); err != nil {
				return nil, fmt.Errorf("element segment %d: %w", seg, err)
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
		groupsAt := fr.off
		for n := groups; n > 0 && fr.err == nil; n-- {
			values += uint64(fr.u32())
			fr.byte()
		}
		localGroups := fr.b[groupsAt:fr.off]
		w.pushes, w.work = 0, 0
		w.scratch, w.usedScratch = uint32(values), false
		var err error
		if inner, err = w.instructions(fr, inner[:0], true); err != nil {
			return nil, fmt.Errorf("function %d: %w", w.yieldFunc+i, err)
		}
		if w.usedScratch { // one more group: a single i32, after the others
			fb = append(appendU32(fb[:0], groups+1), localGroups...)
			fb = append(fb, 0x01, 0x7f)
			values++
		} else {
			fb = append(appendU32(fb[:0], groups), localGroups...)
		}
		cost := int32(min(frameBaseBytes+frameValueBytes*(values+w.pushes), StackBudgetBytes+1))
		fb = appendS32(append(fb, 0x41), cost) // i32.const: the frame's cost
		fb = appendS32(append(fb, 0x41), int32(min(w.work, maxWeight)))
		fb = appendU32(append(fb, 0x10), w.enterFunc) // call
		fb = w.blockType(append(fb, 0x02), ti)        // block: the body's own end closes it
		fb = append(fb, inner...)
		fb = append(w.callHelper(fb, w.leaveFunc, cost), 0x0b)
		if err := fr.done(); err != nil {
			return nil, fmt.Errorf("function %d: %w", w.yieldFunc+i, err)
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

// boundTables gives every table the module defines a maximum of at most
// MaxTableElements (checkStructure refused a larger minimum): wazero keeps
// tables on the host heap, and table.grow past a maximum fails (returns -1)
// as the spec allows any grow to.
func boundTables(body []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(nil, n)
	for ; n > 0 && r.err == nil; n-- {
		out = append(out, r.byte()) // reference type
		min, max, hasMax := r.limits()
		if !hasMax || max > MaxTableElements {
			max = MaxTableElements
		}
		out = appendU32(appendU32(append(out, 0x01), min), max)
	}
	return out, r.done()
}

// callHelper calls a helper that takes one argument.
func (w *rewriter) callHelper(out []byte, fn uint32, cost int32) []byte {
	out = append(out, 0x41) // i32.const
	out = appendS32(out, cost)
	out = append(out, 0x10) // call
	return appendU32(out, fn)
}

// enterBody is the helper that takes its first argument (the frame's cost)
// from the stack budget, stops the guest if the budget is exhausted, and
// charges its second (the function's instructions) to the counter.
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
	out = append(out, 0x00, 0x0b)                                                   // unreachable, end
	out = w.charge(out, func(out []byte) []byte { return append(out, 0x20, 0x01) }) // local.get 1
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
// right functions. A name section it cannot read is dropped (nil): names
// are for debugging, and the spec does not let a malformed name section
// make a module invalid.
func (w *rewriter) custom(body []byte) []byte {
	r := &reader{b: body}
	if r.name() != "name" || r.err != nil {
		return body
	}
	out := append([]byte(nil), body[:r.off]...)
	for r.more() {
		id := r.byte()
		sub := r.bytes(r.u32())
		if r.err != nil {
			return nil
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
			if sr.done() != nil {
				return nil
			}
			sub = nb
		}
		out = append(out, id)
		out = appendU32(out, uint32(len(sub)))
		out = append(out, sub...)
	}
	return out
}

// instructions copies instructions up to and including the end that closes
// the expression, remapping function indices and, in function bodies,
// putting a checkpoint at the top of every loop and turning return into a
// branch to the end of the block that wraps the body (depth counts the
// blocks open inside it).
func (w *rewriter) instructions(r *reader, out []byte, body bool) ([]byte, error) {
	depth := 0
	// loops holds, for each loop open in a body, where its weight goes and
	// the work counted when it began.
	type openLoop struct {
		depth  int
		weight int
		start  uint64
	}
	var loops []openLoop
	for r.err == nil {
		if !r.more() {
			return nil, errors.New("code ends inside an expression")
		}
		op := r.byte()
		w.work++
		out = append(out, op)
		switch {
		case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if
			out = r.copyBlockType(out)
			depth++
			if op == 0x03 && body {
				var at int
				out, at = w.loopCharge(out)
				loops = append(loops, openLoop{depth, at, w.work})
			}
		case op == 0x0b: // end
			if depth == 0 {
				return out, r.err
			}
			if n := len(loops); n > 0 && loops[n-1].depth == depth {
				// An iteration runs each instruction of the body at most
				// once, nested loops' included: they are charged again
				// by their own iterations.
				patchWeight(out[loops[n-1].weight:], w.work-loops[n-1].start)
				loops = loops[:n-1]
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
			mapped, err := w.checkedFn(f)
			if err != nil {
				return nil, fmt.Errorf("call: %w", err)
			}
			ti := w.allTypes[f]
			if err := checkIndex("type", ti, uint32(len(w.types))); err != nil {
				return nil, fmt.Errorf("call of function %d: %w", f, err)
			}
			w.pushes += uint64(len(w.types[ti].results))
			out = appendU32(out, mapped)
		case op == 0xd2: // ref.func
			w.pushes++
			f, err := w.checkedFn(r.u32())
			if err != nil {
				return nil, fmt.Errorf("ref.func: %w", err)
			}
			out = appendU32(out, f)
		case op == 0x11: // call_indirect
			ti, table := r.u32(), r.u32()
			if err := checkIndex("type", ti, uint32(len(w.types))); err != nil {
				return nil, fmt.Errorf("call_indirect: %w", err)
			}
			if err := checkIndex("table", table, w.layout.tables); err != nil && r.err == nil {
				return nil, fmt.Errorf("call_indirect: %w", err)
			}
			w.pushes += uint64(len(w.types[ti].results))
			out = appendU32(out, ti)
			out = appendU32(out, table)
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
			i := r.u32()
			var err error
			switch op {
			case 0x23, 0x24:
				err = checkIndex("global", i, w.layout.globals)
			case 0x25, 0x26:
				err = checkIndex("table", i, w.layout.tables)
			}
			if err != nil && r.err == nil {
				return nil, fmt.Errorf("%s: %w", opName[op], err)
			}
			out = appendU32(out, i)
		case op >= 0x28 && op <= 0x3e: // loads and stores
			if w.layout.memories == 0 && r.err == nil {
				return nil, fmt.Errorf("load or store %#x: %w", op, indexError("memory", 0, 0))
			}
			out = r.copyMemarg(out)
		case op == 0x3f || op == 0x40: // memory.size, memory.grow
			if op == 0x3f {
				w.pushes++
			} else if body {
				// A grow zeroes up to the memory limit: a checkpoint
				// before each one.
				out = append(w.charge(out[:len(out)-1], constWeight(checkpointBudget)), op)
			}
			if w.layout.memories == 0 && r.err == nil {
				return nil, fmt.Errorf("%s: %w", opName[op], indexError("memory", 0, 0))
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
			if body {
				// A bulk operation's time grows with its length, the
				// operand on top of the stack: it is charged by it.
				switch sub {
				case 8, 10, 11: // memory.init, memory.copy, memory.fill
					out = append(w.lengthCharge(out[:len(out)-1], bulkBytesShift), op)
				case 12, 14, 15, 17: // table.init, table.copy, table.grow, table.fill
					out = append(w.lengthCharge(out[:len(out)-1], bulkElementsShift), op)
				}
			}
			out = appendU32(out, sub)
			switch {
			case sub <= 7: // saturating truncations
			case sub == 8 || sub == 10 || sub == 12 || sub == 14: // memory.init, memory.copy, table.init, table.copy
				a, b := r.u32(), r.u32()
				var err error
				switch sub {
				case 8:
					err = errors.Join(checkIndex("data segment", a, w.layout.dataSegments), checkIndex("memory", b, w.layout.memories))
				case 10:
					err = errors.Join(checkIndex("memory", a, w.layout.memories), checkIndex("memory", b, w.layout.memories))
				case 12:
					err = errors.Join(checkIndex("element segment", a, w.layout.elemSegments), checkIndex("table", b, w.layout.tables))
				case 14:
					err = errors.Join(checkIndex("table", a, w.layout.tables), checkIndex("table", b, w.layout.tables))
				}
				if err != nil && r.err == nil {
					return nil, fmt.Errorf("instruction 0xfc %d: %w", sub, err)
				}
				out = appendU32(appendU32(out, a), b)
			case sub == 9 || sub == 11 || sub == 13 || (sub >= 15 && sub <= 17): // data.drop, memory.fill, elem.drop, table.grow/size/fill
				if sub == 16 {
					w.pushes++
				}
				i := r.u32()
				var err error
				switch {
				case sub == 9:
					err = checkIndex("data segment", i, w.layout.dataSegments)
				case sub == 11:
					err = checkIndex("memory", i, w.layout.memories)
				case sub == 13:
					err = checkIndex("element segment", i, w.layout.elemSegments)
				default:
					err = checkIndex("table", i, w.layout.tables)
				}
				if err != nil && r.err == nil {
					return nil, fmt.Errorf("instruction 0xfc %d: %w", sub, err)
				}
				out = appendU32(out, i)
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

// opName names the instructions whose index errors name them.
var opName = map[byte]string{0x20: "local.get", 0x21: "local.set", 0x22: "local.tee", 0x23: "global.get", 0x24: "global.set", 0x25: "table.get", 0x26: "table.set", 0x3f: "memory.size", 0x40: "memory.grow"}

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
		if shift == 28 && c&0x70 != 0 {
			// The fifth byte holds the top 4 bits; more is malformed, as wazero says.
			r.fail(errors.New("integer overflows 32 bits"))
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

// limits reads a table's or memory's limits: its minimum, and its maximum
// if it has one.
func (r *reader) limits() (min, max uint32, hasMax bool) {
	flags := r.byte()
	min = r.u32()
	if hasMax = flags&1 != 0; hasMax {
		max = r.u32()
	}
	return min, max, hasMax
}

// count reads a vector's length and refuses one that the bytes left cannot
// hold, at minSize bytes an element: decoders that allocate by the length
// then allocate at most a small multiple of the module's size.
func (r *reader) count(minSize int) uint32 {
	n := r.u32()
	if r.err == nil && uint64(n)*uint64(minSize) > uint64(len(r.b)-r.off) {
		r.fail(fmt.Errorf("a vector of %d elements in %d bytes", n, len(r.b)-r.off))
		return 0
	}
	return n
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
