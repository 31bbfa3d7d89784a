package wasm

import (
	"errors"
	"fmt"
)

// defineImportedMemory returns b with its imported memory (OPA's env.memory)
// turned into a memory the module defines itself, with the same limits.
//
// OPA's modules import their memory, so that a host can share one buffer
// with them. The engine runs many instances of one module in one runtime,
// each with its own memory under its own budget (memory.go), and a wazero
// host module cannot export a memory; OPA's own wazero SDK instantiates a
// glue module named "env" per VM, in a runtime per VM. Defining the memory
// in the module instead keeps the pool, the budget and the checkpoints as
// they are for every module. Memory indices are unchanged (the imported
// memory was index 0 and the defined one is), and so is every function,
// global and table index: only the import vector and the memory section
// change. The module's export of "memory" (OPA ABI 1.1) now names the
// defined memory.
func defineImportedMemory(b []byte) ([]byte, error) {
	secs, err := splitSections(b)
	if err != nil {
		return nil, err
	}

	var limits []byte // the imported memory's limits, encoded
	defines := false
	for i, s := range secs {
		switch s.id {
		case secMemory:
			defines = true
		case secImport:
			sr := &reader{b: s.body}
			n := sr.u32()
			var kept uint32
			var body []byte
			for ; n > 0 && sr.err == nil; n-- {
				start := sr.off
				sr.name()
				sr.name()
				switch kind := sr.byte(); kind {
				case 0: // func
					sr.u32()
				case 1: // table
					sr.byte()
					sr.limits()
				case 2: // memory
					at := sr.off
					sr.limits()
					if limits != nil {
						return nil, errors.New("the module imports more than one memory")
					}
					limits = append([]byte(nil), s.body[at:sr.off]...)
					continue
				case 3: // global
					sr.byte()
					sr.byte()
				default:
					return nil, fmt.Errorf("import of unknown kind %#x", kind)
				}
				body = append(body, s.body[start:sr.off]...)
				kept++
			}
			if err := sr.done(); err != nil {
				return nil, fmt.Errorf("import section: %w", err)
			}
			secs[i].body = append(appendU32(nil, kept), body...)
		}
	}
	if limits == nil {
		return b, nil // the module defines its memory, or has none
	}
	if defines {
		return nil, errors.New("the module both imports and defines a memory")
	}
	if limits[0]&^1 != 0 {
		return nil, fmt.Errorf("imported memory with flags %#x (shared or 64-bit) is not supported", limits[0])
	}

	out := append(make([]byte, 0, len(b)+8), b[:8]...)
	emit := func(id byte, body []byte) {
		out = append(out, id)
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
	}
	memory := append(appendU32(nil, 1), limits...)
	placed := false
	for _, s := range secs {
		if !placed && s.id != secCustom && sectionRank[s.id] > sectionRank[secMemory] {
			emit(secMemory, memory)
			placed = true
		}
		if s.id == secImport && len(s.body) == 1 { // no import left: drop the empty section
			continue
		}
		emit(s.id, s.body)
	}
	if !placed {
		emit(secMemory, memory)
	}
	return out, nil
}
