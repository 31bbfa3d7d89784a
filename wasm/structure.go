package wasm

import (
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"
)

// Before any other code reads a guest's bytes, checkStructure walks the
// whole binary module and refuses one whose declared sizes are not backed by
// its bytes, or are past the limits below. wazero's decoder allocates by the
// counts a module declares, before it finds out that the bytes behind them
// are missing: a 13-byte module declaring 2^28 functions made it allocate
// 1 GiB, and a 30-byte one declaring 2^32 locals ended the whole process
// with "fatal error: runtime: out of memory" (TestStructureBombs). The
// agent must never hand wazero such a module, not even to have it explain
// what is wrong, so this pass comes first and needs nothing but the bytes.
//
// The limits are the embedder's to set (the WebAssembly spec leaves them to
// it, and browsers set theirs in the JS API); holdfast's are below the
// browsers' where a gateway's memory asks for it. Each one bounds what
// wazero allocates, on the agent's heap, for what a module declares rather
// than for what it contains.
const (
	// maxFunctionLocals bounds the locals of one function (the JS API's
	// limit): wazero keeps a type per local while it compiles a function.
	maxFunctionLocals = 50_000
	// maxModuleLocals bounds the locals of all functions together, so that
	// many small bodies each declaring the maximum cannot add up.
	maxModuleLocals = 1 << 22
	// maxTables bounds the tables a module declares or imports.
	maxTables = 16
	// MaxTableElements bounds each table's size. Tables live on the host
	// heap (8 bytes an element in wazero), outside the guest's memory
	// limit: a table's declared minimum over it is refused, and its
	// maximum is lowered to it by the rewrite, so that table.grow past it
	// fails as the spec allows (it returns -1).
	MaxTableElements = 1 << 18
)

// moduleLayout is what checkStructure learns of a module: the counts of its
// index spaces (imports included), which the rewrite and its checks use.
type moduleLayout struct {
	types        []funcType
	importTypes  []uint32 // type index of each imported function
	funcTypes    []uint32 // type index of each defined function
	globals      uint32   // imported and defined
	tables       uint32
	memories     uint32
	elemSegments uint32
	dataSegments uint32
	// unreadableNames: a name section whose vectors its bytes do not back.
	unreadableNames bool
}

// dropUnreadableNames returns b without its name sections when
// checkStructure could not read one: wazero would size its maps by the
// counts such a section declares, or refuse the module, and the spec does
// not let a malformed name section make a module invalid.
func dropUnreadableNames(b []byte, l *moduleLayout) []byte {
	if !l.unreadableNames {
		return b
	}
	return withoutNameSections(b)
}

// withoutNameSections returns b without its custom sections named "name"
// (b itself when its sections cannot be split).
func withoutNameSections(b []byte) []byte {
	secs, err := splitSections(b)
	if err != nil {
		return b
	}
	out := append([]byte(nil), b[:8]...)
	for _, s := range secs {
		if s.id == secCustom && (&reader{b: s.body}).name() == "name" {
			continue
		}
		out = appendU32(append(out, s.id), uint32(len(s.body)))
		out = append(out, s.body...)
	}
	return out
}

// structureError names where a module's structure is wrong.
func structureError(id byte, format string, args ...any) error {
	return fmt.Errorf("%s section: "+format, append([]any{sectionName(id)}, args...)...)
}

func sectionName(id byte) string {
	switch id {
	case secCustom:
		return "custom"
	case secType:
		return "type"
	case secImport:
		return "import"
	case secFunction:
		return "function"
	case secTable:
		return "table"
	case secMemory:
		return "memory"
	case secGlobal:
		return "global"
	case secExport:
		return "export"
	case secStart:
		return "start"
	case secElem:
		return "element"
	case secCode:
		return "code"
	case secData:
		return "data"
	case secDataCount:
		return "data count"
	}
	return fmt.Sprintf("unknown (id %d)", id)
}

