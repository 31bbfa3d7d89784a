//go:build wasip1

package sdk

import (
	"runtime"
	"unsafe"
)

// Each host function has its own import and its own caller, so that the
// linker drops those a policy never calls: the module then does not import
// them and needs no grant for them.

//go:wasmimport holdfast log
func importLog(level, ptr, n uint32)

//go:wasmimport holdfast response_read
func importResponseRead(ptr, n uint32) uint32

//go:wasmimport holdfast http_request
func importHTTPRequest(ptr, n uint32) uint32

//go:wasmimport holdfast tcp_dial
func importTCPDial(ptr, n uint32) uint32

//go:wasmimport holdfast read_file
func importReadFile(ptr, n uint32) uint32

//go:wasmimport holdfast stat_file
func importStatFile(ptr, n uint32) uint32

func ptrOf(b []byte) uint32 {
	if len(b) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

func rawLog(level int32, msg string) {
	b := []byte(msg)
	importLog(uint32(level), ptrOf(b), uint32(len(b)))
	runtime.KeepAlive(b)
}

func readResponse(n uint32) []byte {
	out := make([]byte, n)
	if n > 0 {
		got := importResponseRead(ptrOf(out), n)
		out = out[:got]
	}
	return out
}

func rawHTTPRequest(req []byte) []byte {
	n := importHTTPRequest(ptrOf(req), uint32(len(req)))
	runtime.KeepAlive(req)
	return readResponse(n)
}

func rawTCPDial(req []byte) []byte {
	n := importTCPDial(ptrOf(req), uint32(len(req)))
	runtime.KeepAlive(req)
	return readResponse(n)
}

func rawReadFile(req []byte) []byte {
	n := importReadFile(ptrOf(req), uint32(len(req)))
	runtime.KeepAlive(req)
	return readResponse(n)
}

func rawStatFile(req []byte) []byte {
	n := importStatFile(ptrOf(req), uint32(len(req)))
	runtime.KeepAlive(req)
	return readResponse(n)
}
