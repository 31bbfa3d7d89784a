//go:build wasip1

package sdk

import "unsafe"

// pinned keeps the buffers handed to the host alive until it frees them.
// Go's garbage collector does not move objects, so a pointer stays valid as
// long as the slice is referenced here.
var pinned = map[uint32][]byte{}

//go:wasmexport holdfast_abi_version
func abiVersion() int32 { return ABIVersion }

//go:wasmexport alloc
func alloc(size uint32) uint32 {
	b := make([]byte, max(size, 1))
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	pinned[p] = b
	return p
}

//go:wasmexport free
func free(ptr, size uint32) { delete(pinned, ptr) }

// Entry is the body of an entry point: it hands the input the host wrote at
// ptr to handle, and returns handle's output packed as the ABI wants
// (pointer in the high 32 bits, length in the low 32). The admission and
// probe packages use it; policies do not need to.
func Entry(ptr, size uint32, handle func(input []byte) []byte) uint64 {
	in := pinned[ptr]
	if uint32(len(in)) < size {
		panic("holdfast sdk: input pointer was not allocated by alloc")
	}
	out := handle(in[:size])
	if len(out) == 0 {
		panic("holdfast sdk: empty output")
	}
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(out))))
	pinned[p] = out
	return uint64(p)<<32 | uint64(len(out))
}