// checkStructure checks that every vector's declared length fits in the
// bytes left for it (each element takes at least minSize bytes), that each
// section ends where its size says, and the limits above. It does not
// validate: wazero does that next, on bytes that can no longer make it
// allocate more than a small multiple of their own size.
func checkStructure(b []byte) (*moduleLayout, error) {
	secs, err := splitSections(b)
	if err != nil {
		return nil, err
	}
	l := &moduleLayout{}
	var codeBodies uint32
	sawCode := false
	lastRank := 0
	sawNames := false
	for _, s := range secs {
		if s.id != secCustom {
			rank, ok := sectionRank[s.id]
			if !ok {
				return nil, fmt.Errorf("section of unknown id %d", s.id)
			}
			if rank <= lastRank {
				return nil, structureError(s.id, "out of order or repeated")
			}
			lastRank = rank
		}
		r := &reader{b: s.body}
		switch s.id {
		case secCustom:
			// Its own reader: a malformed name section's error is not the module's.
			if isName, err := checkCustom(&reader{b: s.body}); err != nil || (isName && sawNames) {
				// A malformed name section does not make a module
				// invalid (the spec, 5.5.3: errors in a custom
				// section's data must not); it is dropped
				// (dropUnreadableNames) before anything else reads it.
				// So are two of them (wazero refuses the second).
				l.unreadableNames = true
			} else if isName {
				sawNames = true
			}
			r.off = len(r.b)
		case secType:
			err = l.readTypes(r)
		case secImport:
			err = l.readImports(r)
		case secFunction:
			n := r.count(1)
			for ; n > 0 && r.err == nil; n-- {
				l.funcTypes = append(l.funcTypes, r.u32())
			}
		case secTable:
			n := r.count(3)
			for ; n > 0 && r.err == nil; n-- {
				r.byte() // reference type
				err = l.addTable(r.limits())
			}
		case secMemory:
			n := r.count(2)
			for ; n > 0 && r.err == nil; n-- {
				r.limits()
				l.memories++
			}
		case secGlobal:
			n := r.count(3)
			for ; n > 0 && r.err == nil && err == nil; n-- {
				r.byte() // value type
				r.byte() // mutability
				err = skipConstExpr(r)
				l.globals++
			}
		case secExport:
			n := r.count(3)
			for ; n > 0 && r.err == nil; n-- {
				r.name()
				r.byte()
				r.u32()
			}
		case secStart:
			r.u32()
		case secElem:
			err = l.readElems(r)
		case secCode:
			sawCode = true
			codeBodies, err = readCodeLocals(r)
		case secData:
			n := r.count(2)
			for ; n > 0 && r.err == nil && err == nil; n-- {
				flags := r.u32()
				if flags == 2 {
					r.u32() // memory index
				}
				if flags != 1 {
					err = skipConstExpr(r)
				}
				r.bytes(r.u32())
				l.dataSegments++
			}
		case secDataCount:
			r.u32()
		default: // the tag section: an extension holdfast does not enable
			return nil, structureError(s.id, "not supported (its feature is not enabled)")
		}
		if err == nil {
			err = r.done()
		}
		if err != nil {
			return nil, structureError(s.id, "%w", err)
		}
	}
	// wazero's validation panics on a call of a function whose type index is
	// past the type section (v1.12.0): every function's type is checked here.
	for i, ti := range slices.Concat(l.importTypes, l.funcTypes) {
		if ti >= uint32(len(l.types)) {
			return nil, fmt.Errorf("function %d: type index %d out of range: the module has %d", i, ti, len(l.types))
		}
	}
	if n := uint32(len(l.funcTypes)); sawCode && codeBodies != n || !sawCode && n != 0 {
		return nil, structureError(secCode, "%d bodies for %d functions declared in the function section", codeBodies, n)
	}
	return l, nil
}

func (l *moduleLayout) readTypes(r *reader) error {
	n := r.count(3)
	for ; n > 0 && r.err == nil; n-- {
		if form := r.byte(); form != 0x60 {
			return fmt.Errorf("type %d: form %#x, not a function type", len(l.types), form)
		}
		params := r.bytes(r.u32())
		l.types = append(l.types, funcType{params: uint32(len(params)), results: r.bytes(r.u32())})
	}
	return nil
}

func (l *moduleLayout) readImports(r *reader) error {
	n := r.count(4)
	for ; n > 0 && r.err == nil; n-- {
		mod, name := r.name(), r.name()
		if mod == checkpointModule {
			return fmt.Errorf("imports %s.%s: %w", mod, name, errReservedImport)
		}
		switch kind := r.byte(); kind {
		case 0: // function
			l.importTypes = append(l.importTypes, r.u32())
		case 1: // table
			r.byte()
			if err := l.addTable(r.limits()); err != nil {
				return err
			}
		case 2: // memory
			r.limits()
			l.memories++
		case 3: // global
			r.byte()
			r.byte()
			l.globals++
		default:
			return fmt.Errorf("import %s.%s of unknown kind %#x", mod, name, kind)
		}
	}
	return nil
}

func (l *moduleLayout) addTable(min uint32, _ uint32, _ bool) error {
	l.tables++
	if l.tables > maxTables {
		return fmt.Errorf("more than %d tables", maxTables)
	}
	if min > MaxTableElements {
		return fmt.Errorf("table %d: initial size %d elements, over holdfast's limit of %d", l.tables-1, min, MaxTableElements)
	}
	return nil
}

func (l *moduleLayout) readElems(r *reader) error {
	n := r.count(3)
	for ; n > 0 && r.err == nil; n-- {
		flags := r.u32()
		if flags > 7 {
			return fmt.Errorf("element segment %d: flags %d", l.elemSegments, flags)
		}
		if flags&3 == 2 { // active, explicit table index
			r.u32()
		}
		if flags&1 == 0 { // active: offset expression
			if err := skipConstExpr(r); err != nil {
				return fmt.Errorf("element segment %d: %w", l.elemSegments, err)
			}
		}
		if flags&3 != 0 { // element kind or reference type
			r.byte()
		}
		if flags&4 == 0 { // function indices
			count := r.count(1)
			for ; count > 0 && r.err == nil; count-- {
				r.u32()
			}
		} else { // expressions
			count := r.count(2)
			for ; count > 0 && r.err == nil; count-- {
				if err := skipConstExpr(r); err != nil {
					return fmt.Errorf("element segment %d: %w", l.elemSegments, err)
				}
			}
		}
		l.elemSegments++
	}
	return nil
}

// readCodeLocals checks each body's size and locals; the instructions are
// the rewrite's to read.
func readCodeLocals(r *reader) (uint32, error) {
	n := r.count(2)
	var total uint64
	var i uint32
	for ; i < n && r.err == nil; i++ {
		fr := &reader{b: r.bytes(r.u32())}
		groups := fr.count(2)
		var locals uint64
		for ; groups > 0 && fr.err == nil; groups-- {
			locals += uint64(fr.u32())
			fr.byte()
		}
		if fr.err != nil {
			return 0, fmt.Errorf("function body %d: %w", i, fr.err)
		}
		if locals > maxFunctionLocals {
			return 0, fmt.Errorf("function body %d: %d locals, over the limit of %d", i, locals, maxFunctionLocals)
		}
		if total += locals; total > maxModuleLocals {
			return 0, fmt.Errorf("function body %d: more than %d locals in all, holdfast's limit", i, maxModuleLocals)
		}
	}
	return i, nil
}

// checkCustom says whether r holds the name section and checks it as
// wazero reads it, so that the engine hands wazero only a name section it
// accepts (and drops any other): every vector backed by its bytes (wazero
// sizes its maps by the counts it declares), every name UTF-8, and each
// subsection wazero reads (module, function and local names) ending where
// its size says (wazero reads those whatever their size says, and refuses
// the module when the section's bytes and its reading disagree). Other
// custom sections are opaque bytes.
func checkCustom(r *reader) (isName bool, err error) {
	if r.name() != "name" || r.err != nil {
		r.off = len(r.b)
		return false, nil
	}
	name := func(sub *reader) {
		if n := sub.name(); sub.err == nil && !utf8.ValidString(n) {
			sub.err = fmt.Errorf("name %q is not UTF-8", n)
		}
	}
	for r.more() {
		id := r.byte()
		size := r.u32()
		if r.err == nil && uint64(size) > uint64(len(r.b)-r.off) {
			return true, fmt.Errorf("name subsection %d runs past the section's end", id)
		}
		sub := &reader{b: r.bytes(size)}
		switch id {
		case 0: // module name
			name(sub)
		case 1: // function names: (index, name)*
			for n := sub.count(2); n > 0 && sub.err == nil; n-- {
				sub.u32()
				name(sub)
			}
		case 2: // local names: (function index, (index, name)*)*
			for n := sub.count(2); n > 0 && sub.err == nil; n-- {
				sub.u32()
				for m := sub.count(2); m > 0 && sub.err == nil; m-- {
					sub.u32()
					name(sub)
				}
			}
		default: // extended names: wazero skips them by their size
			sub.off = len(sub.b)
		}
		if err := sub.done(); err != nil {
			return true, fmt.Errorf("name subsection %d: %w", id, err)
		}
	}
	return true, r.err
}

// skipConstExpr reads a constant expression of WebAssembly 2.0 (one
// constant, ref.null, ref.func or global.get, then end); anything else is
// not constant there and is refused.
func skipConstExpr(r *reader) error {
	switch op := r.byte(); op {
	case 0x41, 0x42: // i32.const, i64.const
		r.copyLEB(nil)
	case 0x43:
		r.bytes(4)
	case 0x44:
		r.bytes(8)
	case 0xd0: // ref.null
		r.byte()
	case 0xd2, 0x23: // ref.func, global.get
		r.u32()
	case 0xfd: // v128.const
		if sub := r.u32(); sub != 12 {
			return fmt.Errorf("instruction 0xfd %d in a constant expression", sub)
		}
		r.bytes(16)
	default:
		if r.err != nil {
			return r.err
		}
		return fmt.Errorf("instruction %#x in a constant expression", op)
	}
	if end := r.byte(); end != 0x0b && r.err == nil {
		return errors.New("constant expression of more than one instruction")
	}
	return r.err
}
